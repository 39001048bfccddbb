"""3. Scaling with history: the guard's per-step cost as a request and a thread grow.

The guard's own CPU time per model step is measured in situ (the `Timed*` classes), in
a short request, in a long one, and in a short request on top of many earlier
messages of the same thread. The long request is judged by its *last* steps, where
any per-step rescan of the request would show most.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from _agents import (
    Meter,
    TimedHandler,
    TimedMiddleware,
    Toolbox,
    agent_with,
    ask,
    config_for,
    earlier_history,
    graph_with,
    healthy,
    interventions,
    run_invoke,
    set_meter,
)
from _harness import Scale, Section, Target, median, ratio, us

from loop_guard import LoopGuard

_threads = itertools.count(1)

KINDS = {
    "middleware": "create_agent + LoopGuardMiddleware",
    "graph": "graph: node + wrapped tools + handler",
}


def run_case(kind: str, steps: int, history: int) -> tuple[list[float], float, str]:
    """One guarded run: per-step guard CPU (steps 1..steps), wall time, health."""
    meter = Meter()
    box = Toolbox()
    script = healthy(steps, meter)
    callbacks: list[Any] = []
    if kind == "middleware":
        runnable = agent_with(script, box, [TimedMiddleware()])
    else:
        guard = LoopGuard()
        runnable = graph_with(script, box, guard)
        callbacks = [TimedHandler(guard)]
    payload = ask(history=earlier_history(history))
    config = config_for(f"s{next(_threads)}", limit=10 * steps + 100, callbacks=callbacks)
    set_meter(meter)
    try:
        start = time.perf_counter()
        messages, ended = run_invoke(runnable, payload, config)
        wall = time.perf_counter() - start
    finally:
        set_meter(None)
    wrong = interventions(messages[history:], box, script) if messages else 1
    health = "ok" if ended == "completed" and not wrong else f"{ended}, {wrong} interventions"
    return meter.steps(1, steps + 1), wall, health


def run(scale: Scale) -> Section:
    short, long, history = scale.short_steps, scale.long_steps, scale.history_messages
    reps = 1 if scale.quick else 3
    long_reps = 1 if scale.quick else 2
    section = Section(
        key="3",
        title="3. Scaling with history",
        what=(
            "The guard's own CPU time per model step, measured inside real runs (median"
            f" step; median of {reps} runs, {long_reps} for the long request). *short*: a"
            f" {short}-step request on a new thread. *long, last {short} steps*: the last"
            f" {short} steps of a {long}-step request. *history*: a {short}-step request"
            f" after {history:,} earlier messages on the same thread. *wall / step* is the"
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
            section.targets.append(
                Target(
                    name=f"per-step guard cost, {case} vs short, {label}",
                    goal="≤ 2.0x",
                    measured=ratio(value),
                    holds=value <= 2.0,
                )
            )
    section.notes.append(
        "History is passed in the request's input, not through a checkpointer, so the"
        " framework's own checkpoint cost does not blur the guard's."
    )
    return section
