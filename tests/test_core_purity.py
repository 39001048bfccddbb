"""The core (identity, streaks, decisions) has no framework imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loop_guard

CORE = [
    "_config",
    "_engine",
    "_fingerprint",
    "_guard",
    "_messages",
    "_siblings",
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
