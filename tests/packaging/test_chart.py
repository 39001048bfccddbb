"""The demo's chart (`examples/chart.py`, drawn by `loop_guard.demo.plot_demo`): the picture
is written, and what it plots is what the demo's guard did."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from loop_guard.demo import ChartRun, DemoChart, chart_data, plot_demo
from tests.support import ROOT

SCRIPT = ROOT / "examples" / "chart.py"
COMMITTED = ROOT / "docs" / "images" / "demo.svg"


def svg_text(path: Path) -> str:
    """Every text of an SVG written with `svg.fonttype: none`, in one string."""
    root = ET.parse(path).getroot()
    return " ".join(
        "".join(node.itertext()) for node in root.iter("{http://www.w3.org/2000/svg}text")
    )


def test_the_script_writes_the_chart_as_svg_and_png(tmp_path: Path) -> None:
    """One run, both formats; each a real picture that says what the runaway cost."""
    svg, png = tmp_path / "demo.svg", tmp_path / "out" / "demo.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(svg), str(png)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert svg.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    text = svg_text(svg)
    for words in (
        "unguarded: 100 model calls, 100 tool runs",
        "(recursion limit)",
        "stop: 7 model calls,",
        "steer",
        "calls 5\N{EN DASH}7 blocked",
        "with LoopGuardMiddleware",
        "without loop_guard",
        "model call",
        "tool runs (cumulative)",
    ):
        assert words in text
    assert "Date" not in svg.read_text()  # drawn again, the file changes only with the chart
    assert svg_text(COMMITTED) == text  # the README's picture is the chart of today's demo


def test_the_chart_shows_what_the_guard_did_in_the_demo() -> None:
    """7 model calls and 4 tool runs guarded; steer after the 3rd, calls 5-7 blocked, stop at
    the 7th; the runaway to the recursion limit."""
    chart = chart_data()
    assert chart.guarded == ChartRun((1, 2, 3, 4, 4, 4, 4), 7, "loop_guard")
    assert chart.steers == (3,)
    assert chart.blocks == (5, 6, 7)
    assert chart.stop == 7
    assert chart.unguarded.tool_runs == tuple(range(1, 101))
    assert chart.unguarded.model_calls == 100
    assert chart.unguarded.ended_by == "LangGraph's recursion limit (200 steps)"


def test_the_lines_drawn_are_the_runs_data() -> None:
    """The guarded run in full, the runaway to twice as far, and the stop where it happened."""
    chart = DemoChart(
        unguarded=ChartRun(tuple(range(1, 101)), 100, "LangGraph's recursion limit"),
        guarded=ChartRun((1, 2, 3, 4, 4, 4, 4), 7, "loop_guard"),
        steers=(3,),
        blocks=(5, 6, 7),
        stop=7,
    )
    fig, ax = plt.subplots()
    try:
        assert plot_demo(ax, chart) is chart
        lines = {line.get_label(): line for line in ax.get_lines()}
        guarded = lines["with LoopGuardMiddleware"]
        assert list(guarded.get_xdata()) == [1, 2, 3, 4, 5, 6, 7]
        assert list(guarded.get_ydata()) == [1, 2, 3, 4, 4, 4, 4]
        unguarded = lines["without loop_guard"]
        assert list(unguarded.get_ydata()) == list(range(1, 15))
        assert ax.get_xlim()[1] < 15  # the stop is in view, not lost in 100 calls
        drawn = {collection.get_label(): collection for collection in ax.collections}
        assert drawn["steer: told to change course"].get_offsets().tolist() == [[3, 3]]
        blocked = drawn["blocked: the call was not run"].get_offsets().tolist()
        assert blocked == [[5, 4], [6, 4], [7, 4]]
        [stop] = drawn["stop: the request ended"].get_segments()  # a vertical line
        assert {x for x, _ in stop} == {7}
    finally:
        plt.close(fig)
