"""Where the guard's time goes: cProfile of the paths the benchmarks flag.

    .venv/bin/python benchmarks/profile_hotspots.py            # every case
    .venv/bin/python benchmarks/profile_hotspots.py small-step # one case

Cases:
    small-step       10,000 healthy engine steps with small payloads (benchmark 1)
    structured-args  `Call.of` on 1 MB of structured args (benchmark 1)
    middleware       a 300-step create_agent run with LoopGuardMiddleware (benchmark 2)
    graph-long       an 800-step request through node + wrapped tools + handler (benchmark 3)

Only functions of `loop_guard` (and what they call) are listed for the agent cases.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
from collections.abc import Callable

from _agents import Toolbox, agent_with, ask, config_for, graph_with, healthy, run_invoke
from bench_engine import SMALL_ARGS, records_args, text

from loop_guard import (
    Call,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    Result,
)


def small_step() -> None:
    session = LoopGuard().session("t")
    results = tuple(text(1024, letter) for letter in "abcde")  # healthy: see bench_engine
    for n in range(10_000):
        call = Call.of("read_file", SMALL_ARGS, id=f"c{n}")
        session.check_call(call)
        session.record_result(call, Result.of(results[n % len(results)]))


def structured_args() -> None:
    args = records_args(1024 * 1024)
    for _ in range(3):
        Call.of("write", args)


def middleware() -> None:
    agent = agent_with(healthy(300), Toolbox(), [LoopGuardMiddleware()])
    run_invoke(agent, ask(), config_for("p1", limit=100_000))


def graph_long() -> None:
    guard = LoopGuard()
    graph = graph_with(healthy(800), Toolbox(), guard, timed=False)
    handler = LoopGuardCallbackHandler(guard)
    run_invoke(graph, ask(), config_for("p2", limit=100_000, callbacks=[handler]))


CASES: dict[str, tuple[Callable[[], None], str, str]] = {
    "small-step": (small_step, "tottime", ""),
    "structured-args": (structured_args, "tottime", ""),
    "middleware": (middleware, "cumulative", "loop_guard"),
    "graph-long": (graph_long, "tottime", "loop_guard"),
}


def profile(name: str, lines: int) -> str:
    function, order, restriction = CASES[name]
    profiler = cProfile.Profile()
    profiler.runcall(function)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats(order)
    if restriction:
        stats.print_stats(restriction, lines)
    else:
        stats.print_stats(lines)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--lines", type=int, default=25)
    args = parser.parse_args()
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    logging.getLogger().addHandler(logging.NullHandler())
    for name in args.cases or CASES:
        print(f"===== {name}", flush=True)
        print(profile(name, args.lines), flush=True)


if __name__ == "__main__":
    main()
