"""Draw `loop-guard demo` as a chart: `python examples/chart.py [PATH ...]`.

Runs the demo's stubborn agent without and with `LoopGuardMiddleware` and writes the chart
(`loop_guard.demo.plot_demo`, the same one the quickstart notebook draws) to each PATH, by
default `docs/images/demo.svg`. The format follows each PATH's suffix (`.svg`, `.png`).
Needs matplotlib (the `dev` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, never a window

import matplotlib.pyplot as plt

from loop_guard.demo import plot_demo

DEFAULT = Path(__file__).resolve().parents[1] / "docs" / "images" / "demo.svg"


def main(argv: list[str]) -> int:
    """Write the chart to each path given, or to `docs/images/demo.svg`."""
    paths = [Path(arg) for arg in argv] or [DEFAULT]
    plt.rcParams.update(
        {
            "font.size": 11,
            "svg.fonttype": "none",  # text stays text: small, sharp and searchable
            "svg.hashsalt": "loop_guard",  # the same ids on every run
        }
    )
    fig, ax = plt.subplots(figsize=(9, 4.6), layout="constrained")
    plot_demo(ax)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        # No date in the file, so drawing it again changes nothing unless the chart did.
        metadata = {"Date": None} if path.suffix == ".svg" else {}
        fig.savefig(path, dpi=150, metadata=metadata)
        print(path)
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
