"""The conversation memory the detectors keep across requests, through every face: live,
after the handler freed the thread, and in a fresh guard on the same checkpoints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import (
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardStop,
)
from loop_guard.testing import ScriptedChatModel, sequence
from tests.support.agents import (
    Mode,
    assert_valid_history,
    build_graph,
    final_stop,
    guarded_agent,
    run,
)

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
    return guarded_agent(
        "middleware", model, tools(), on_event=events.append, checkpointer=checkpointer
    )


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
    # As its own message (the middleware; the node once it served the thread), or in the
    # tool result (a node not yet seen by this new process, beside the handler).
    delivered = [
        str(m.content)
        for m in messages["messages"]
        if m.name == "loop_guard" or m.response_metadata.get("loop_guard") == "steer"
    ]
    assert len(delivered) == 1
    assert "in 3 of your last turns" in delivered[0]


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
    assert [(e.kind, e.reason) for e in events] == [("steer", "interleaved")]


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


# both shapes stopped through every face, sync and async -----------------------

ROADMAP = ("read_file", {"path": "ROADMAP.md"})


def broken_tools(runs: Counter[str]) -> list[BaseTool]:
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        runs["read_file"] += 1
        raise ToolException(f"ENOENT: no such file or directory, open '{path}'")

    @tool
    def grep(query: str) -> str:
        """Search the code base."""
        runs["grep"] += 1
        return f"{len(query)} matches for {query}"

    @tool
    def lookup(query: str) -> str:
        """Look a course up."""
        runs["lookup"] += 1
        raise ToolException("'str' object has no attribute 'get'")

    read_file.handle_tool_error = True
    lookup.handle_tool_error = True
    return [read_file, grep, lookup]


SHAPES = {
    # A failing read between distinct diagnostics: at most 10 reads run, then stopped.
    "interleaved": [
        turn for n in range(20) for turn in ([ROADMAP], [("grep", {"query": f"roadmap-{n}"})])
    ],
    # One broken tool, asked for different things in irregular order.
    "same error": [
        [("lookup", {"query": q})] for q in ("Machine Learning", "ML", "C1005", "ML") * 7
    ],
}


def run_face(face: str, turns: list[Any], mode: Mode) -> tuple[Any, Counter[str]]:
    """The final messages (or the `LoopGuardStop` that ended the run) and the tool runs."""
    runs: Counter[str] = Counter()
    model = ScriptedChatModel(script=sequence(*turns))
    config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": 200}
    # "wrapper+handler": the wrapper and the handler, no node; the handler blocks the next
    # model call
    faces = {"middleware": "middleware", "node": "graph", "wrapper+handler": "handler"}
    agent, extra = guarded_agent(faces[face], model, broken_tools(runs))
    config.update(extra)
    try:
        return run(agent, {"messages": [HumanMessage("find the roadmap")]}, config, mode), runs
    except LoopGuardStop as abort:
        return abort, runs


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("face", ["middleware", "node", "wrapper+handler"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_both_loop_shapes_are_stopped_through_every_face(shape: str, face: str, mode: Mode) -> None:
    outcome, runs = run_face(face, SHAPES[shape], mode)
    if shape == "interleaved":
        assert runs["read_file"] <= 10, runs
    else:
        assert runs["lookup"] <= 5, runs
    if face == "wrapper+handler":
        assert isinstance(outcome, LoopGuardStop), outcome
        assert "Stopped by loop_guard" in str(outcome)
        return
    assert_valid_history(outcome)
    stop = final_stop(outcome)
    assert stop is not None
    assert "Stopped by loop_guard" in str(stop.content)


def guarded(face: str, turns: list[Any], runs: Counter[str], events: list[GuardEvent],
            checkpointer: Any, pause: list[str] | None) -> Any:  # fmt: skip
    """A new agent with a new guard (middleware or node) on a shared checkpointer."""
    model = ScriptedChatModel(script=sequence(*turns))
    agent, _ = guarded_agent(
        "graph" if face == "node" else face,
        model,
        broken_tools(runs),
        on_event=events.append,
        checkpointer=checkpointer,
        interrupt_before=pause,
    )
    return agent


@pytest.mark.parametrize("face", ["middleware", "node"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_fresh_guard_at_every_step_decides_as_one_uninterrupted_run(
    shape: str, face: str
) -> None:
    """The backstop's counts and a broken tool are rebuilt from the checkpoint (the
    middleware's state) or the history (the node's): a new guard before every tool
    step, as when each step lands on another worker, changes no decision."""
    outcomes = []
    for pause in (None, ["tools"]):
        runs: Counter[str] = Counter()
        events: list[GuardEvent] = []
        checkpointer = InMemorySaver()
        config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": 200}
        payload: Any = {"messages": [HumanMessage("find the roadmap")]}
        guards = 0
        while True:  # paused: one new guard per tool step
            agent = guarded(face, SHAPES[shape], runs, events, checkpointer, pause)
            guards += 1
            result = agent.invoke(payload, config)
            if not agent.get_state(config).next:
                break
            payload = None
        outcomes.append(([(e.kind, e.reason) for e in events], dict(runs), result, guards))
    (live_events, live_runs, live, _), (events, runs, resumed, guards) = outcomes
    assert guards >= 5  # a new guard at every tool step
    assert events == live_events
    assert runs == live_runs
    assert [m.content for m in resumed["messages"]] == [m.content for m in live["messages"]]
    assert live_events[-1] == ("stop", "abort_threshold")
