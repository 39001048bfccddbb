"""Seconds per small step through the core, as JSON: the loop_guard on PYTHONPATH is timed.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_step.py healthy
    PYTHONPATH=/tmp/other-tree .venv/bin/python benchmarks/bench_step.py repeating

Cases: `healthy` (a new call and a new result on every step), `repeating` (the same call
and the same small result on every step, thresholds out of reach, so that every detector
looks and none fires), `result_of` (the adapters' `Result` for a 200-character tool
message, with the default normalizers). A step is `Call.of` + `Session.check_call` +
`Result.of` + `Session.record_result`. Prints the median and the minimum of `rounds`
samples of `ops` steps each. Only the standard library and the package are imported, so
the script times any tree of the package: run it with each one's PYTHONPATH, alternately,
to compare two versions in one run on a noisy machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

from loop_guard import Call, LoopGuard, LoopGuardConfig, Result

ARGS = {"path": "src/app/models/user_profile.py", "start_line": 120, "end_line": 180}
OUT_OF_REACH = 10**8


def healthy() -> Callable[[int], None]:
    guard = LoopGuard()
    session = guard.session("bench")
    session.start_request("request")
    steps = iter(range(1 << 60))  # new calls across samples too

    def run(ops: int) -> None:
        for _ in range(ops):
            n = next(steps)
            call = Call.of("read_file", {**ARGS, "start_line": n})
            session.check_call(call)
            session.record_result(call, Result.of(f"line {n}: value = compute(index)"))

    return run


def repeating() -> Callable[[int], None]:
    guard = LoopGuard(
        warn_threshold=OUT_OF_REACH,
        block_threshold=OUT_OF_REACH + 1,
        backstop_threshold=OUT_OF_REACH + 2,
    )
    session = guard.session("bench")
    session.start_request("request")

    def run(ops: int) -> None:
        for _ in range(ops):
            call = Call.of("read_file", ARGS)
            session.check_call(call)
            session.record_result(call, Result.of("the same small result"))

    return run


def result_of() -> Callable[[int], None]:
    from langchain_core.messages import ToolMessage

    from loop_guard import _langchain

    normalizers = LoopGuardConfig().normalizers("read_file")
    text = "def compute(value, index):\n    return value * index + offset  # keep going\n" * 3
    message = ToolMessage(content=text[:200], tool_call_id="call_abc123", name="read_file")

    def run(ops: int) -> None:
        for _ in range(ops):
            _langchain.result_of(message, normalizers)

    return run


CASES = {"healthy": healthy, "repeating": repeating, "result_of": result_of}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    run = CASES[args.case]()
    run(args.ops)  # warm-up: imports, first calls, the interpreter's specialisation
    samples = []
    gc.disable()  # a collection lands in one sample or another: noise, not cost
    for _ in range(args.rounds):
        start = time.perf_counter()
        run(args.ops)
        samples.append((time.perf_counter() - start) / args.ops)
    gc.enable()
    samples.sort()
    print(json.dumps({"median": samples[len(samples) // 2], "min": samples[0]}))


if __name__ == "__main__":
    main()
