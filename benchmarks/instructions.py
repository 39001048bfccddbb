"""Machine instructions per healthy step, counted by valgrind in one process.

One child process runs under `valgrind --tool=callgrind` and measures every row in turn:
per row a warm-up run (imports and first calls are not counted), then a short and a long
healthy run of the same variant, each between two marks. A mark is a call of
`os.getppid`, and callgrind dumps its counters before each one (`--dump-before`), so each
run is counted alone; (long - short) / (the difference in steps) is one step. The SHA-256
rows hash the result's UTF-8 bytes the same way, so the step's growth with the size of
what tools return can be set against one hash counted in the same run. The hash seed is
fixed: randomised string hashes alone move a count.

The floors are what LangChain's hooks cost before any work: do-nothing middleware with
the guard's two wrap hooks and its state schema (`_minimal.py`), a do-nothing callback
handler, a do-nothing node where `LoopGuardNode` goes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _agents import (
    NullHandler,
    Scripted,
    Toolbox,
    agent_with,
    ask,
    config_for,
    graph_with,
    healthy,
    interventions,
    run_invoke,
    sized_result,
)
from _harness import Scale, Section, Target
from _minimal import (
    MinimalGuard,
    NullWrapModel,
    NullWrapState,
    graph_interceptor,
)
from langchain.agents.middleware import ToolCallLimitMiddleware

from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardConfig, LoopGuardMiddleware

VARIANTS = {
    "agent": "create_agent, no middleware",
    "null-wrap-model": "create_agent, a do-nothing middleware with the guard's two wrap hooks",
    "null-wrap-state": "the same + the guard's state schema",
    "null-handler": "create_agent + a do-nothing callback handler",
    "peer": "create_agent + ToolCallLimitMiddleware (limits set high)",
    "minimal": "create_agent + a minimal guard (one wrap_tool_call, table in memory)",
    "middleware": "create_agent + LoopGuardMiddleware",
    "middleware-pi": "create_agent + LoopGuardMiddleware(LoopGuardConfig.pi())",
    "handler": "create_agent + LoopGuardCallbackHandler, no middleware",
    "graph": "the README's graph, no guard",
    "graph-null-node": "the README's graph, a do-nothing node where the guard's node goes",
    "graph-guarded": "the README's graph, guard_tools + LoopGuardNode",
    "graph-minimal-tools": "the README's graph, a minimal guard in the tools node, no node",
}
BASE = {"graph": "graph", "": "agent"}
"""What a row is set against: the unguarded graph for the graph rows, else the agent."""

SIZES = {"": 0, "64k": 65_536, "1m": 1_048_576}
"""Result sizes: "" is the short reads of ~250 B (`_agents._FILLER`), the rest
`sized_result`, a source file or a JSON listing of about that size."""

STEPS = {0: (10, 30), 65_536: (2, 6), 1_048_576: (1, 3)}
"""The short and the long run's steps per size (the warm-up runs 2)."""

SIZED = ("agent", "middleware", "handler", "graph", "graph-guarded")
"""The rows counted at every size: the three faces and what they are set against."""

SHORT_ROWS = (
    "agent",
    "null-wrap-state",
    "null-handler",
    "peer",
    "middleware",
    "middleware-pi",
    "handler",
    "graph",
    "graph-null-node",
    "graph-guarded",
)
"""The rows counted at short reads: the faces, the floors beside them, the peer."""
QUICK_STEPS = (2, 4)

SHA = "sha256"
MARK = "os_getppid"  # the C function behind os.getppid: callgrind dumps before each call


@dataclass(frozen=True)
class Row:
    variant: str  # a key of VARIANTS, or SHA
    size: int

    @property
    def name(self) -> str:
        suffix = next(k for k, v in SIZES.items() if v == self.size)
        return f"{self.variant}-{suffix}" if suffix else self.variant


def plan() -> list[Row]:
    """The rows of a full count, in the order counted."""
    rows = [Row(v, 0) for v in SHORT_ROWS]
    for size in (65_536, 1_048_576):
        rows += [Row(SHA, size), *(Row(v, size) for v in SIZED)]
    return rows


# ---------------------------------------------------------------------------- the child


def build(variant: str, steps: int, size: int) -> tuple[Any, list[Any], Scripted, Toolbox]:
    """The runnable of a variant for a healthy script of `steps` steps, its callbacks."""
    script, box = healthy(steps), Toolbox(size)
    if variant == "graph-minimal-tools":
        runnable = graph_with(script, box, None, timed=False, interceptor=graph_interceptor())
        return runnable, [], script, box
    if variant.startswith("graph"):
        guard = LoopGuard() if variant == "graph-guarded" else None
        null = variant == "graph-null-node"
        runnable = graph_with(script, box, guard, timed=False, null_node=null)
        return runnable, [], script, box
    callbacks = {
        "handler": lambda: [LoopGuardCallbackHandler(LoopGuard())],
        "null-handler": lambda: [NullHandler()],
    }.get(variant, list)()
    middleware = {
        "null-wrap-model": [NullWrapModel()],
        "null-wrap-state": [NullWrapState()],
        "minimal": [MinimalGuard()],
        "peer": [ToolCallLimitMiddleware(run_limit=10**9, thread_limit=10**9)],
        "middleware": [LoopGuardMiddleware()],
        "middleware-pi": [LoopGuardMiddleware(LoopGuardConfig.pi())],
    }.get(variant, [])
    return agent_with(script, box, middleware), callbacks, script, box


def run_row(row: Row, steps: int, mark: Callable[[], object] = lambda: None) -> None:
    """One run of `row` of `steps` steps, between two marks; checked healthy after."""
    if row.variant == SHA:
        data = sized_result("src/module_0.py", row.size, 1)
        mark()
        for _ in range(steps):
            hashlib.sha256(data.encode("utf-8")).digest()
        mark()
        return
    runnable, callbacks, script, box = build(row.variant, steps, row.size)
    config = config_for(f"{row.name}-{steps}", limit=10_000, callbacks=callbacks)
    mark()
    messages, ended = run_invoke(runnable, ask(), config)
    mark()
    assert ended == "completed", (row.name, ended)
    assert interventions(messages, box, script) == 0, row.name


def child(rows: Sequence[Row], steps: dict[int, tuple[int, int]]) -> None:
    """Per row: a warm-up run, then the short and the long run, each between marks."""
    for row in rows:
        short, long = steps[row.size]
        run_row(row, 2)
        run_row(row, short, os.getppid)
        run_row(row, long, os.getppid)


# ---------------------------------------------------------------------------- the parent


def segments(arguments: Sequence[str], keep: Path | None = None) -> list[int]:
    """Instructions between consecutive marks of a Python child run with `arguments`
    under callgrind (the hash seed fixed); `keep` keeps callgrind's files there."""
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        out = Path(keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        completed = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}/callgrind.out",
                f"--dump-before={MARK}",
                sys.executable,
                *arguments,
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        if completed.returncode != 0:
            raise RuntimeError(f"the counted child failed: {completed.stderr[-3000:]}")
        dumps = sorted(out.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = []
        for dump in dumps:
            found = re.search(r"^totals:\s+(\d+)", dump.read_text(), re.MULTILINE)
            assert found is not None, dump
            totals.append(int(found.group(1)))
    # Dump n holds what ran before mark n: dump 1 is the start-up, then run, gap, run, ...
    return totals[1::2]


def count(rows: Sequence[Row], keep: Path | None = None) -> dict[Row, float]:
    """Instructions per step (per hash for the SHA-256 rows) of each row, in one process."""
    spec = json.dumps([[row.variant, row.size] for row in rows])
    runs = segments([__file__, "--child", spec], keep)
    assert len(runs) == 2 * len(rows), (len(runs), len(rows))
    per_step = {}
    for n, row in enumerate(rows):
        short, long = STEPS[row.size]
        per_step[row] = (runs[2 * n + 1] - runs[2 * n]) / (long - short)
    return per_step


def base_of(row: Row) -> Row:
    return Row(BASE["graph" if row.variant.startswith("graph") else ""], row.size)


FACES = {
    "middleware": "LoopGuardMiddleware",
    "handler": "LoopGuardCallbackHandler",
    "graph-guarded": "guard_tools + LoopGuardNode",
}
GROWTH = 1.2
"""What a face's step may add at 64 KB and 1 MB beyond its 250 B row, in SHA-256s."""


def run(scale: Scale, keep: Path | None = None) -> Section:
    """The counts as a section of the results; at quick scale, each row run plainly."""
    out = Section(
        "instructions",
        "Instructions per healthy step (valgrind)",
        "One `valgrind --tool=callgrind` process counted every row (`instructions.py`); "
        "*added* is the row less the unguarded agent (or graph) at the same result size, "
        "counted in the same process.",
        columns=["row", "per step", "added"],
    )
    if scale.quick:
        for row in plan():
            short, long = QUICK_STEPS
            run_row(row, short)
            run_row(row, long)
        out.notes.append("quick: every row run plainly at 2 and 4 steps, not counted")
        return out
    per_step = count(plan(), keep)
    out.rows = [table_row(row, per_step) for row in per_step]
    agent, peer = per_step[Row("agent", 0)], per_step[Row("peer", 0)]
    guard = per_step[Row("middleware", 0)]
    ratio = (guard - agent) / (peer - agent)
    name = "the default step, short reads, ÷ the peer's"
    out.targets.append(Target(name, "≤ 1.35x", f"{ratio:.2f}x", ratio <= 1.35))
    for variant, face in FACES.items():
        out.targets.append(flatness(variant, face, per_step))
    return out


def table_row(row: Row, per_step: dict[Row, float]) -> list[str]:
    if row.variant == SHA:
        return [
            f"one SHA-256 of a ~{row.name[len(SHA) + 1 :].upper()} result",
            mega(per_step[row]),
            "",
        ]
    base = base_of(row)
    added = "" if row == base else f"{(per_step[row] - per_step[base]) / 1e6:+.3f} M"
    return [f"`{row.name}`: {VARIANTS[row.variant]}", mega(per_step[row]), added]


def mega(instructions: float) -> str:
    return f"{instructions / 1e6:.3f} M"


def flatness(variant: str, face: str, per_step: dict[Row, float]) -> Target:
    """The face's added step at 64 KB and 1 MB against its short-read (~250 B) row plus
    1.2 SHA-256s of the result."""

    def added(size: int) -> float:
        row = Row(variant, size)
        return per_step[row] - per_step[base_of(row)]

    # The growth beyond the 250 B row, in SHA-256s of the result: flat means ≤ 1.2.
    worst = max((added(size) - added(0)) / per_step[Row(SHA, size)] for size in (65_536, 1_048_576))
    return Target.at_most(f"{face}: growth at 64 KB and 1 MB, in SHA-256s", GROWTH, worst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="rows to count (e.g. middleware-64k sha256-1m)")
    parser.add_argument("--keep", type=Path, help="keep callgrind's files (one per run) here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child([Row(v, size) for v, size in json.loads(args.child)], STEPS)
        return
    by_name = {row.name: row for row in plan()}
    rows = [by_name[name] for name in args.rows] if args.rows else plan()
    per_step = count(rows, args.keep)
    print("| row | per step | added |\n|---|---|---|")
    for row in rows:
        known = base_of(row) in per_step or row.variant == SHA
        cells = table_row(row, per_step) if known else [row.name, mega(per_step[row]), "?"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
