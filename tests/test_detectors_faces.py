"""The conversation memory the detectors keep across requests, through every face: live,
after the handler freed the thread, and in a fresh guard on the same checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopGuard, LoopGuardCallbackHandler, LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, sequence

from .agents import assert_valid_history, build_graph

BOOK = ("book", {"flight": "HAT030"})
SEARCH = ("search", {"route": "LAX-ORD"})
# tau-bench task 13's shape: a rejected booking comes back after each user reply.
REQUESTS = [[[BOOK]], [[BOOK], [SEARCH]], [[BOOK]]]


def tools() -> list[BaseTool]:
    @tool
    def book(flight: str) -> str:
        """Book a flight."""
        return f"Error: flight {flight} not available"

    @tool
    def search(route: str) -> str:
        """Search flights."""
        return "[]"

    return [book, search]


Face = Callable[[list[GuardEvent], int, Any], Any]


def middleware_face(events: list[GuardEvent], request: int, checkpointer: Any) -> Any:
    model = ScriptedChatModel(script=sequence(*REQUESTS[request]))
    guard = LoopGuardMiddleware(on_event=events.append)
    agent = create_agent(model, tools(), middleware=[guard], checkpointer=checkpointer)
    return agent, {}


def graph_face(events: list[GuardEvent], request: int, checkpointer: Any) -> Any:
    model = ScriptedChatModel(script=sequence(*REQUESTS[request]))
    guard = LoopGuard(on_event=events.append)
    graph = build_graph(model, tools(), guard, checkpointer=checkpointer)
    return graph, {"callbacks": [LoopGuardCallbackHandler(guard)]}


@pytest.mark.parametrize("face", [middleware_face, graph_face], ids=["middleware", "graph"])
def test_a_rejected_call_coming_back_after_user_replies_is_steered(face: Face) -> None:
    """Each request runs in a fresh guard (as after a restart) on the same checkpoints:
    the interleaved repeat is still found, in the third request."""
    checkpointer = InMemorySaver()
    per_request: list[list[str | None]] = []
    messages: Any = None
    for request in range(3):
        events: list[GuardEvent] = []
        agent, extra = face(events, request, checkpointer)
        config = {"configurable": {"thread_id": "t"}, **extra}
        messages = agent.invoke({"messages": [HumanMessage(f"try {request}")]}, config)
        per_request.append([event.reason for event in events])
    assert per_request == [[], [], ["interleaved"]]
    assert_valid_history(messages["messages"])
    steers = [m for m in messages["messages"] if m.name == "loop_guard"]
    assert len(steers) == 1
    assert "3 times within your last 8" in steers[0].content


def test_one_guard_live_and_a_fresh_guard_agree_for_the_handler() -> None:
    """The handler frees the thread after every run, so every request is rebuilt from
    the history; a guard kept alive throughout decides the same."""
    checkpointer = InMemorySaver()
    events: list[GuardEvent] = []
    guard = LoopGuard(on_event=events.append)
    for request in range(3):
        model = ScriptedChatModel(script=sequence(*REQUESTS[request]))
        graph = build_graph(model, tools(), guard, checkpointer=checkpointer)
        config = {
            "configurable": {"thread_id": "t"},
            "callbacks": [LoopGuardCallbackHandler(guard)],
        }
        graph.invoke({"messages": [HumanMessage(f"try {request}")]}, config)
    assert [(e.kind, e.reason) for e in events] == [("warn", "interleaved")]


def test_batches_that_count_no_step_do_not_shorten_the_rebuilt_memory() -> None:
    """Seven ignored calls between the rejected bookings: the rebuilt memory still holds
    the last counted steps, as the live state does, so both faces steer alike."""

    @tool
    def todo(item: str) -> str:
        """Note a to-do."""
        return "noted"

    def turns(request: int) -> list[Any]:
        notes = [[("todo", {"item": f"{request}-{n}"})] for n in range(7)]
        return [[BOOK], [("search", {"route": f"r{request}"})], *notes]

    reasons = {}
    for face in ("middleware", "graph"):
        checkpointer = InMemorySaver()
        events: list[GuardEvent] = []
        middleware = LoopGuardMiddleware(on_event=events.append, ignore_tools=["todo"])
        guard = LoopGuard(on_event=events.append, ignore_tools=["todo"])
        for request in range(3):
            model = ScriptedChatModel(script=sequence(*turns(request)))
            config: Any = {"configurable": {"thread_id": "t"}}
            if face == "middleware":
                agent = create_agent(
                    model, [*tools(), todo], middleware=[middleware], checkpointer=checkpointer
                )
            else:
                agent = build_graph(model, [*tools(), todo], guard, checkpointer=checkpointer)
                config["callbacks"] = [LoopGuardCallbackHandler(guard)]
            agent.invoke({"messages": [HumanMessage(f"try {request}")]}, config)
        reasons[face] = [event.reason for event in events]
    assert reasons["middleware"] == ["interleaved"]
    assert reasons["graph"] == reasons["middleware"]
