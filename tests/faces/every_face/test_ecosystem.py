"""Attaching the guard the way LangChain users reach for it: the obvious graph
wiring, LangGraph's custom stream, whatever `create_agent` accepts as tools, loud
misconfiguration, and a quiet log on a stop."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardNode,
    LoopGuardStop,
    guard_tools,
)
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import ScriptedChatModel, obedient, stubborn
from tests.support.agents import (
    READ_NOTES,
    THREAD,
    Mode,
    ToolRuns,
    ask,
    assert_valid_history,
    final_stop,
    make_tools,
    run,
    steers,
)


def design_card_graph(
    model: Any, tools: list[Any], guard: LoopGuard, *, next_node: str = "model", **node: Any
) -> Any:
    """The README's wiring, with every default: `ToolNode(guard_tools(tools, guard))`."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode(guard_tools(tools, guard)))
    builder.add_node("loop_guard", LoopGuardNode(guard, next_node=next_node), **node)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "loop_guard")
    return builder.compile(checkpointer=InMemorySaver())


# The steer's delivery, with a node and without ----------------------------------------------------


def test_with_a_node_the_steer_is_a_message_of_its_own_by_default() -> None:
    """`guard_tools` with its defaults beside a `LoopGuardNode`: the node delivers the steer
    as a `HumanMessage`; the tool results stay what the tools returned."""
    guard = LoopGuard()
    model = ScriptedChatModel(script=obedient(READ_NOTES))
    graph = design_card_graph(model, make_tools(ToolRuns()), guard)
    messages = graph.invoke(ask(), THREAD)["messages"]
    assert len(steers(messages)) == 1
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert not any("LOOP GUARD" in str(m.content) for m in results)
    assert_valid_history(messages)


def test_without_a_node_the_steer_rides_on_the_tool_result() -> None:
    """The wrapper and the handler alone: the steer is appended to the 3rd result."""
    guard = LoopGuard()
    model = ScriptedChatModel(script=obedient(READ_NOTES))
    agent = create_agent(model, guard_tools(make_tools(ToolRuns()), guard))
    messages = agent.invoke(ask(), {"callbacks": [LoopGuardCallbackHandler(guard)]})["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert "LOOP GUARD: you have called `read_file` 3 times" in str(results[2].content)
    assert steers(messages) == []


# LangGraph's custom stream (stream_mode="custom") -------------------------------------------------


def guard_events_on_the_custom_stream(agent: Any, config: Any) -> list[dict[str, Any]]:
    """The guard's events on the custom stream (up to the handler's stop, if any)."""
    custom: list[dict[str, Any]] = []
    try:
        for mode, data in agent.stream(ask(), config, stream_mode=["updates", "custom"]):
            if mode == "custom" and data.get("event") == GUARD_NAME:
                custom.append(data)
    except LoopGuardStop:
        pass  # the wrapper + handler pairing stops by raising before the next model call
    return custom


@pytest.mark.parametrize("face", ["middleware", "node", "wrapper+handler"])
def test_every_event_reaches_the_custom_stream_once_as_json(face: str) -> None:
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    tools = make_tools(ToolRuns())
    config: Any = dict(THREAD)
    if face == "middleware":
        agent = create_agent(
            model, tools, middleware=[LoopGuardMiddleware()], checkpointer=InMemorySaver()
        )
    elif face == "node":
        agent = design_card_graph(model, tools, LoopGuard())
    else:
        guard = LoopGuard()
        agent = create_agent(model, guard_tools(tools, guard), checkpointer=InMemorySaver())
        config["callbacks"] = [LoopGuardCallbackHandler(guard)]
    events = guard_events_on_the_custom_stream(agent, config)
    kinds = [event["kind"] for event in events]
    assert kinds == ["steer", "block", "block", "block", "stop"]
    assert json.loads(json.dumps(events)) == events
    assert events[0]["reason"] == "repeat"
    assert events[0]["args"] == {"path": "notes.md"}
    assert events[0]["tool"] == "read_file"
    assert events[0]["conversation"] == "t"


# What guard_tools accepts -------------------------------------------------------------------------


def test_plain_functions_and_provider_tools_are_accepted() -> None:
    runs = ToolRuns()

    def read_file(path: str) -> str:
        """Read a file."""
        runs.hit("read_file")
        return "File not found"

    web_search = {"type": "web_search_preview"}
    guard = LoopGuard()
    wrapped = guard_tools([read_file, web_search], guard)
    assert isinstance(wrapped[0], BaseTool)
    assert wrapped[0].name == "read_file"
    assert wrapped[1] is web_search  # runs at the provider: passed through untouched
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(model, [wrapped[0]], middleware=[], checkpointer=InMemorySaver())
    with pytest.raises(LoopGuardStop):
        agent.invoke(ask(), {**THREAD, "callbacks": [LoopGuardCallbackHandler(guard)]})
    assert runs.counts["read_file"] == 4


@pytest.mark.parametrize(
    ("tools", "guard", "expected"),
    [
        (lambda: make_tools(ToolRuns())[0], LoopGuard, "a list of tools"),
        (lambda: [42], LoopGuard, "int"),
        (lambda: make_tools(ToolRuns()), LoopGuardMiddleware, "LoopGuardMiddleware"),
        (lambda: make_tools(ToolRuns()), lambda: "guard", "a LoopGuard"),
    ],
    ids=["a bare tool", "not a tool", "a middleware as the guard", "a string as the guard"],
)
def test_anything_else_is_a_type_error_that_says_what_was_expected(
    tools: Any, guard: Any, expected: str
) -> None:
    with pytest.raises(TypeError, match=expected):
        guard_tools(tools(), guard())


# Misconfiguration that would be silent fails loudly -----------------------------------------------


def test_a_node_routing_to_a_missing_node_fails_at_the_first_run() -> None:
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    graph = design_card_graph(model, make_tools(ToolRuns()), LoopGuard(), next_node="agent")
    with pytest.raises(ValueError, match="'agent'") as raised:
        graph.invoke(ask(), THREAD)
    assert "model" in str(raised.value)  # the nodes that do exist are listed


def test_destinations_that_name_a_missing_node_fail_at_compile() -> None:
    with pytest.raises(ValueError, match="agent"):
        design_card_graph(
            ScriptedChatModel(script=stubborn(READ_NOTES)),
            make_tools(ToolRuns()),
            LoopGuard(),
            next_node="agent",
            destinations=("agent", END),
        )


# A stop ends a run cleanly and quietly ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_stop_through_the_handler_is_not_logged_as_a_callback_error(
    caplog: pytest.LogCaptureFixture, mode: Mode
) -> None:
    guard = LoopGuard()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(model, guard_tools(make_tools(ToolRuns()), guard))
    with caplog.at_level(logging.INFO), pytest.raises(LoopGuardStop):
        run(agent, ask(), {"callbacks": [LoopGuardCallbackHandler(guard)]}, mode)
    assert "Error in LoopGuardCallbackHandler" not in caplog.text
    assert "loop guard stop" in caplog.text  # the guard's own record of the stop


def test_the_stop_message_ends_a_graph_run_cleanly() -> None:
    graph = design_card_graph(
        ScriptedChatModel(script=stubborn(READ_NOTES)), make_tools(ToolRuns()), LoopGuard()
    )
    messages = graph.invoke({"messages": [HumanMessage("go")]}, THREAD)["messages"]
    assert final_stop(messages) is not None
    assert_valid_history(messages)


# A guard shared by two faces, and the edges of each face ------------------------------------------


def test_a_guard_shared_with_a_graph_still_steers_a_create_agent_through_its_tools() -> None:
    """The node steers only the conversations it serves: the same guard's wrapped tools in
    a `create_agent` (no node there) still carry the steer in the tool result."""
    guard = LoopGuard()
    design_card_graph(
        ScriptedChatModel(script=obedient(READ_NOTES)), make_tools(ToolRuns()), guard
    ).invoke(ask(), {"configurable": {"thread_id": "graph"}})
    model = ScriptedChatModel(script=obedient(READ_NOTES))
    agent = create_agent(model, guard_tools(make_tools(ToolRuns()), guard))
    messages = agent.invoke(ask(), {"callbacks": [LoopGuardCallbackHandler(guard)]})["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert "LOOP GUARD: you have called `read_file` 3 times" in str(results[2].content)
    assert model.calls == 4  # steered away after the 3rd result


def test_events_of_a_run_outside_langgraph_log_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """A plain LangChain runnable with the handler: no custom stream there, and no error."""
    from langchain_core.runnables import RunnableLambda

    guard = LoopGuard(warn_threshold=2, block_threshold=3)
    [tool_] = guard_tools([make_tools(ToolRuns())[1]], guard)

    def twice(_: Any) -> None:
        for n in range(2):
            tool_.invoke({"type": "tool_call", "name": "list_dir", "id": f"c{n}",
                          "args": {"path": "."}})  # fmt: skip

    with caplog.at_level(logging.INFO, logger="loop_guard"):
        RunnableLambda(twice).invoke(None, {"callbacks": [LoopGuardCallbackHandler(guard)]})
    assert guard.stats.steers == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_node_may_end_the_graph_as_its_next_node() -> None:
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    graph = design_card_graph(model, make_tools(ToolRuns()), LoopGuard(), next_node=END)
    messages = graph.invoke(ask(), THREAD)["messages"]
    assert model.calls == 1  # one tool step, then the end the graph asked for
    assert_valid_history(messages)


def test_a_subclass_of_the_handler_stops_quietly_too(caplog: pytest.LogCaptureFixture) -> None:
    class Mine(LoopGuardCallbackHandler):
        pass

    guard = LoopGuard()
    agent = create_agent(
        ScriptedChatModel(script=stubborn(READ_NOTES)), guard_tools(make_tools(ToolRuns()), guard)
    )
    with caplog.at_level(logging.INFO), pytest.raises(LoopGuardStop):
        agent.invoke(ask(), {"callbacks": [Mine(guard)]})
    assert "Error in Mine" not in caplog.text


def test_a_tool_class_instead_of_a_tool_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="pass an instance"):
        guard_tools([type(make_tools(ToolRuns())[0])], LoopGuard())
