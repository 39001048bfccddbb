"""Many conversations through one guard: memory per active conversation, and leaks.

Part A drives the engine (`LoopGuard`) directly with 10,000 conversations and measures
with tracemalloc. Part B runs real agents through each integration, one conversation
per run, and measures what the guard objects still hold once every run has finished.
"""

from __future__ import annotations

import gc
import itertools
import tracemalloc
from collections.abc import Callable
from typing import Any

from _agents import Toolbox, agent_with, ask, config_for, graph_with, one_step, run_invoke
from _harness import Scale, Section, Target, deep_size, size_text

from loop_guard import Call, LoopGuard, LoopGuardCallbackHandler, LoopGuardMiddleware, Result

STEPS = 5  # healthy steps per conversation in part A
_threads = itertools.count(1)


def _traced(function: Callable[[], object]) -> int:
    """Bytes still allocated after `function` ran (and a full collection)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    function()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


def _converse(guard: LoopGuard, index: int, args_for: Callable[[int, int], Any]) -> str:
    conversation = f"thread-{index}"
    session = guard.session(conversation)
    session.start_request(f"request-{index}")
    for step in range(STEPS):
        call = Call.of("read_file", args_for(index, step), id=f"call-{index}-{step}")
        session.check_call(call)
        session.record_result(call, Result.of(f"OK contents of {index}/{step}"))
    return conversation


def _small(index: int, step: int) -> Any:
    return {"path": f"src/{index}/{step}.py", "limit": 200}


_BIG = "x" * (1024 * 1024)


def _big(index: int, step: int) -> Any:
    return {"path": f"out/{index}.txt", "content": f"{_BIG}{index}/{step}"}


def engine_part(count: int) -> tuple[list[list[str]], dict[str, float]]:
    rows: list[list[str]] = []
    found: dict[str, float] = {}
    tracemalloc.start()
    try:
        guard = LoopGuard()
        held = _traced(lambda: [_converse(guard, i, _small) for i in range(count)])
        found["per_active"] = held / count
        rows.append(
            [
                f"{count:,} conversations, {STEPS} steps each, all still held",
                size_text(held),
                size_text(held / count),
            ]
        )
        freed = _traced(lambda: [guard.session(f"thread-{i}").end_request() for i in range(count)])
        found["after_end"] = held + freed
        rows.append(
            [
                "… after `end_request` on each (run-scoped conversations)",
                size_text(held + freed),
                size_text((held + freed) / count),
            ]
        )
        capped = LoopGuard(max_conversations=count // 2)
        kept = _traced(lambda: [_converse(capped, i, _small) for i in range(count)])
        rows.append(
            [
                f"{count:,} conversations through a guard capped at {count // 2:,}",
                size_text(kept),
                f"{len(capped._conversations.states):,} held",
            ]
        )
        guard_big = LoopGuard()
        many = 10
        held_big = _traced(lambda: [_converse(guard_big, i, _big) for i in range(many)])
        found["per_active_big"] = held_big / many
        rows.append(
            [
                f"{many} conversations whose calls had 1 MB args (the caller keeps no copy)",
                size_text(held_big),
                size_text(held_big / many),
            ]
        )
    finally:
        tracemalloc.stop()
    return rows, found


def _held(guard: LoopGuard, handler: LoopGuardCallbackHandler | None) -> int:
    size = deep_size(guard._conversations.states)
    if handler is not None:
        size += deep_size(handler._runs, handler._tools, handler._claimed)
    return size


def agent_part(count: int) -> list[list[str]]:
    """Run `count` one-step conversations per integration; what do the guards still hold?"""
    rows: list[list[str]] = []
    for handler_on, thread in ((True, True), (True, False), (False, True), (False, False)):
        guard = LoopGuard()
        handler = LoopGuardCallbackHandler(guard) if handler_on else None
        callbacks = [handler] if handler is not None else []
        failures = 0
        graph = graph_with(
            one_step(), Toolbox(), guard, timed=False
        )  # compiled once, as in production
        for _ in range(count):
            thread_id = f"c{next(_threads)}" if thread else None
            config = config_for(thread_id, limit=50, callbacks=callbacks)
            failures += run_invoke(graph, ask(), config)[1] != "completed"
        gc.collect()
        held = _held(guard, handler)
        label = "graph: node + wrapped tools" + (" + handler" if handler_on else "")
        label += ", thread ids" if thread else ", no thread id"
        rows.append(
            [
                label,
                f"{len(guard._conversations.states):,}",
                size_text(held),
                size_text(held / count),
                f"{failures} failed" if failures else "ok",
            ]
        )
    middleware = LoopGuardMiddleware()
    failures = 0
    agent = agent_with(one_step(), Toolbox(), [middleware])
    for _ in range(count):
        failures += run_invoke(agent, ask(), config_for(f"c{next(_threads)}", limit=50))[1] != (
            "completed"
        )
    gc.collect()
    held = _held(middleware.guard, None)
    rows.append(
        [
            "create_agent + LoopGuardMiddleware, thread ids",
            f"{len(middleware.guard._conversations.states):,}",
            size_text(held),
            size_text(held / count),
            f"{failures} failed" if failures else "ok",
        ]
    )
    return rows


def run(scale: Scale) -> Section:
    count = scale.engine_conversations
    section = Section(
        key="conversations",
        title="Many conversations",
        what=(
            f"**A. The engine**: {count:,} conversations through one `LoopGuard` (tracemalloc,"
            " bytes still allocated after a full collection). **B. The integrations**:"
            f" {scale.agent_conversations:,} one-step runs through each, one conversation per"
            " run, then what the guard (and the handler) still hold once all have finished"
            " (deep size of their conversation tables)."
        ),
        columns=["A. engine", "retained", "per conversation"],
    )
    rows, found = engine_part(count)
    section.rows = rows
    agent_rows = agent_part(scale.agent_conversations)
    section.extra_tables.append(
        (
            f"B. After {scale.agent_conversations:,} finished one-step runs per integration:",
            ["integration", "conversations still held", "retained", "per run", "runs"],
            agent_rows,
        )
    )
    section.targets.append(
        Target(
            name="memory per active conversation (engine, small args)",
            goal="a few KB (≤ 4 KiB)",
            measured=size_text(found["per_active"]),
            holds=found["per_active"] <= 4096,
        )
    )
    section.targets.append(
        Target(
            name="memory retained after conversations end (engine, `end_request`)",
            goal="back to baseline (≤ 64 B per conversation)",
            measured=size_text(found["after_end"]),
            holds=found["after_end"] <= 64 * count,
        )
    )
    for row in agent_rows:
        section.targets.append(
            Target(
                name=f"memory retained after finished runs, {row[0]}",
                goal="back to baseline (no conversation held)",
                measured=f"{row[1]} of {scale.agent_conversations:,} held, {row[2]}",
                holds=row[1] == "0",
            )
        )
    section.notes.append(
        "Per active conversation the engine keeps the request's counters and its last two"
        " batches, whose calls still carry their args objects: with 1 MB args that is"
        f" {size_text(found['per_active_big'])} per conversation, held even after the"
        " caller dropped the args."
    )
    section.notes.append(
        "A guard is bounded by `max_conversations` (10,000 by default), so what it keeps"
        " stays capped; the cap row shows it."
    )
    return section
