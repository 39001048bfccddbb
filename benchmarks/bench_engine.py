"""Engine floor ratio: recording one call and its result, against the unavoidable work.

The floor is what any guard comparing (tool, args, result) must do at least: the
canonical JSON of the args (`json.dumps(sort_keys=True)`, C-accelerated) and the SHA-256
of the result's UTF-8 bytes. Ours is the public engine API doing a whole step:
`Call.of` + `Session.check_call` + `Result.of` + `Session.record_result`.
"""

from __future__ import annotations

import gc
import hashlib
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from _harness import (
    Scale,
    Section,
    Target,
    interleave,
    median,
    quartiles,
    ratio,
    size_text,
    us,
)

from loop_guard import Call, LoopGuard, Result

KB = 1024
MB = 1024 * 1024
SIZES = {
    "small": (100, KB),
    "medium": (10 * KB, 10 * KB),
    "1MB": (MB, MB),
    "10MB": (10 * MB, 10 * MB),
}
SMALL_ARGS = {
    "path": "src/app/models/user_profile.py",
    "start_line": 120,
    "end_line": 180,
    "encoding": "utf-8",
}


def canonical(args: Any) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def text(size: int, seed: str = "a") -> str:
    """`size` characters of code-like ASCII text."""
    line = f"{seed} = compute(value, index) + offset  # keep going until the buffer is full\n"
    return (line * (size // len(line) + 1))[:size]


def records_args(size: int) -> dict[str, Any]:
    """Structured args (a table of small records) whose canonical JSON is about `size`."""
    rows: list[dict[str, Any]] = []
    total = 30
    while total < size:
        i = len(rows)
        row = {"id": i, "name": f"item-{i}", "tags": ["alpha", "beta"], "score": i * 0.5 + 0.25}
        row["active"] = i % 2 == 0
        rows.append(row)
        total += len(canonical(row)) + 1
    return {"table": "events", "rows": rows}


def text_args(size: int) -> dict[str, Any]:
    """Text-heavy args (one long string field, like a file write) of about `size`."""
    return {"path": "out/data.txt", "mode": "w", "content": text(max(size - 50, 1))}


ROTATION = "abcdefghi"
"""Nine results in turn: a rotation longer than any cycle the guard looks for (6 steps)
and sparser than its interleaved-repeat window allows, so every step is healthy."""


def payloads(name: str) -> list[tuple[str, Any, tuple[str, ...]]]:
    """(label, args, results) for one size; the results rotate, so no loop forms."""
    args_size, result_size = SIZES[name]
    results = tuple(text(result_size, letter) for letter in ROTATION)
    if name == "small":
        return [("small: 100 B args, 1 KB result", SMALL_ARGS, results)]
    return [
        (f"{name} (structured args)", records_args(args_size), results),
        (f"{name} (text args)", text_args(args_size), results),
    ]


def _per_op(function: Callable[[int], None], ops: int) -> Callable[[], float]:
    def sample() -> float:
        start = time.perf_counter()
        function(ops)
        return (time.perf_counter() - start) / ops

    return sample


def measure(
    args: Any, results: tuple[str, ...], budget: float, rounds: int
) -> dict[str, list[float]]:
    """Per-op seconds of the floor, of the two fingerprints alone, and of a whole step."""
    guard = LoopGuard()
    session = guard.session("bench")
    session.start_request("request")
    ids = iter(range(1 << 60))
    steps = iter(range(1 << 60))

    def floor(ops: int) -> None:
        for i in range(ops):
            canonical(args)
            hashlib.sha256(results[i % len(results)].encode("utf-8")).hexdigest()

    def floor_with_args_hash(ops: int) -> None:
        for i in range(ops):
            hashlib.sha256(canonical(args).encode("utf-8")).hexdigest()
            hashlib.sha256(results[i % len(results)].encode("utf-8")).hexdigest()

    def fingerprints(ops: int) -> None:
        for i in range(ops):
            Call.of("read_file", args, id=f"c{next(ids)}")
            Result.of(results[i % len(results)])

    def record(ops: int) -> None:
        for _ in range(ops):
            n = next(steps)  # the rotation goes on across samples too
            call = Call.of("read_file", args, id=f"c{n}")
            session.check_call(call)
            session.record_result(call, Result.of(results[n % len(results)]))

    start = time.perf_counter()
    record(1)
    one = max(time.perf_counter() - start, 1e-7)
    ops = max(1, int(budget / rounds / 4 / one))
    variants = {
        "floor": _per_op(floor, ops),
        "floor+": _per_op(floor_with_args_hash, ops),
        "fingerprints": _per_op(fingerprints, ops),
        "record": _per_op(record, ops),
    }
    samples = interleave(variants, rounds)
    stats = guard.stats
    if stats.blocks or stats.steers:
        raise RuntimeError("the benchmark's calls must be healthy (no steer, no block)")
    return samples


def peak_extra(function: Callable[[], object]) -> int:
    """Peak bytes allocated while `function` runs, above what was allocated before."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        function()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def memory_rows(scale: Scale) -> tuple[list[list[str]], Target]:
    """Peak extra memory of fingerprinting a 10 MB result (and large args, for context)."""
    size = 10 * MB
    result = text(size)
    session = LoopGuard().session("mem")

    def record() -> None:
        call = Call.of("read_file", SMALL_ARGS, id="mem")
        session.check_call(call)
        session.record_result(call, Result.of(result))

    args_size = MB if scale.quick else 10 * MB
    structured = records_args(args_size)
    a, r = size_text(args_size), size_text(size)
    measured = [
        (f"Result.of({r} text result)", peak_extra(lambda: Result.of(result)), size),
        (f"whole step with a {r} result", peak_extra(record), size),
        (f"floor: sha256(result.encode()), {r}", peak_extra(lambda: _sha(result)), size),
        (f"Call.of({a} structured args)", peak_extra(lambda: Call.of("t", structured)), args_size),
        (
            f"floor: canonical JSON of {a} structured args",
            peak_extra(lambda: canonical(structured)),
            args_size,
        ),
    ]
    rows = [[what, size_text(extra), f"{extra / base:.1%}"] for what, extra, base in measured]
    worst = max(measured[0][1], measured[1][1])
    target = Target(
        name=f"peak extra memory, {r} result",
        goal="well under the result's size (≤ 10%)",
        measured=f"{size_text(worst)} ({worst / size:.2%} of the result)",
        holds=worst <= size / 10,
    )
    return rows, target


def _sha(result: str) -> str:
    return hashlib.sha256(result.encode("utf-8")).hexdigest()


def run(scale: Scale) -> Section:
    section = Section(
        key="engine",
        title="Engine floor ratio",
        what=(
            "One healthy step through the engine (`Call.of` + `check_call` + `Result.of` +"
            " `record_result` on a `LoopGuard`'s session) against the floor: `json.dumps(args,"
            " sort_keys=True)` plus `hashlib.sha256(result.encode())`. *fingerprints* is"
            " `Call.of` + `Result.of` alone; *bookkeeping* is the rest of the step (the state"
            " transitions, the lock, the counters). *floor + args hash* adds the SHA-256 of the"
            " args' canonical JSON, which our design also computes (a fixed-size key for"
            " checkpoints) but the issue's floor does not include. Structured args are a"
            " table of small records (the worst case for a Python-level encoder); text args"
            " are one long string (e.g. a file write)."
        ),
        columns=[
            "payload",
            "step / floor",
            "step / (floor + args hash)",
            "fingerprints / floor",
            "floor (median)",
            "step (median)",
            "bookkeeping",
            "step IQR",
        ],
    )
    small_ratio: float | None = None
    large: list[tuple[str, float]] = []
    for name in scale.engine_sizes:
        rounds = 11 if name in ("small", "medium") else 5
        if scale.quick:
            rounds = 3
        for label, args, results in payloads(name):
            samples = measure(args, results, scale.engine_budget_s, rounds)
            floor = median(samples["floor"])
            step = median(samples["record"])
            prints = median(samples["fingerprints"])
            low, high = quartiles(samples["record"])
            section.rows.append(
                [
                    label,
                    ratio(step / floor),
                    ratio(step / median(samples["floor+"])),
                    ratio(prints / floor),
                    us(floor),
                    us(step),
                    us(step - prints) if step > prints else "≈ 0 (noise)",
                    f"{us(low)} … {us(high)}",
                ]
            )
            if name == "small":
                small_ratio = step / floor
            elif name in ("1MB", "10MB"):
                large.append((label, step / floor))
    section.targets.append(Target.at_most("small payload step vs floor", 3.0, small_ratio))
    for label, value in large:
        section.targets.append(Target.at_most(f"large payload step vs floor, {label}", 1.2, value))
    rows, target = memory_rows(scale)
    section.extra_tables.append(
        (
            "Peak extra memory (tracemalloc) while fingerprinting:",
            ["what", "peak extra", "of payload"],
            rows,
        )
    )
    section.targets.append(target)
    section.notes.append(
        "Each row interleaves floor, fingerprints and step in one run; medians of"
        f" {'3' if scale.quick else '11 (small, medium) or 5 (large)'} samples, each sample"
        " timing many operations. Results rotate over nine texts of the same size, so"
        " the steps are healthy (no steer, no block)."
    )
    return section
