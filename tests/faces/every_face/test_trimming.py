"""A history trimmed before every model call, paused for approval at every tool step.

A trimming node removes all but the latest messages (`RemoveMessage`) before each model
call, so the thread loses the request's user message and its early steps; the graph
pauses before its tools (`interrupt_before`) and is resumed with `invoke(None)`. The
guard must still steer, block and stop the stuck call as in one uninterrupted run: the
handler keeps a thread's state across its runs, and a new guard (a fresh worker on the
same checkpointer) catches up from the state the guarded tools recorded in their results.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardNode,
    LoopGuardStop,
    guard_tools,
)
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support import slow_except
from tests.support.agents import ToolRuns, ask, assert_valid_history, final_stop, make_tools

Face = Literal["node", "handler"]
KEPT = 3  # messages a trim keeps, at least: the latest response and its answers
STOPPED = ["steer", "block", "block", "block", "stop"]
CONFIG: dict[str, Any] = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}


Cut = Literal["start", "middle"]


def trimmer(cut: Cut) -> Any:
    """A node that removes every message before the response that begins the last
    `KEPT` ones: the user's message too (`"start"`), or all but it (`"middle"`)."""

    def trim(state: MessagesState) -> dict[str, Any]:
        messages = state["messages"]
        first = 1 if cut == "middle" else 0
        keep = max(len(messages) - KEPT, first)
        while keep > first and not isinstance(messages[keep], AIMessage):
            keep -= 1  # never part a response from its answers
        return {"messages": [RemoveMessage(id=m.id) for m in messages[first:keep] if m.id]}

    return trim


def trimmed_graph(face: Face, cut: Cut, guard: LoopGuard, runs: ToolRuns, checkpointer: Any) -> Any:
    """trim -> model -> tools (paused before) -> [LoopGuardNode ->] trim."""
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    builder = StateGraph(MessagesState)
    builder.add_node("trim", trimmer(cut))
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode(guard_tools(make_tools(runs), guard)))
    builder.add_edge(START, "trim")
    builder.add_edge("trim", "model")
    builder.add_conditional_edges("model", tools_condition)
    if face == "node":
        node = LoopGuardNode(guard, next_node="trim")
        builder.add_node("loop_guard", node, destinations=("trim", END))
        builder.add_edge("tools", "loop_guard")
    else:
        builder.add_edge("tools", "trim")
    return builder.compile(checkpointer=checkpointer, interrupt_before=["tools"])


def approve_every_step(
    face: Face, cut: Cut, *, fresh_worker: bool, asynchronous: bool
) -> tuple[list[BaseMessage] | LoopGuardStop, ToolRuns, list[str]]:
    """Run the request to its end, approving every tool step; with `fresh_worker`, each
    step runs on a new guard (a new process). The outcome, the tool runs, the events."""
    runs, checkpointer = ToolRuns(), InMemorySaver()
    events: list[GuardEvent] = []
    guard = LoopGuard(on_event=events.append)
    payload: Any = ask()
    for _ in range(40):
        if fresh_worker:
            guard = LoopGuard(on_event=events.append)
        graph = trimmed_graph(face, cut, guard, runs, checkpointer)
        config = dict(CONFIG)
        if face == "handler":
            config["callbacks"] = [LoopGuardCallbackHandler(guard)]
        try:
            if asynchronous:
                asyncio.run(graph.ainvoke(payload, config))
            else:
                graph.invoke(payload, config)
        except LoopGuardStop as stop:
            return stop, runs, [event.kind for event in events]
        payload = None
        if not graph.get_state(CONFIG).next:
            break
    messages = list(graph.get_state(CONFIG).values["messages"])
    return messages, runs, [event.kind for event in events]


# Each face, cut and worker in the quick suite (four runs); every combination in the whole.
QUICK_RUNS = {("start", "node", False, False), ("middle", "node", True, True)}
QUICK_RUNS |= {("middle", "handler", False, True), ("start", "handler", True, False)}


@pytest.mark.parametrize(
    ("cut", "face", "fresh_worker", "asynchronous"),
    slow_except(
        itertools.product(["start", "middle"], ["node", "handler"], [False, True], [False, True]),
        lambda run: run in QUICK_RUNS,
    ),
)
def test_a_trimmed_history_with_approval_pauses_is_stopped_as_one_run(
    cut: Cut, face: Face, fresh_worker: bool, asynchronous: bool
) -> None:
    """Steered at the 3rd run, blocked three times, stopped: 4 runs of the stuck call,
    as in one uninterrupted run, never a loop with a steer every time and no stop."""
    outcome, runs, events = approve_every_step(
        face, cut, fresh_worker=fresh_worker, asynchronous=asynchronous
    )
    assert runs.counts["read_file"] == 4
    assert events == STOPPED
    if face == "handler":
        assert isinstance(outcome, LoopGuardStop)  # before the next model call
        return
    assert not isinstance(outcome, LoopGuardStop)
    stop = final_stop(outcome)
    assert stop is not None
    assert "Stopped by loop_guard" in str(stop.content)
    assert_valid_history(outcome)


@pytest.mark.internals(reason="how a face finds a conversation's session from its history")
@pytest.mark.parametrize(
    "record",
    [{"request_id": None, "recent": [[1]]}, {"request_id": None, "streak": "many"}, "text"],
)
def test_a_record_that_does_not_parse_is_passed_over(record: Any) -> None:
    """A hand-written or foreign record never crashes the agent: the history is replayed
    as if it were not there."""
    from langchain_core.messages import ToolMessage

    from loop_guard._conversation import ConversationKey, session_for

    STATE_KEY = "loop_guard_state"  # docs/deploying.md: the record in `response_metadata`

    def history(metadata: dict[str, Any]) -> list[BaseMessage]:
        call = {"name": "ls", "args": {}, "id": "call_0"}
        answer = ToolMessage("empty", tool_call_id="call_0", id="r1", response_metadata=metadata)
        return [AIMessage("", id="a1", tool_calls=[call]), answer]

    def rebuilt(messages: list[BaseMessage]) -> dict[str, Any]:
        return session_for(LoopGuard(), ConversationKey("thread", "t"), messages).snapshot()

    replayed = rebuilt(history({}))
    assert replayed["settled"] or replayed["batch"]  # the step is known
    assert rebuilt(history({STATE_KEY: record})) == replayed
