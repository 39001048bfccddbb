"""Loops between agents (SPEC §9): agents that hand a task back and forth in a real
`langgraph-swarm`, each a `create_agent` with `LoopGuardMiddleware`, or with no middleware,
watched by the callback handler with its tools guarded by `guard_tools`; and in a hand-built
network guarded by `guard_tools` and `LoopGuardNode`. The calls of every agent
writing into the shared history are one sequence for the detectors, a handoff a call like
any other, and one request spans the agents a user message sets going. Only the chat models
are scripted.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from langgraph_swarm import create_handoff_tool, create_swarm
from pydantic.warnings import PydanticDeprecatedSince20

from loop_guard import (
    GuardEvent,
    LoopGuardMiddleware,
    LoopGuardStop,
)
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import Script, ScriptedChatModel
from tests.support.agents import Face, Guarded, assert_valid_history, blocked, needs_async_context
from tests.support.between import TASKS, HandlerPingPong, Network, PingPong, search

SYNC = pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)


def handoffs_before(messages: Sequence[BaseMessage], index: int) -> int:
    """Handoffs that ran (answered by a transfer, not a block) before `messages[index]`."""
    return sum(
        isinstance(m, ToolMessage) and m.text.startswith("Successfully transferred")
        for m in messages[:index]
    )


def steer_at(messages: Sequence[BaseMessage]) -> int:
    return next(
        i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and m.name == GUARD_NAME
    )


@SYNC
def test_a_handoff_ping_pong_is_steered_then_stopped_for_the_whole_run(sync: bool) -> None:
    """Alice and bob hand the task back and forth: steered within 3 laps (a lap is a handoff
    each way), stopped within 6, every call answered, the run at its end with the stop."""
    swarm = PingPong()
    messages = swarm.run({"messages": [HumanMessage("Plan a trip")]}, sync)
    assert_valid_history(messages)
    assert handoffs_before(messages, steer_at(messages)) <= 2 * 3
    assert handoffs_before(messages, len(messages)) <= 2 * 6
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert last.text.startswith("Stopped by loop_guard")
    assert blocked(messages)
    assert swarm.kinds()[0] == "steer"
    assert swarm.kinds()[-1] == "stop"
    assert swarm.kinds().count("steer") == 1  # published once, by the agent that read it


@SYNC
def test_a_stopped_ping_pong_ends_with_the_answer_of_the_agent_about_to_repeat(
    sync: bool,
) -> None:
    """With `exit_behavior="answer"` the stop ends the swarm's run with the answer of the
    agent that was about to repeat, asked once, every call answered."""
    swarm = PingPong(exit_behavior="answer")
    messages = swarm.run({"messages": [HumanMessage("Plan a trip")]}, sync)
    assert_valid_history(messages)
    stopping = swarm.events[-1][0]
    assert swarm.kinds()[-1] == "stop"
    assert messages[-1].text == f"{stopping} gives up."
    assert sum(m.text.endswith("gives up.") for m in messages) == 1


@SYNC
def test_a_stopped_ping_pong_pauses_the_swarm_for_a_person(sync: bool) -> None:
    """With `exit_behavior="ask"` the stop pauses the whole swarm; a person who rejects
    the stopping call ends the run with the stop, every call answered."""
    swarm = PingPong(exit_behavior="ask")
    paused = swarm.state({"messages": [HumanMessage("Plan a trip")]}, sync)
    assert "__interrupt__" in paused
    asked = len(paused["messages"])
    done = swarm.state(Command(resume={"decisions": [{"type": "reject"}]}), sync)
    assert "__interrupt__" not in done
    messages = list(done["messages"])
    assert len(messages) > asked
    assert_valid_history(messages)
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert swarm.kinds()[-1] == "stop"


@SYNC
def test_a_ping_pong_watched_by_the_handler_is_steered_then_stopped(sync: bool) -> None:
    """The swarm with no middleware, its handoff tools guarded by `guard_tools` and the
    handler on the swarm's run: the steer rides on the answer of the handoff after the
    3rd lap, published once, by the agent that read the lap it follows from; the stop
    comes within 6 laps and ends the whole run, every call answered."""
    swarm = HandlerPingPong()
    messages = swarm.run({"messages": [HumanMessage("Plan a trip")]}, sync)
    assert_valid_history(messages)
    steer = next(
        i
        for i, m in enumerate(messages)
        if isinstance(m, ToolMessage)
        and m.text.startswith("Successfully")
        and "LOOP GUARD" in m.text
    )
    assert handoffs_before(messages, steer) <= 2 * 3
    assert handoffs_before(messages, len(messages)) <= 2 * 6
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert last.text.startswith("Stopped by loop_guard")
    assert len(blocked(messages)) == 3
    assert swarm.kinds() == ["steer", "block", "block", "block", "stop"]
    assert swarm.events[0][0] == "alice"  # she read bob's handoff that closed the 3rd lap


def test_a_guarded_handoff_tool_without_arguments_reads_its_schema_as_pydantic_2() -> None:
    """A handoff tool takes no arguments: its guard tells the model's arguments from
    injected ones without pydantic's deprecated `__fields__` (an error here, which the
    guard would report as a fault of its own, an `error` event)."""
    swarm = HandlerPingPong()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PydanticDeprecatedSince20)
        swarm.run({"messages": [HumanMessage("Plan a trip")]}, sync=True)
    assert swarm.kinds() == ["steer", "block", "block", "block", "stop"]


@SYNC
def test_a_ping_pong_in_a_network_of_ones_own_is_steered_then_stopped(sync: bool) -> None:
    """Two agents of a hand-built graph routing to each other, guarded by `guard_tools`
    and `LoopGuardNode`: the node steers the agent about to start a 4th lap, the 5th is
    blocked, and the stop ends the whole graph, every call answered."""
    network = Network()
    messages = network.run(sync)
    assert_valid_history(messages)
    steer = steer_at(messages)
    assert sum(m.text.startswith("Transferred") for m in messages[:steer]) == 2 * 3
    assert messages[steer + 1].name == "alice"
    assert sum(m.text.startswith("Transferred") for m in messages) <= 2 * 6
    assert len(blocked(messages)) == 3
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert last.text.startswith("Stopped by loop_guard")
    assert [event.kind for event in network.events] == ["steer", "block", "block", "block", "stop"]
    assert network.models["alice"].calls + network.models["bob"].calls == 11


@SYNC
def test_a_ping_pong_in_a_network_of_ones_own_watched_by_the_handler_stops_with_an_error(
    sync: bool,
) -> None:
    """The same network with the handler in place of the node: the steer rides on the
    answer of the handoff that closed the 3rd lap and the next three are blocked, as
    with the node; but the agents are the graph's own nodes, not subgraphs the handler
    could end, so its stop is `LoopGuardStop` out of the run (as for any agent at the
    top of a graph), and the thread ends with the last block, every call answered."""
    network = Network("handler")
    with pytest.raises(LoopGuardStop):
        network.run(sync)
    messages = network.history()
    assert_valid_history(messages)
    steer = next(i for i, m in enumerate(messages) if "LOOP GUARD" in m.text)
    assert messages[steer].text.startswith("Transferred to alice.")
    assert sum(m.text.startswith("Transferred") for m in messages[: steer + 1]) == 2 * 3
    assert len(blocked(messages)) == 3
    assert blocked(messages)[-1] is messages[-1]
    assert [event.kind for event in network.events] == ["steer", "block", "block", "block", "stop"]


def test_each_agent_is_steered_and_blocked_by_the_shared_sequence() -> None:
    """Without the shared sequence each agent saw one call per activation and the swarm ran
    to the recursion limit: the cycle is the two agents' calls together."""
    swarm = PingPong()
    messages = swarm.run({"messages": [HumanMessage("Plan a trip")]}, sync=True)
    reasons = {event.reason for _, event in swarm.events if event.kind in ("steer", "block")}
    assert reasons == {"cycle"}
    assert sum(swarm.models[name].calls for name in swarm.models) < 20
    assert len(messages) < 40


def test_a_thread_moved_to_fresh_agents_mid_loop_decides_as_one_run(tmp_path: Path) -> None:
    """The swarm pauses before each of bob's turns; half way, new agents and guards (as a
    fresh worker process would build them) take the thread over from SQLite: the history
    they read decides exactly as one uninterrupted run."""
    reference = PingPong().run({"messages": [HumanMessage("Plan a trip", id="u1")]}, True)

    def saver() -> SqliteSaver:
        return SqliteSaver(sqlite3.connect(tmp_path / "swarm.sqlite", check_same_thread=False))

    first = PingPong(saver(), interrupt_before=["bob"])
    first.run({"messages": [HumanMessage("Plan a trip", id="u1")]}, True)
    first.run(None, True)  # one more pause
    second = PingPong(saver(), interrupt_before=["bob"])
    messages: list[BaseMessage] = []
    for _ in range(20):
        messages = second.run(None, True)
        if isinstance(messages[-1], AIMessage) and messages[-1].name == GUARD_NAME:
            break
    assert [describe(m) for m in messages] == [describe(m) for m in reference]


def describe(message: BaseMessage) -> str:
    calls = [call["name"] for call in getattr(message, "tool_calls", [])]
    return f"{message.type}:{message.name}:{calls or message.text[:60]}"


# --- must not trigger ----------------------------------------------------------------------


@tool
def write(draft: str) -> str:
    """Write a draft."""
    return f"draft saved: {draft}"


@SYNC
@pytest.mark.parametrize("face", ["node", "handler"])
def test_a_network_of_ones_own_handing_over_new_work_runs_to_its_end(
    sync: bool, face: Literal["node", "handler"]
) -> None:
    """Alice and bob each search a topic no one searched yet before handing over: every
    handoff brings new work, so the network runs through all the topics to the answer,
    with no event, watched by the node or by the handler."""
    network = Network(face, new_work=True)
    messages = network.run(sync)
    assert messages[-1].text == "The plan is ready."
    assert sum(isinstance(m, ToolMessage) and m.name == "search" for m in messages) == TASKS
    assert sum(m.text.startswith("Transferred") for m in messages) == TASKS
    assert network.events == []
    assert_valid_history(messages)


@pytest.mark.parametrize("face", ["middleware", "handler"])
def test_a_researcher_writer_exchange_with_new_findings_is_left_alone(face: Face) -> None:
    """Each handoff carries new work: the researcher searches a new topic, the writer
    writes a new draft, then hands back, for 8 laps; then the writer answers. Watched by
    each agent's middleware, or by the handler with every tool guarded by `guard_tools`."""
    laps = 8

    def researcher(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage) and last.name == "search":
            return call("transfer_to_writer", {}, index)
        return call("search", {"topic": f"topic {index}"}, index)

    def writer(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        last = messages[-1]
        drafts = sum(isinstance(m, ToolMessage) and m.name == "write" for m in messages)
        if isinstance(last, ToolMessage) and last.name == "write":
            if drafts >= laps:
                return AIMessage(content="The article is done.")
            return call("transfer_to_researcher", {}, index)
        return call("write", {"draft": f"draft {drafts + 1}"}, index)

    shared = Guarded(face)
    config: Any = {"recursion_limit": 200, **shared.callbacks}

    def agent(name: str, script: Script, tools: list[BaseTool]) -> Any:
        return shared.agent(script, tools, name=name)[0]

    agents = [
        agent("researcher", researcher, [search, create_handoff_tool(agent_name="writer")]),
        agent("writer", writer, [write, create_handoff_tool(agent_name="researcher")]),
    ]
    app = create_swarm(agents, default_active_agent="researcher").compile()
    messages = app.invoke({"messages": [HumanMessage("Write an article")]}, config)["messages"]
    assert messages[-1].text == "The article is done."
    assert shared.events == []
    assert_valid_history(messages)


def test_a_swarm_back_at_an_agent_after_a_new_user_message_starts_afresh() -> None:
    """Five requests on one thread, each handing the task over once and answering: each
    user message starts a new request, so the handoffs of earlier requests never add up."""
    events: list[GuardEvent] = []
    guard = LoopGuardMiddleware(on_event=events.append)

    def hands_over_once(other: str) -> Any:
        def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
            if isinstance(messages[-1], ToolMessage):  # handed the task: answer it
                return AIMessage(content="Done.")
            return call(f"transfer_to_{other}", {}, index)

        return script

    agents = [
        create_agent(
            ScriptedChatModel(script=hands_over_once(other)),
            [create_handoff_tool(agent_name=other)],
            middleware=[guard],
            name=name,
        )
        for name, other in (("alice", "bob"), ("bob", "alice"))
    ]
    app = create_swarm(agents, default_active_agent="alice").compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    for request in range(5):
        messages = app.invoke({"messages": [HumanMessage(f"Task {request}")]}, config)["messages"]
        assert messages[-1].text == "Done."
    assert events == []


def call(name: str, args: dict[str, Any], index: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"{name}-{index}"}])
