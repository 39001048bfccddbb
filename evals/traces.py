"""Replay recorded agent conversations through the guard and score it against labels.

    python evals/traces.py [TRACES_DIR] [--write evals/RESULTS.md]

TRACES_DIR holds OpenAI-format conversations and a `labels.json` (see the traces' own
README); it defaults to `../shared/traces` beside the repository. For each trace and each
configuration it reports the tool call index of the first steer, block and stop, against
the labelled first loop call, then checks the targets:

- every loop trace steered no later than two calls after its `first_loop_call`;
- zero blocks on healthy traces, and steers on at most two of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loop_guard import LoopGuardConfig
from loop_guard.scan import load, scan_conversation

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"

CONFIGS = {"pi": LoopGuardConfig.pi(), "default": LoopGuardConfig()}
"""The configurations compared side by side. New detectors get a column of their own."""


@dataclass(frozen=True, slots=True)
class Row:
    """One trace under one configuration."""

    file: str
    kind: str
    first_loop_call: int | None
    calls: int
    warn: int | None
    block: int | None
    stop: int | None

    @property
    def steered_in_time(self) -> bool:
        """A loop steered no later than two calls after its labelled first loop call."""
        return (
            self.first_loop_call is not None
            and self.warn is not None
            and self.warn <= self.first_loop_call + 2
        )


def evaluate(traces: Path, config: LoopGuardConfig) -> list[Row]:
    """Score every labelled trace under one configuration."""
    labels = json.loads((traces / "labels.json").read_text())
    rows = []
    for label in labels:
        [conversation] = load(traces / label["file"])
        report = scan_conversation(config, conversation)
        first = {
            name: (found.call_index if (found := report.first(*kinds)) else None)
            for name, kinds in (("warn", ("warn",)), ("block", ("block",)))
        }
        stop = report.first("abort", "terminate")
        rows.append(
            Row(
                file=label["file"].removesuffix(".json"),
                kind=label["kind"],
                first_loop_call=label.get("first_loop_call"),
                calls=report.calls,
                warn=first["warn"],
                block=first["block"],
                stop=None if stop is None else stop.call_index,
            )
        )
    return rows


def summary(rows: list[Row]) -> dict[str, Any]:
    """The targets, measured."""
    loops = [r for r in rows if r.kind == "loop"]
    healthy = [r for r in rows if r.kind == "healthy"]
    return {
        "loops steered in time": f"{sum(r.steered_in_time for r in loops)}/{len(loops)}",
        "loops blocked": f"{sum(r.block is not None for r in loops)}/{len(loops)}",
        "loops stopped": f"{sum(r.stop is not None for r in loops)}/{len(loops)}",
        "healthy with a block (target 0)": sum(r.block is not None for r in healthy),
        "healthy with a steer (target <= 2)": sum(r.warn is not None for r in healthy),
    }


def table(results: dict[str, list[Row]]) -> str:
    """Markdown: one row per trace, a column group per configuration, then the summary."""
    names = list(results)
    head = "| trace | label | first loop call | calls | " + " | ".join(
        f"{name}: steer / block / stop" for name in names
    )
    lines = [head + " |", "|" + "---|" * (4 + len(names))]
    first = results[names[0]]
    for index, row in enumerate(first):
        cells = [
            " / ".join("-" if v is None else str(v) for v in (r.warn, r.block, r.stop))
            for r in (results[name][index] for name in names)
        ]
        loop = "-" if row.first_loop_call is None else str(row.first_loop_call)
        lines.append(
            f"| {row.file} | {row.kind} | {loop} | {row.calls} | " + " | ".join(cells) + " |"
        )
    lines += ["", "| target | " + " | ".join(names) + " |", "|" + "---|" * (1 + len(names))]
    summaries = {name: summary(rows) for name, rows in results.items()}
    for key in summaries[names[0]]:
        lines.append(f"| {key} | " + " | ".join(str(summaries[n][key]) for n in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; print the table, optionally write it to a file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="?", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--write", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if not (args.traces / "labels.json").is_file():
        print(f"no labels.json in {args.traces}", file=sys.stderr)
        return 2
    results = {name: evaluate(args.traces, config) for name, config in CONFIGS.items()}
    text = table(results)
    print(text)
    if args.write:
        args.write.write_text(
            "# Evaluation on recorded traces\n\nGenerated by `python evals/traces.py "
            "--write evals/RESULTS.md`. Tool calls are numbered from 1 in each trace; "
            "each user message starts a new request.\n\n" + text
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
