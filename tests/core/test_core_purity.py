"""The core (identity, streaks, decisions) has no framework imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import loop_guard

CORE = [
    "_config",
    "_detectors",
    "_engine",
    "_events",
    "_fingerprint",
    "_guard",
    "_messages",
    "_repeated_text",
    "_siblings",
    "_state",
    "_values",
    "_volatile",
]
PACKAGE = Path(loop_guard.__file__).parent


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_framework(module: str) -> None:
    """Only the standard library and other core modules are imported."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "loop_guard":
            imported.update(f"loop_guard.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert imported, "the scan found no imports at all"
    for name in imported:
        assert not name.startswith(("langchain", "langgraph", "pydantic")), name
        if name.startswith("loop_guard"):
            assert name.removeprefix("loop_guard.") in CORE, name


def test_the_core_loads_without_langchain() -> None:
    """`import loop_guard` and a whole decision through the core load no framework: the
    adapters come in only when used."""
    code = (
        "import sys\n"
        "from loop_guard import Call, LoopGuard, Result\n"
        "session = LoopGuard(block_threshold=2, warn_threshold=1).session('t')\n"
        "for _ in range(2):\n"
        "    call = Call.of('ls', {})\n"
        "    verdict = session.check_call(call)\n"
        "    session.record_result(call, Result.of('same'))\n"
        "print(type(verdict).__name__)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langchain', 'langchain_core', 'langgraph', 'pydantic')))\n"
        "from loop_guard import guard_tools\n"
        "print('langchain_core' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split("\n")[:3] == ["Block", "[]", "True"]
