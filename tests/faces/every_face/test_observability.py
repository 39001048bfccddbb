"""Every warning, block and stop is an event, a log record, a LangChain custom event and a count."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopCost, LoopGuard, LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, capture_events, stubborn
from tests.support.agents import (
    READ_NOTES,
    ToolRuns,
    ask,
    build_graph,
    make_tools,
    needs_async_context,
)

KINDS = ["steer", "block", "block", "block", "stop"]


class CustomEvents(BaseCallbackHandler):
    """Collects custom events the way a tracer receives them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data))


def agent_with_middleware(middleware: LoopGuardMiddleware) -> Any:
    return create_agent(
        ScriptedChatModel(script=stubborn(READ_NOTES)),
        make_tools(ToolRuns()),
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )


def graph_with_node(guard: LoopGuard) -> Any:
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    return build_graph(model, make_tools(ToolRuns()), guard, checkpointer=InMemorySaver())


async def custom_events_of(runnable: Any) -> list[dict[str, Any]]:
    # astream_events does not pick up create_agent's own recursion limit: set one.
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 200}
    return [
        event["data"]
        async for event in runnable.astream_events(ask(), config, version="v2")
        if event["event"] == "on_custom_event" and event["name"] == "loop_guard"
    ]


@needs_async_context
@pytest.mark.parametrize("face", ["middleware", "graph"])
def test_events_appear_in_astream_events(face: str) -> None:
    """astream_events(version="v2") shows each decision as a `loop_guard` custom event."""
    runnable = (
        agent_with_middleware(LoopGuardMiddleware()) if face == "middleware"
        else graph_with_node(LoopGuard())
    )  # fmt: skip
    events = asyncio.run(custom_events_of(runnable))
    assert [e["kind"] for e in events] == KINDS
    assert events[0]["tool"] == "read_file"
    assert events[0]["args"] == {"path": "notes.md"}
    assert events[-1]["cost"]["model_calls"] == 6  # what the loop cost, at the stop
    assert events[-1]["cost"]["tool_runs_saved"] == 3
    assert events[0]["conversation"] == "t"
    assert events[-1]["message"].startswith("Stopped by loop_guard")


def test_events_reach_callback_handlers_in_sync_runs() -> None:
    """A tracer attached as a callback receives the same custom events on invoke."""
    tracer = CustomEvents()
    graph = graph_with_node(LoopGuard())
    graph.invoke(ask(), {"configurable": {"thread_id": "t"}, "callbacks": [tracer]})
    assert [(name, data["kind"]) for name, data in tracer.events] == [
        ("loop_guard", kind) for kind in KINDS
    ]


def test_on_event_log_and_custom_event_agree(caplog: pytest.LogCaptureFixture) -> None:
    """The three channels carry the same events in the same order."""
    caplog.set_level(logging.INFO, logger="loop_guard")
    received: list[GuardEvent] = []
    tracer = CustomEvents()
    agent = agent_with_middleware(LoopGuardMiddleware(on_event=received.append))
    agent.invoke(ask(), {"configurable": {"thread_id": "t"}, "callbacks": [tracer]})
    logged = [r.loop_guard_event for r in caplog.records if hasattr(r, "loop_guard_event")]
    assert [e.kind for e in received] == KINDS
    assert logged == received
    assert [data["message"] for _, data in tracer.events] == [e.message for e in received]
    levels = [r.levelno for r in caplog.records if hasattr(r, "loop_guard_event")]
    assert levels == [logging.INFO] * 4 + [logging.WARNING]


def test_counters_through_the_middleware() -> None:
    """The middleware's guard counts calls, steers, blocks and stops, per tool too."""
    middleware = LoopGuardMiddleware()
    agent = agent_with_middleware(middleware)
    for thread in ("a", "b"):
        agent.invoke(ask(), {"configurable": {"thread_id": thread}})
    stats = middleware.guard.stats
    assert (stats.calls, stats.steers, stats.blocks, stats.stops) == (14, 2, 6, 2)
    # Per thread: the repeats 2 and 3 are charged at the steer, run 4 as it comes; each
    # of the 3 blocked responses is a model call spent and a tool run saved.
    cost = LoopCost(model_calls=12, tool_runs=6, tool_runs_saved=6)
    assert stats.cost == cost
    assert stats.by_tool == {
        "read_file": {
            "calls": 14,
            "steers": 2,
            "blocks": 6,
            "stops": 2,
            "errors": 0,
            "judgments": 0,
            "judge_tokens": 0,
            **dataclasses.asdict(cost),
        }
    }


def test_counters_through_the_graph() -> None:
    """Calls checked by wrappers and the node are counted once each."""
    guard = LoopGuard()
    graph_with_node(guard).invoke(ask(), {"configurable": {"thread_id": "t"}})
    stats = guard.stats
    assert (stats.steers, stats.blocks, stats.stops) == (1, 3, 1)
    assert stats.calls >= 7


@pytest.mark.internals(reason="the custom-event sink itself")
def test_the_engine_alone_dispatches_nothing_and_does_not_fail() -> None:
    """Outside a LangChain run there is no custom event to dispatch; nothing breaks."""
    from loop_guard import Call, Result
    from loop_guard._langchain_sink import dispatch_event

    guard = LoopGuard(warn_threshold=1, block_threshold=2)
    guard.subscribe(dispatch_event)
    call = Call.of("ls", {})
    guard.session("t").check_call(call)
    guard.session("t").record_result(call, Result.of("x"))
    assert guard.stats.steers == 1


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_capture_events_collects_what_a_run_publishes_and_only_inside_the_block(
    mode: str,
) -> None:
    """`capture_events` sees each event of a real run in order, sync and async, and lets go."""
    middleware = LoopGuardMiddleware()
    agent = agent_with_middleware(middleware)
    config = {"configurable": {"thread_id": "t"}}
    with capture_events(middleware.guard) as events:
        if mode == "invoke":
            agent.invoke(ask(), config)
        else:
            asyncio.run(agent.ainvoke(ask(), config))
    assert [event.kind for event in events] == KINDS
    assert {event.tool for event in events} == {"read_file"}
    agent.invoke(ask(), {"configurable": {"thread_id": "other"}})
    assert len(events) == len(KINDS)  # unsubscribed: the second run is not in the list


def by_conversation(events: list[GuardEvent]) -> dict[str, list[GuardEvent]]:
    """`events` grouped by conversation, each group in the order of the list."""
    groups: dict[str, list[GuardEvent]] = {}
    for event in events:
        groups.setdefault(event.conversation, []).append(event)
    return groups


def test_capture_events_from_several_threads_and_beside_on_event() -> None:
    """Runs on four threads at once all land in the list; the guard's own sink keeps working."""
    received: list[GuardEvent] = []
    middleware = LoopGuardMiddleware(on_event=received.append)
    agent = agent_with_middleware(middleware)

    def one_run(thread: str) -> None:
        agent.invoke(ask(), {"configurable": {"thread_id": thread}})

    with capture_events(middleware.guard) as events:
        workers = [threading.Thread(target=one_run, args=(f"t{n}",)) for n in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert sorted(event.kind for event in events) == sorted(KINDS * 4)
    # Sinks run outside the guard's lock, so two threads' events may interleave differently
    # in the two lists; each conversation's events reach both in the order published.
    assert by_conversation(events) == by_conversation(received)
    assert all([event.kind for event in run] == KINDS for run in by_conversation(events).values())
    with capture_events(middleware.guard) as inner, capture_events(middleware.guard) as outer:
        one_run("nested")
    assert [event.kind for event in inner] == [event.kind for event in outer] == KINDS
