"""Packaging, as a user meets it (slow: each test runs a subprocess for seconds).

- a user's `mypy --strict`, run outside the repository, finds the installed `loop_guard`
  and its types: with setuptools' default editable install (an import hook that mypy cannot
  follow) it reported `Cannot find implementation or library stub for module named
  "loop_guard"`; `package-dir` in pyproject.toml makes the editable install a path `.pth`;
- the wheel ships `loop_guard` with its `py.typed` marker and no other top-level package;
- a failing import of the middleware blames the `agents` extra only when langchain is missing.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from tests.support import ROOT

USER_CODE = """\
from loop_guard import LoopGuard, LoopGuardConfig

guard: LoopGuard = LoopGuard(LoopGuardConfig())
"""

# Deliberate mistakes: reported only if mypy sees the real types, not `Any`.
USER_MISTAKE = """\
from loop_guard import LoopGuard, LoopGuardMiddleware

count: int = LoopGuard()
LoopGuard(block_threshold="8")
LoopGuardMiddleware(warn_treshold=2)
"""


def _outside_repository(path: Path) -> None:
    if path.resolve().is_relative_to(ROOT):
        pytest.skip("the temporary directory lies inside the repository")


@pytest.mark.timeout(300)
def test_users_mypy_strict_finds_the_installed_package(tmp_path: Path) -> None:
    """From a directory outside the repository, `mypy --strict` type-checks user code
    against the installed `loop_guard`: clean code passes; a wrong type, a setting of the
    wrong type and a misspelt setting are caught."""
    _outside_repository(tmp_path)
    try:
        importlib.metadata.distribution("langchain-loop-guard")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("langchain-loop-guard is not installed in this environment")
    (tmp_path / "app.py").write_text(USER_CODE)
    (tmp_path / "mistake.py").write_text(USER_MISTAKE)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".cache"),
         "app.py", "mistake.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "import-not-found" not in output, output
    assert "import-untyped" not in output, output
    assert "app.py" not in output, output
    assert "mistake.py:3: error: Incompatible types in assignment" in output, output
    assert 'expression has type "LoopGuard"' in output, output
    # The settings are typed keywords: a wrong type and a misspelt name are caught.
    assert 'mistake.py:4: error: Argument "block_threshold" to "LoopGuard"' in output, output
    assert 'mistake.py:5: error: Unexpected keyword argument "warn_treshold"' in output, output
    assert "Found 3 errors in 1 file" in output, output


@pytest.mark.timeout(300)
def test_wheel_ships_the_package_typed_and_nothing_else(tmp_path: Path) -> None:
    """`pip install .` installs this wheel: `loop_guard` with `py.typed`, its metadata, and
    no `tests`, `evals` or `benchmarks` package. Built from a copy, so the tree stays clean."""
    _outside_repository(tmp_path)
    source = tmp_path / "source"
    ignore = (
        "build",
        "dist",
        ".venv",
        ".git",
        "*.egg-info",
        "__pycache__",
        ".*_cache",
        ".hypothesis",
    )
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*ignore), symlinks=True)
    # Offline with this environment's setuptools when it is recent enough, else isolated.
    try:
        isolation = Version(importlib.metadata.version("setuptools")) < Version("69")
    except importlib.metadata.PackageNotFoundError:
        isolation = True
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         *([] if isolation else ["--no-build-isolation"]), "-w", str(tmp_path / "dist"),
         str(source)],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"loop_guard"}, sorted(tops)
    assert "loop_guard/py.typed" in names
    assert "loop_guard/__init__.py" in names


def _import_middleware_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `from loop_guard import LoopGuardMiddleware` import the module again."""
    import loop_guard

    monkeypatch.delitem(sys.modules, "loop_guard.middleware", raising=False)
    monkeypatch.delitem(vars(loop_guard), "LoopGuardMiddleware", raising=False)
    monkeypatch.delitem(vars(loop_guard), "middleware", raising=False)


def test_a_missing_langchain_names_the_agents_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _import_middleware_afresh(monkeypatch)
    for name in {"langchain"} | {name for name in sys.modules if name.startswith("langchain.")}:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now fails
    with pytest.raises(ImportError, match=r"needs the `agents` extra"):
        from loop_guard import LoopGuardMiddleware  # noqa: F401


@pytest.mark.parametrize("broken", ["langgraph.typing", "typing_extensions"])
def test_any_other_import_error_names_its_real_cause(
    monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """With langchain installed, a failing import is not blamed on a missing extra (on
    Python 3.10 `typing.NotRequired` was missing, and the error said to install langchain)."""
    _import_middleware_afresh(monkeypatch)
    monkeypatch.setitem(sys.modules, broken, None)
    with pytest.raises(ImportError) as raised:
        from loop_guard import LoopGuardMiddleware  # noqa: F401
    assert "extra" not in str(raised.value)
    assert raised.value.name == broken
