"""benchmarks/RESULTS.md is the measurement of the code as it is.

The file records the digest of what makes its numbers (`benchmarks/_stamp.py`): the syntax
trees, without docstrings, of the package modules a guarded step can run and of the
benchmarks. It is stale when that code does something else, not when a comment, a
docstring, the formatting or an offline module (the report, the scan, the CLI) changes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import _stamp

RESULTS = _stamp.REPO / "benchmarks" / "RESULTS.md"


def test_the_results_were_made_from_the_code_as_it_is() -> None:
    found = _stamp.LINE.search(RESULTS.read_text(encoding="utf-8"))
    assert found is not None, f"{RESULTS} records no inputs digest"
    assert found.group(1) == _stamp.digest(), (
        "benchmarks/RESULTS.md is stale: the code a guarded step runs, or the benchmarks, "
        "changed since it was written. Re-run `python benchmarks/run.py --all --write "
        "benchmarks/RESULTS.md` and update the numbers docs/benchmarks.md quotes."
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the inputs, to change."""
    for folder in ("loop_guard", "benchmarks"):
        (tmp_path / folder).mkdir()
        for path in (_stamp.REPO / folder).glob("*.py"):
            shutil.copy(path, tmp_path / folder / path.name)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_comments_docstrings_and_offline_modules_leave_the_results_current(tree: Path) -> None:
    before = _stamp.digest(tree)
    fingerprint = tree / "loop_guard" / "_fingerprint.py"
    _edit(fingerprint, '"""Return the SHA-256', '"""Give the SHA-256')
    _edit(fingerprint, "\ndef result_fingerprint(", "\n# A comment.\n\n\ndef result_fingerprint(")
    _edit(tree / "loop_guard" / "report.py", "import ", "import os  # noqa: F401\nimport ")
    assert _stamp.digest(tree) == before


@pytest.mark.parametrize("folder", ["loop_guard", "benchmarks"])
def test_a_change_of_what_the_code_does_makes_them_stale(tree: Path, folder: str) -> None:
    before = _stamp.digest(tree)
    module = "_fingerprint.py" if folder == "loop_guard" else "instructions.py"
    _edit(tree / folder / module, "from __future__ import annotations", "import os")
    assert _stamp.digest(tree) != before
