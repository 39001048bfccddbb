"""Replay recorded agent conversations through the guard and score it against labels.

    python -m evals.traces [TRACES_DIR] [--write evals/RESULTS.md] [--baseline DIR]

TRACES_DIR holds OpenAI-format conversations and a `labels.json` (see the traces' own
README); it defaults to `../shared/traces` beside the repository. For each trace and each
configuration (pure Pi, and the default with every detector) it reports the tool call
index of the first steer, block and stop, against the labelled first loop call, then
checks the targets:

- every loop trace steered no later than two calls after its `first_loop_call`;
- the 117-repeat runaway (kimi P1) aborted before its 10th call, kimi P2 blocked;
- zero blocks on healthy traces, and a steer on at most one of them.

With `--baseline DIR`, a checkout of an earlier version (`git worktree add DIR COMMIT`), that
version's default configuration runs on the same traces in a process of its own and gets a
column before the current default's: the measured before and after.

Then it runs the scenario catalogue (`evals/catalogue.py`) through a real `create_agent`
with the middleware, under both configurations, and checks each scenario's verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.catalogue import SCENARIOS, Recorder, Scenario, via_middleware
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
    steer: int | None
    block: int | None
    stop: int | None

    @property
    def steered_in_time(self) -> bool:
        """A loop steered no later than two calls after its labelled first loop call."""
        return (
            self.first_loop_call is not None
            and self.steer is not None
            and self.steer <= self.first_loop_call + 2
        )


def evaluate(traces: Path, config: LoopGuardConfig) -> list[Row]:
    """Score every labelled trace under one configuration."""
    labels = json.loads((traces / "labels.json").read_text())
    rows = []
    for label in labels:
        [conversation] = load(traces / label["file"])
        report = scan_conversation(config, conversation)
        steer, block, stop = (report.first(kind) for kind in ("steer", "block", "stop"))
        rows.append(
            Row(
                file=label["file"].removesuffix(".json"),
                kind=label["kind"],
                first_loop_call=label.get("first_loop_call"),
                calls=report.calls,
                steer=None if steer is None else steer.call_index,
                block=None if block is None else block.call_index,
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
        "healthy with a steer (target <= 1)": sum(r.steer is not None for r in healthy),
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
            " / ".join("-" if v is None else str(v) for v in (r.steer, r.block, r.stop))
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


def catalogue_row(scenario: Scenario, config: LoopGuardConfig) -> tuple[str, bool]:
    """First steer / block / stop call of one scenario, and whether its verdict holds."""
    recorder = Recorder()
    via_middleware(scenario, recorder, Counter(), config)
    firsts = [
        next((index for index, event, _ in recorder.events if event == kind), None)
        for kind in ("steer", "block", "stop")
    ]
    try:
        scenario.expect(recorder.events)
    except AssertionError:
        holds = False
    else:
        holds = True
    return " / ".join("-" if n is None else str(n) for n in firsts), holds


def catalogue_table() -> str:
    """Markdown: each catalogue scenario under pi and default, and its verdict."""
    names = list(CONFIGS)
    lines = [
        "| scenario | " + " | ".join(f"{n}: steer / block / stop" for n in names)
        + " | verdict (default) |",
        "|" + "---|" * (2 + len(names)),
    ]  # fmt: skip
    held = 0
    for scenario in SCENARIOS:
        cells = [catalogue_row(scenario, config) for config in CONFIGS.values()]
        holds = cells[-1][1]
        held += holds
        verdict = "holds" if holds else "**fails**"
        lines.append(f"| {scenario.key} | " + " | ".join(c for c, _ in cells) + f" | {verdict} |")
    lines += ["", f"{held}/{len(SCENARIOS)} catalogue verdicts hold with the defaults."]
    return "\n".join(lines) + "\n"


_BASELINE = """
import dataclasses, json, sys
from pathlib import Path
from evals.traces import evaluate
from loop_guard import LoopGuardConfig
rows = evaluate(Path(sys.argv[1]), LoopGuardConfig())
print(json.dumps([dataclasses.asdict(row) for row in rows]))
"""


def baseline(traces: Path, checkout: Path) -> tuple[str, list[Row]]:
    """The default configuration of the version checked out in `checkout`, evaluated on
    `traces` in a process of its own, named by its commit."""
    environ = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", _BASELINE, str(traces)],
        capture_output=True, text=True, check=True, env=environ, cwd=checkout,
    )  # fmt: skip
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # Versions that called the steer `warn` named its column so.
    rows = [
        {"steer" if k == "warn" else k: v for k, v in row.items()}
        for row in json.loads(done.stdout)
    ]
    return f"default at {commit}", [Row(**row) for row in rows]


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; print the table, optionally write it to a file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="?", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--write", type=Path, help="also write the Markdown table here")
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR", help="a checkout of an earlier version"
    )
    args = parser.parse_args(argv)
    if not (args.traces / "labels.json").is_file():
        print(f"no labels.json in {args.traces}", file=sys.stderr)
        return 2
    results = {name: evaluate(args.traces, config) for name, config in CONFIGS.items()}
    if args.baseline:
        name, rows = baseline(args.traces, args.baseline)
        results = {"pi": results["pi"], name: rows, "default": results["default"]}
    text = (
        table(results)
        + "\n## Scenario catalogue (notes/agent-harnesses.md §7)\n\n"
        + "Each scenario through a real `create_agent` with `LoopGuardMiddleware`; tool "
        + "calls numbered from 1; a batch's events are at its last call.\n\n"
        + catalogue_table()
    )
    print(text)
    if args.write:
        args.write.write_text(
            "# Evaluation on recorded traces\n\nGenerated by `python -m evals.traces "
            "--write evals/RESULTS.md`. Tool calls are numbered from 1 in each trace; "
            "each user message starts a new request. `pi` is the Pi extension's behaviour "
            "(`LoopGuardConfig.pi()`); `default` adds every detector (see How the guard decides: "
            "beyond the Pi extension).\n\n" + text
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
