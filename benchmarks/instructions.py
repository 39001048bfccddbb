"""Machine instructions per healthy step, counted by valgrind: a measure the load cannot move.

    .venv/bin/python benchmarks/instructions.py                 # every variant
    .venv/bin/python benchmarks/instructions.py middleware peer  # some of them

Each variant runs a healthy scripted agent of 20 and of 120 steps under `valgrind
--tool=callgrind` (after a 5-step warm-up run in the same process, so imports and first
calls are not counted); the difference divided by 100 is the instructions of one step. The
hash seed is fixed: randomised string hashes alone move the count by ~100k per step. Needs
valgrind on the PATH; each variant takes a few minutes. Not part of `run.py`: see FINDINGS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Any

from _agents import (
    NullHandler,
    NullHooks,
    Toolbox,
    agent_with,
    ask,
    config_for,
    graph_with,
    healthy,
    run_invoke,
)
from langchain.agents.middleware import ToolCallLimitMiddleware

from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardMiddleware

VARIANTS = {
    "agent": "create_agent, no middleware",
    "null-hooks": "create_agent, a do-nothing middleware with our hooks",
    "peer": "create_agent + ToolCallLimitMiddleware (limits set high)",
    "middleware": "create_agent + LoopGuardMiddleware",
    "graph": "the README's graph, no guard",
    "graph-null-node": "the README's graph, a do-nothing node where the guard's node goes",
    "graph-guarded": "the README's graph, node + wrapped tools",
    "graph-handler": "the README's graph, node + wrapped tools + handler",
    "graph-null-handler": "the README's graph, node + wrapped tools + a do-nothing handler",
    "graph-tools-handler": "the README's graph, wrapped tools + handler, no node",
}


def build(variant: str, steps: int) -> tuple[Any, list[Any]]:
    """The runnable of a variant for a healthy script of `steps` steps, and its callbacks."""
    script, box = healthy(steps), Toolbox()
    if variant.startswith("graph"):
        guard = None if variant in ("graph", "graph-null-node") else LoopGuard()
        null_node = variant == "graph-null-node"
        node = variant != "graph-tools-handler"
        runnable = graph_with(script, box, guard, timed=False, node=node, null_node=null_node)
        if variant == "graph-null-handler":
            return runnable, [NullHandler()]
        handler = variant.endswith("handler") and guard is not None
        return runnable, [LoopGuardCallbackHandler(guard)] if handler else []
    middleware = {
        "agent": [],
        "null-hooks": [NullHooks()],
        "peer": [ToolCallLimitMiddleware(run_limit=10**9, thread_limit=10**9)],
        "middleware": [LoopGuardMiddleware()],
    }[variant]
    return agent_with(script, box, middleware), []


def run(variant: str, steps: int) -> None:
    """A warm-up run, then the counted one (the child process's work)."""
    for length in (5, steps):
        runnable, callbacks = build(variant, length)
        run_invoke(
            runnable, ask(), config_for(f"{variant}-{length}", limit=100_000, callbacks=callbacks)
        )


def count(variant: str, steps: int) -> int:
    """Instructions of a whole process running `variant` for `steps` steps."""
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            variant,
            str(steps),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected : (\d+)", completed.stderr)
    if found is None:
        msg = f"no instruction count in valgrind's output: {completed.stderr[-500:]}"
        raise RuntimeError(msg)
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help=f"some of: {', '.join(VARIANTS)}")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], int(args.child[1]))
        return
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    print("| variant | instructions per step |\n|---|---|")
    for variant in args.variants or list(VARIANTS):
        per_step = (count(variant, 120) - count(variant, 20)) / 100
        print(f"| {VARIANTS[variant]} | {per_step / 1e6:.3f} M |", flush=True)


if __name__ == "__main__":
    main()
