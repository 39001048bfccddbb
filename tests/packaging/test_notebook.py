"""The quickstart notebook runs end to end: any cell error fails the suite."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support import ROOT

NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


@pytest.mark.timeout(600)
def test_quickstart_notebook_executes() -> None:
    """Every cell runs; the chart is drawn from the guard's events and says what it did."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    outputs = [
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    ]
    text = "".join(outputs)
    assert "model calls: 7, tool runs: 4" in text
    assert "call   7: stop" in text
    assert "guarded: 7 model calls, 4 tool runs" in text
    assert "steer after model call 3, blocked model calls [5, 6, 7]" in text
    assert "stop at model call 7; unguarded: 100 model calls" in text
    images = [
        output for cell in notebook.cells for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]  # fmt: skip
    assert len(images) == 1
