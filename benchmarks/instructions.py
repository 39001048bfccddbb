"""Machine instructions per healthy step, counted by valgrind: a measure the load cannot move.

    .venv/bin/python benchmarks/instructions.py                 # every variant
    .venv/bin/python benchmarks/instructions.py middleware peer  # some of them
    .venv/bin/python benchmarks/instructions.py --jobs 2 ...     # two counts at a time
    .venv/bin/python benchmarks/instructions.py --check          # the floors' sanity, no valgrind
    .venv/bin/python benchmarks/instructions.py peer-4k middleware-4k  # reads of ~4 KB

Each variant runs a healthy scripted agent of 20 and of 120 steps under `valgrind
--tool=callgrind` (after a 5-step warm-up run in the same process, so imports and first
calls are not counted); the difference divided by 100 is the instructions of one step. The
hash seed is fixed: randomised string hashes alone move the count by ~100k per step. Needs
valgrind on the PATH; each variant takes a few minutes. Not part of `run.py`: see FINDINGS.md.

The floors (`_minimal.py`): do-nothing middleware with one or two per-step hooks, and a
minimal guard of repeated identical results (in memory, in the agent state, in the graph's
tools node), so that the guard's own work can be set against the least such a guard does.
`--check` runs them plainly: a healthy run is left alone, a stubborn one is steered once and
refused from its sixth call.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _agents import (
    NullHandler,
    NullHooks,
    Scripted,
    Toolbox,
    agent_with,
    ask,
    config_for,
    graph_with,
    healthy,
    interventions,
    run_invoke,
)
from _minimal import (
    REFUSAL,
    STEER,
    MinimalGuard,
    MinimalStateGuard,
    NullWrapModel,
    NullWrapModelOnly,
    NullWrapState,
    NullWrapTool,
    graph_interceptor,
)
from langchain.agents.middleware import ToolCallLimitMiddleware

from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardConfig, LoopGuardMiddleware

VARIANTS = {
    "agent": "create_agent, no middleware",
    "null-wrap-tool": "create_agent, a do-nothing middleware with wrap_tool_call only",
    "null-wrap-model-only": "create_agent, a do-nothing middleware with wrap_model_call only",
    "null-wrap-model": "create_agent, a do-nothing middleware with the two wrap hooks",
    "null-wrap-state": "create_agent, the two wrap hooks doing nothing + the guard's state schema",
    "null-hooks": "create_agent, a do-nothing middleware with our hooks",
    "peer": "create_agent + ToolCallLimitMiddleware (limits set high)",
    "minimal": "create_agent + a minimal guard (one wrap_tool_call, table in memory)",
    "minimal-state": "create_agent + a minimal guard (one wrap_tool_call, table in the state)",
    "middleware": "create_agent + LoopGuardMiddleware",
    "middleware-pi": "create_agent + LoopGuardMiddleware(LoopGuardConfig.pi())",
    "handler": "create_agent + LoopGuardCallbackHandler, no middleware",
    "graph": "the README's graph, no guard",
    "graph-null-node": "the README's graph, a do-nothing node where the guard's node goes",
    "graph-guarded": "the README's graph, node + wrapped tools",
    "graph-handler": "the README's graph, node + wrapped tools + handler",
    "graph-null-handler": "the README's graph, node + wrapped tools + a do-nothing handler",
    "graph-tools-handler": "the README's graph, wrapped tools + handler, no node",
    "graph-minimal-tools": "the README's graph, a minimal guard in the tools node, no node",
}

RESULT_SIZES = {"250b": 250, "4k": 4096, "64k": 65536}
"""The sized rows: `agent-4k` is `agent` whose reads answer ~4 KB (`sized_result`)."""
SIZED = ("agent", "peer", "middleware")
VARIANTS |= {
    f"{variant}-{suffix}": f"{VARIANTS[variant]}, reads of ~{suffix.upper()} of code or JSON"
    for variant in SIZED
    for suffix in RESULT_SIZES
}

FLOORS = (
    "null-wrap-tool",
    "null-wrap-model-only",
    "null-wrap-model",
    "null-wrap-state",
    "minimal",
    "minimal-state",
    "graph-minimal-tools",
)
"""The variants of `_minimal.py`, which `--check` runs."""


def build(variant: str, steps: int) -> tuple[Any, list[Any]]:
    """The runnable of a variant for a healthy script of `steps` steps, and its callbacks."""
    base, _, suffix = variant.rpartition("-")
    if base in SIZED and suffix in RESULT_SIZES:
        return build_for(base, healthy(steps), Toolbox(RESULT_SIZES[suffix]))
    return build_for(variant, healthy(steps), Toolbox())


def build_for(variant: str, script: Scripted, box: Toolbox) -> tuple[Any, list[Any]]:
    """The runnable of a variant for `script` on `box`'s tools, and its callbacks."""
    if variant == "graph-minimal-tools":
        return graph_with(script, box, None, timed=False, interceptor=graph_interceptor()), []
    if variant.startswith("graph"):
        guard = None if variant in ("graph", "graph-null-node") else LoopGuard()
        null_node = variant == "graph-null-node"
        node = variant != "graph-tools-handler"
        runnable = graph_with(script, box, guard, timed=False, node=node, null_node=null_node)
        if variant == "graph-null-handler":
            return runnable, [NullHandler()]
        handler = variant.endswith("handler") and guard is not None
        return runnable, [LoopGuardCallbackHandler(guard)] if handler else []
    if variant == "handler":
        return agent_with(script, box, []), [LoopGuardCallbackHandler(LoopGuard())]
    middleware = {
        "agent": [],
        "null-wrap-tool": [NullWrapTool()],
        "null-wrap-model-only": [NullWrapModelOnly()],
        "null-wrap-model": [NullWrapModel()],
        "null-wrap-state": [NullWrapState()],
        "null-hooks": [NullHooks()],
        "minimal": [MinimalGuard()],
        "minimal-state": [MinimalStateGuard()],
        "peer": [ToolCallLimitMiddleware(run_limit=10**9, thread_limit=10**9)],
        "middleware": [LoopGuardMiddleware()],
        "middleware-pi": [LoopGuardMiddleware(LoopGuardConfig.pi())],
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
    return instructions_of([__file__, "--child", variant, str(steps)])


def instructions_of(arguments: Sequence[str]) -> int:
    """Instructions of a whole Python process run with `arguments`, under callgrind, with
    the hash seed fixed."""
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            *arguments,
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


def check() -> None:
    """Run the floors plainly: healthy runs untouched, a stubborn one steered and refused."""
    for variant in FLOORS:
        script, box = healthy(20), Toolbox()
        runnable, callbacks = build_for(variant, script, box)
        config = config_for(f"check-{variant}", limit=1000, callbacks=callbacks)
        messages, ended = run_invoke(runnable, ask(), config)
        changed = interventions(messages, box, script)
        outcome = (ended, changed, box.runs["read_file"])
        assert outcome == ("completed", 0, 20), (variant, outcome)
        if variant.startswith("null"):
            print(f"{variant}: healthy run untouched")
            continue
        # The same missing file ten times: runs 1-5 (the 3rd result steered), 6-10 refused.
        box = Toolbox()
        script = Scripted(lambda turn: [("read_file", {"path": "notes.md"})] if turn < 10 else None)
        runnable, callbacks = build_for(variant, script, box)
        config = config_for(f"stubborn-{variant}", limit=1000, callbacks=callbacks)
        messages, ended = run_invoke(runnable, ask(), config)
        texts = [str(m.content) for m in messages if m.type == "tool"]
        steered = sum(text.endswith(STEER) for text in texts)
        refused = texts.count(REFUSAL)
        outcome = (ended, box.runs["read_file"], steered, refused, len(texts))
        assert outcome == ("completed", 5, 1, 5, 10), (variant, outcome)
        print(f"{variant}: healthy run untouched; stubborn run: 5 runs, 1 steer, 5 refusals")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help=f"some of: {', '.join(VARIANTS)}")
    parser.add_argument(
        "--jobs", type=int, default=1, help="valgrind runs at a time (counts do not move)"
    )
    parser.add_argument("--check", action="store_true", help="run the floors plainly, once")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], int(args.child[1]))
        return
    if args.check:
        check()
        return
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    variants = args.variants or list(VARIANTS)
    print("| variant | instructions per step |\n|---|---|", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        counts = {
            (variant, steps): pool.submit(count, variant, steps)
            for variant in variants
            for steps in (120, 20)
        }
        for variant in variants:  # in order, each as soon as its two counts are in
            per_step = (counts[variant, 120].result() - counts[variant, 20].result()) / 100
            print(f"| {variant}: {VARIANTS[variant]} | {per_step / 1e6:.3f} M |", flush=True)


if __name__ == "__main__":
    main()
