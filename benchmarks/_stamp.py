"""What makes the benchmarks' numbers, as one digest that RESULTS.md records.

The inputs are the code of the package modules a guarded step can run (every module of
`loop_guard/` but the offline ones in `OFFLINE`) and of the benchmarks themselves. Code
means the syntax tree without docstrings: comments, docstrings and formatting change no
number and never make the results stale; a change of what the code does does, wherever
it lands. The framework's versions are recorded beside it (the *Machine* table) but not
compared: the test suite runs against the oldest and the newest releases allowed too.
`tests/packaging/test_benchmark_results.py` fails when the digest no longer matches.
"""

from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OFFLINE = frozenset(
    {
        "__main__",
        "cli",
        "scan",
        "report",
        "_report_page",
        "_readers",
        "_traces",
        "demo",
        "upgrades",
    }
)
"""Modules no guarded step runs: the offline report and scan with their readers (of
checkpoints, conversation files and traces), the CLI, the demo."""

LINE = re.compile(r"<!-- inputs: ([0-9a-f]{16}) -->")
"""How a results file records the digest it was made from."""


def inputs(root: Path = REPO) -> list[Path]:
    """The files whose code makes the numbers, in a fixed order."""
    package = [p for p in sorted((root / "loop_guard").glob("*.py")) if p.stem not in OFFLINE]
    return package + sorted((root / "benchmarks").glob("*.py"))


def digest(root: Path = REPO) -> str:
    """16 hex digits of the SHA-256 of every input's code (see the module's docstring)."""
    total = hashlib.sha256()
    for path in inputs(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        total.update(f"{path.relative_to(root).as_posix()}\n{_shape(tree)!r}\n".encode())
    return total.hexdigest()[:16]


def _shape(node: object) -> object:
    """A syntax tree as nested tuples that Python 3.10 to 3.13 all write alike: no
    docstrings, no empty or defaulted fields (newer versions add some), no contexts."""
    if isinstance(node, list):
        return tuple(_shape(item) for item in node if not _is_docstring(item))
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = tuple(
        (name, _shape(value))
        for name, value in ast.iter_fields(node)
        if value not in (None, []) and name not in ("ctx", "kind", "type_ignores")
    )
    return (type(node).__name__, fields)


def _is_docstring(node: object) -> bool:
    """A statement that is a lone string: a docstring, or one documenting an attribute."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def stamp() -> str:
    """The line a results file carries: the inputs' digest, read back by the test."""
    return f"<!-- inputs: {digest()} -->"
