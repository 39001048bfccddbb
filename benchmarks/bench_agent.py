"""2. Agent overhead: a healthy scripted run with and without the guard, beside the peer.

A `create_agent` run of N distinct tool calls (an instant scripted model), with no
middleware, with `LoopGuardMiddleware`, with LangChain's `ToolCallLimitMiddleware`
(limits set high, so it only counts: the built-in peer doing comparable bookkeeping),
and with a do-nothing middleware that has the same hooks as ours (the price of the
hooks alone). Then the hand-built graph: without a guard, with the node and the wrapped
tools, and with the node, the wrapped tools and the callback handler.

What a guard *adds* is measured per round (variant minus the unguarded run of the same
round), in wall time and in process CPU time, and the median over rounds is taken. The
guard's own CPU time inside the run is measured too, through its public seams (see
`_agents`' stopwatch), which is far less noisy than either difference.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from _agents import (
    Meter,
    Scripted,
    TimedCalibration,
    TimedHandler,
    TimedMiddleware,
    TimedNullAfterModel,
    TimedNullHooks,
    TimedToolCallLimit,
    Toolbox,
    agent_with,
    ask,
    config_for,
    graph_with,
    healthy,
    interventions,
    run_invoke,
    set_meter,
)
from _harness import (
    Scale,
    Section,
    Target,
    interleave,
    median,
    paired_added,
    quartiles,
    ratio,
    us,
)

from loop_guard import LoopGuard

_threads = itertools.count(1)

_CALIBRATION = 100  # small functions the calibration middleware calls per model step
_CALIBRATION_DISTINCT = (
    f"agent: do-nothing middleware + {_CALIBRATION} distinct small functions per step"
)
_CALIBRATION_SAME = f"agent: do-nothing middleware + 1 small function x{_CALIBRATION} per step"

_NULL_NODE = "graph: do-nothing node after the tools, no guard"


Build = Callable[[Scripted, Toolbox], tuple[Any, list[Any]]]
"""Builds the runnable for a script and a toolbox; returns it and the run's callbacks."""


class Variant:
    """One way of running the healthy agent; each call builds it afresh and times a run."""

    def __init__(self, name: str, build: Build, steps: int) -> None:
        self.name = name
        self.build = build
        self.steps = steps
        self.guard_cpu: list[float] = []  # median guard CPU per step, one per run
        self.process_cpu: list[float] = []  # the whole run's process CPU time, one per run
        self.problems: list[str] = []

    def __call__(self) -> float:
        meter = Meter()
        box = Toolbox()
        script = healthy(self.steps, meter)
        runnable, callbacks = self.build(script, box)
        config = config_for(f"t{next(_threads)}", limit=100_000, callbacks=callbacks)
        set_meter(meter)
        try:
            cpu = time.process_time()
            start = time.perf_counter()
            messages, ended = run_invoke(runnable, ask(), config)
            elapsed = time.perf_counter() - start
            self.process_cpu.append(time.process_time() - cpu)
        finally:
            set_meter(None)
        wrong = interventions(messages, box, script)
        if ended != "completed" or wrong:
            self.problems.append(f"{ended}, {wrong} interventions")
        self.guard_cpu.append(median(meter.steps(1, self.steps + 1)))
        return elapsed


def _agent(middleware: Callable[[], list[Any]]) -> Build:
    return lambda script, box: (agent_with(script, box, middleware()), [])


def _graph(*, guarded: bool, handler: bool, null_node: bool = False) -> Build:
    def build(script: Scripted, box: Toolbox) -> tuple[Any, list[Any]]:
        guard = LoopGuard() if guarded else None
        callbacks = [TimedHandler(guard)] if handler and guard is not None else []
        return graph_with(script, box, guard, null_node=null_node), callbacks

    return build


def variants(steps: int) -> list[Variant]:
    high = 10_000_000
    builds: dict[str, Build] = {
        "agent: no middleware": _agent(list),
        "agent: LoopGuardMiddleware": _agent(lambda: [TimedMiddleware()]),
        "agent: ToolCallLimitMiddleware (peer)": _agent(
            lambda: [TimedToolCallLimit(run_limit=high, thread_limit=high)]
        ),
        "agent: do-nothing middleware, our hooks": _agent(lambda: [TimedNullHooks()]),
        "agent: do-nothing middleware, the peer's 1 hook": _agent(lambda: [TimedNullAfterModel()]),
        _CALIBRATION_DISTINCT: _agent(lambda: [TimedCalibration(_CALIBRATION, distinct=True)]),
        _CALIBRATION_SAME: _agent(lambda: [TimedCalibration(_CALIBRATION, distinct=False)]),
        "graph: no guard": _graph(guarded=False, handler=False),
        _NULL_NODE: _graph(guarded=False, handler=False, null_node=True),
        "graph: node + wrapped tools": _graph(guarded=True, handler=False),
        "graph: node + wrapped tools + handler": _graph(guarded=True, handler=True),
    }
    return [Variant(name, build, steps) for name, build in builds.items()]


def run(scale: Scale) -> Section:
    steps = scale.agent_steps
    rounds = scale.agent_rounds
    runs = variants(steps)
    by_name = {v.name: v for v in runs}
    samples = interleave(dict(by_name), rounds)
    for variant in runs:  # the warm-up round's runs are not samples
        variant.guard_cpu = variant.guard_cpu[-rounds:]
        variant.process_cpu = variant.process_cpu[-rounds:]
    section = Section(
        key="2",
        title="2. Agent overhead",
        what=(
            f"A healthy {steps}-step scripted run (distinct calls, instant model, instant"
            " tools). *added / step* is the median over rounds of (this run - the unguarded"
            " run of the same round) / steps, in wall time; *vs peer* divides it by what"
            " `ToolCallLimitMiddleware` (limits set high) added. *added CPU / step* is the"
            " same difference in process CPU time (all threads), with its IQR: a black-box"
            " check of the next column. *guard CPU / step* is the guard's own code, timed"
            " inside the run through its public seams (median step): the hooks of the"
            " middleware less the `handler` they call on with; the node's `__call__`; the"
            " guarded tools' `invoke` less the tool they wrap; the handler's callbacks. The"
            " do-nothing middleware has the same hooks as ours and no code: its added time"
            " is what the hooks cost as graph nodes, before any guard work; the do-nothing"
            " node stands where `LoopGuardNode` does in the README's graph, likewise."
        ),
        columns=[
            "variant",
            "run (median)",
            "added / step",
            "added IQR",
            "vs peer",
            "added CPU / step (IQR)",
            "guard CPU / step",
        ],
    )
    base = {"agent": "agent: no middleware", "graph": "graph: no guard"}
    peer = "agent: ToolCallLimitMiddleware (peer)"
    peer_added = median(paired_added(samples, base["agent"], peer)) / steps
    added: dict[str, float] = {}
    for variant in runs:
        kind = variant.name.split(":", 1)[0]
        diffs = [d / steps for d in paired_added(samples, base[kind], variant.name)]
        added[variant.name] = median(diffs)
        low, high = quartiles(diffs)
        reference = by_name[base[kind]].process_cpu
        cpu_diffs = [
            (mine - theirs) / steps
            for mine, theirs in zip(variant.process_cpu, reference, strict=True)
        ]
        cpu_low, cpu_high = quartiles(cpu_diffs)
        is_base = variant.name in base.values()
        versus = "—"
        if not is_base:
            versus = ratio(added[variant.name] / peer_added) if peer_added > 0 else "n/a"
        section.rows.append(
            [
                variant.name,
                f"{median(samples[variant.name]):.3f} s",
                "—" if is_base else us(added[variant.name]),
                "—" if is_base else f"{us(low)} … {us(high)}",
                versus,
                "—" if is_base else f"{us(median(cpu_diffs))} ({us(cpu_low)} … {us(cpu_high)})",
                us(median(variant.guard_cpu)) if median(variant.guard_cpu) > 0 else "—",
            ]
        )
        for problem in sorted(set(variant.problems)):
            section.notes.append(f"**{variant.name}: run not healthy: {problem}.**")

    def allowance(kind: str) -> float:
        """The issue's target: what the guard adds is at most 1.3x what the peer adds, plus
        5 points of the unguarded run (per step), so that run-to-run noise in a small
        difference cannot fail a guard that costs about what the peer costs."""
        return 1.3 * peer_added + 0.05 * median(samples[base[kind]]) / steps

    for name in (
        "agent: LoopGuardMiddleware",
        "graph: node + wrapped tools",
        "graph: node + wrapped tools + handler",
    ):
        allowed = allowance(name.split(":", 1)[0])
        value = added[name]
        section.targets.append(
            Target(
                name=f"added wall time vs ToolCallLimitMiddleware's, {name}",
                goal="≤ 1.3x the peer's + 5% of the run",
                measured=f"{us(value)} (allowed {us(allowed)}; {ratio(value / peer_added)})"
                if peer_added > 0
                else "peer added ≤ 0 (noise)",
                holds=value <= allowed if peer_added > 0 else None,
            )
        )
    for name, limit in (
        ("agent: LoopGuardMiddleware", 100e-6),
        ("graph: node + wrapped tools", 150e-6),
        ("graph: node + wrapped tools + handler", 150e-6),
    ):
        cpu = median(by_name[name].guard_cpu)
        section.targets.append(
            Target.at_most(f"guard CPU per healthy step, {name}", limit, cpu or None, unit="s")
        )
    ours = by_name["agent: LoopGuardMiddleware"]
    tcl = by_name[peer]
    ours_cpu, tcl_cpu = median(ours.guard_cpu), median(tcl.guard_cpu)
    null_added = added["agent: do-nothing middleware, our hooks"]
    null_one = added["agent: do-nothing middleware, the peer's 1 hook"]
    floor_ours = median(by_name["agent: do-nothing middleware, our hooks"].guard_cpu)
    floor_peer = median(by_name["agent: do-nothing middleware, the peer's 1 hook"].guard_cpu)
    section.extra_tables.append(
        (
            "Where our added time goes (create_agent, per step):",
            ["part", "ours", "ToolCallLimitMiddleware"],
            [
                [
                    "hook nodes per model step",
                    "0 (wrap_model_call, wrap_tool_call)",
                    "1 (after_model)",
                ],
                ["the hooks' own code (CPU, in situ)", us(ours_cpu), us(tcl_cpu)],
                [
                    "… of which the stopwatch's floor (the same hooks doing nothing)",
                    us(floor_ours),
                    us(floor_peer),
                ],
                ["the hook layout as do-nothing nodes (wall)", us(null_added), us(null_one)],
                [
                    "the rest (state channel, GC, noise)",
                    us(added["agent: LoopGuardMiddleware"] - null_added - ours_cpu),
                    us(peer_added - null_one - tcl_cpu),
                ],
                ["guard CPU, ours / peer", ratio(ours_cpu / tcl_cpu) if tcl_cpu else "—", ""],
            ],
        )
    )
    graph_allowed = allowance("graph")
    null_node = added[_NULL_NODE]
    node_floor = median(by_name[_NULL_NODE].guard_cpu)
    # Like the targets: an allowance from a peer that added nothing measurable is noise.
    allowance, share = "n/a (peer added ≤ 0)", "n/a"
    if peer_added > 0:
        allowance, share = us(graph_allowed), f"{null_node / graph_allowed:.0%}"
    section.extra_tables.append(
        (
            "Where the graph's added time goes (per step), against what the target allows:",
            ["part", "node + wrapped tools", "… + handler"],
            [
                ["the target's allowance (1.3x the peer's + 5% of the run)", allowance, ""],
                ["one more node after the tools, doing nothing (wall)", us(null_node), ""],
                ["… as a share of the allowance", share, ""],
                [
                    "the guard's own code (CPU, in situ)",
                    us(median(by_name["graph: node + wrapped tools"].guard_cpu)),
                    us(median(by_name["graph: node + wrapped tools + handler"].guard_cpu)),
                ],
                ["… of which the node's stopwatch floor (doing nothing)", us(node_floor), ""],
            ],
        )
    )
    distinct = median(by_name[_CALIBRATION_DISTINCT].guard_cpu) - floor_ours
    same = median(by_name[_CALIBRATION_SAME].guard_cpu) - floor_ours
    section.extra_tables.append(
        (
            "What Python costs in situ (the do-nothing hooks calling small functions,"
            " once per model step, less the floor):",
            ["calls per step", "CPU / step", "per call"],
            [
                [
                    f"{_CALIBRATION} distinct functions, once each",
                    us(distinct),
                    us(distinct / _CALIBRATION),
                ],
                [f"1 function, {_CALIBRATION} times", us(same), us(same / _CALIBRATION)],
            ],
        )
    )
    section.notes.append(
        f"{rounds} rounds, variants interleaved (order reversed every other round)"
        ", after one warm-up round. The wall-time and process-CPU differences are small"
        " against the run's noise (see the IQR columns); the in-situ column is the stable"
        " comparison. The graphs' `ToolNode`s carry the stopwatch's `wrap_tool_call`"
        " interceptor with or without a guard, so the unguarded graph pays for it too."
    )
    return section
