"""Scaling: the guard's per-step cost as a request and a thread grow, and as a batch widens.

The guard's own CPU time per model step is measured in situ (`_agents`' stopwatch, on
the guard's public seams), in a short request, in a long one, and in a short request on
top of many earlier messages of the same thread. The long request is judged by its
*last* steps, where any per-step rescan of the request would show most.

Then `dedupe_siblings`: a response of many parallel calls of the same shape (same tool,
same ~1.5 KB content, another path each) through `guard_tools` in a `ToolNode`, against
as many responses of one such call each. Each call looks at its siblings; the batch must
cost about what the single calls cost (linear), not a multiple of the width.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from _agents import (
    Meter,
    Scripted,
    TimedHandler,
    TimedMiddleware,
    Toolbox,
    agent_with,
    ask,
    config_for,
    earlier_history,
    earlier_steps,
    graph_with,
    healthy,
    interventions,
    run_invoke,
    set_meter,
)
from _harness import Scale, Section, Target, interleave, median, quartiles, ratio, us

from loop_guard import LoopGuard

_threads = itertools.count(1)

KINDS = {
    "middleware": "create_agent + LoopGuardMiddleware",
    "graph": "graph: node + wrapped tools + handler",
}
REQUEST_KIND = "graph without a thread: node + wrapped tools"
"""Outside a thread, the graph's request is known by its user message."""


def run_case(
    kind: str, steps: int, history: int, *, done: int = 0
) -> tuple[list[float], float, str]:
    """One guarded run: per-step guard CPU (steps 1..steps), wall time, health.

    `kind` is a key of `KINDS`, or `"request"` (`REQUEST_KIND`, no thread, no handler);
    `done` steps of the request come in its input, before the `steps` it makes.
    """
    meter = Meter()
    box = Toolbox()
    script = healthy(steps, meter)
    callbacks: list[Any] = []
    if kind == "middleware":
        runnable = agent_with(script, box, [TimedMiddleware()])
    else:
        guard = LoopGuard()
        runnable = graph_with(script, box, guard)
        if kind == "graph":
            callbacks = [TimedHandler(guard)]
    payload = ask(history=earlier_history(history))
    payload["messages"] += earlier_steps(done)
    thread = None if kind == "request" else f"s{next(_threads)}"
    config = config_for(thread, limit=10 * steps + 100, callbacks=callbacks)
    set_meter(meter)
    try:
        start = time.perf_counter()
        messages, ended = run_invoke(runnable, payload, config)
        wall = time.perf_counter() - start
    finally:
        set_meter(None)
    asked = history + 1  # the earlier requests and this one's user message
    made = [*messages[history:asked], *messages[asked + 2 * done :]]
    wrong = interventions(made, box, script) if messages else 1
    health = "ok" if ended == "completed" and not wrong else f"{ended}, {wrong} interventions"
    return meter.steps(1, steps + 1), wall, health


BATCH_CONTENT = (
    "def handler(event, context):\n    return {'status': 200, 'body': event['body']}\n" * 20
)[:1500]
"""The content every call of a batch writes: the calls differ only in their path, so their
canonical args share a 1.5 KB prefix (the worst case for comparing them)."""


def batch_calls(width: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("write_file", {"path": f"out/part-{i:04d}.txt", "content": BATCH_CONTENT})
        for i in range(width)
    ]


def batch_case(width: int, *, batched: bool) -> tuple[float, str]:
    """Guard CPU of `width` calls, in one response (`batched`) or in one response each,
    through `guard_tools(..., LoopGuard(dedupe_siblings=True))` in a `ToolNode`."""
    meter = Meter()
    box = Toolbox()
    calls = batch_calls(width)
    if batched:
        script = Scripted(lambda turn: calls if turn == 0 else None, meter)
    else:
        script = Scripted(lambda turn: [calls[turn]] if turn < width else None, meter)
    guard = LoopGuard(dedupe_siblings=True)
    graph = graph_with(script, box, guard, node=False, tools=[box.writer()])
    config = config_for(f"b{next(_threads)}", limit=4 * width + 20)
    set_meter(meter)
    try:
        messages, ended = run_invoke(graph, ask(), config)
    finally:
        set_meter(None)
    wrong = interventions(messages, box, script) if messages else 1
    ran = box.runs["write_file"]
    health = "ok"
    if ended != "completed" or wrong or ran != width:
        health = f"{ended}, {wrong} interventions, {ran} of {width} calls ran"
    return sum(meter.per_step.values()), health


def batch_rows(scale: Scale, section: Section) -> None:
    """`dedupe_siblings` at width N: one response of N calls against N responses of one."""
    width, rounds = scale.batch_width, scale.batch_rounds
    health: list[str] = []

    def variant(*, batched: bool) -> Callable[[], float]:
        def sample() -> float:
            cpu, state = batch_case(width, batched=batched)
            health.append(state)
            return cpu

        return sample

    samples = interleave(
        {"batch": variant(batched=True), "singles": variant(batched=False)}, rounds
    )
    ratios = [b / s for b, s in zip(samples["batch"], samples["singles"], strict=True)]
    value = median(ratios)
    low, high = quartiles(ratios)
    batch, singles = median(samples["batch"]), median(samples["singles"])
    section.extra_tables.append(
        (
            f"`dedupe_siblings`: {width} parallel calls of one shape (~1.5 KB args each)"
            " through `guard_tools` in a `ToolNode`, guard CPU in situ (median of"
            f" {rounds} runs each, interleaved):",
            ["case", "guard CPU, all calls", "per call", "vs the single calls"],
            [
                [f"1 response of {width} calls", us(batch), us(batch / width), ratio(value)],
                [f"{width} responses of 1 call", us(singles), us(singles / width), "—"],
                ["ratio IQR (per round: batch / singles)", "", "", f"{ratio(low)} … {ratio(high)}"],
            ],
        )
    )
    section.targets.append(
        Target.at_most(
            f"dedupe_siblings, {width}-wide batch vs {width} single calls (guard CPU)", 2.0, value
        )
    )
    for problem in sorted({h for h in health if h != "ok"}):
        section.notes.append(f"**dedupe_siblings batch: run not healthy: {problem}.**")


def request_rows(scale: Scale, section: Section, reps: int) -> None:
    """The thread-less graph: a short request, and as many steps after a long request's
    earlier steps (one per two earlier messages of the *history* case)."""
    short, done = scale.short_steps, scale.history_messages // 2
    cases = {"short": 0, f"long request ({done:,} earlier steps)": done}
    results: dict[str, tuple[float, float]] = {}
    for case, earlier in cases.items():
        per_run, walls = [], []
        for _ in range(reps):
            per_step, wall, health = run_case("request", short, 0, done=earlier)
            if health != "ok":
                section.notes.append(f"**{REQUEST_KIND}, {case}: run not healthy: {health}.**")
            per_run.append(median(per_step))
            walls.append(wall / short)
        results[case] = (median(per_run), median(walls))
    base = results["short"][0]
    for case, (cpu, wall) in results.items():
        shown = "—" if case == "short" else ratio(cpu / base)
        section.rows.append([REQUEST_KIND, case, us(cpu), shown, us(wall)])
    case = f"long request ({done:,} earlier steps)"
    section.targets.append(
        Target.at_most(
            f"per-step guard cost, {case} vs short, {REQUEST_KIND}", 1.5, results[case][0] / base
        )
    )


def run(scale: Scale) -> Section:
    short, long, history = scale.short_steps, scale.long_steps, scale.history_messages
    reps = 1 if scale.quick else 3
    long_reps = 1 if scale.quick else 2
    section = Section(
        key="scaling",
        title="Scaling with history",
        what=(
            "The guard's own CPU time per model step, measured inside real runs (median"
            f" step; median of {reps} runs, {long_reps} for the long request). *short*: a"
            f" {short}-step request on a new thread. *long, last {short} steps*: the last"
            f" {short} steps of a {long}-step request. *history*: a {short}-step request"
            f" after {history:,} earlier messages on the same thread. *long request*"
            f" (without a thread): {short} steps of a request that has made"
            f" {history // 2:,} steps already (given in its input). *wall / step* is the"
            " whole run's wall time per step (framework included), for context."
        ),
        columns=[
            "integration",
            "case",
            "guard CPU / step",
            "vs short",
            "wall / step",
        ],
    )
    for kind, label in KINDS.items():
        cases = {
            "short": (short, 0, reps),
            f"long ({long} steps), all steps": (long, 0, long_reps),
            f"history ({history:,} earlier messages)": (short, history, reps),
        }
        results: dict[str, tuple[float, float]] = {}
        last_steps: list[float] = []
        for case, (steps, earlier, count) in cases.items():
            per_run, walls = [], []
            for _ in range(count):
                per_step, wall, health = run_case(kind, steps, earlier)
                if health != "ok":
                    section.notes.append(f"**{label}, {case}: run not healthy: {health}.**")
                per_run.append(median(per_step))
                walls.append(wall / steps)
                if steps == long:
                    last_steps.append(median(per_step[-short:]))
            results[case] = (median(per_run), median(walls))
        results[f"long, last {short} steps"] = (
            median(last_steps),
            results[f"long ({long} steps), all steps"][1],
        )
        base = results["short"][0]
        order = ["short", f"long ({long} steps), all steps", f"long, last {short} steps"]
        order.append(f"history ({history:,} earlier messages)")
        for case in order:
            cpu, wall = results[case]
            section.rows.append(
                [label, case, us(cpu), "—" if case == "short" else ratio(cpu / base), us(wall)]
            )
        for case in (f"long, last {short} steps", f"history ({history:,} earlier messages)"):
            value = results[case][0] / base
            limit = 1.5 if case.startswith("long") else 2.0  # 800 vs 100 steps: flat
            section.targets.append(
                Target.at_most(f"per-step guard cost, {case} vs short, {label}", limit, value)
            )
    request_rows(scale, section, reps)
    batch_rows(scale, section)
    section.notes.append(
        "History is passed in the request's input, not through a checkpointer, so the"
        " framework's own checkpoint cost does not blur the guard's."
    )
    section.notes.append(
        "The batches: the calls run in `ToolNode`'s thread pool, each guarded tool's CPU"
        " counted on its own thread and summed; a call waiting for a lock or for a sibling"
        " uses no CPU and is not counted. No `LoopGuardNode` and no handler: `guard_tools`"
        " alone, as the target asks."
    )
    return section
