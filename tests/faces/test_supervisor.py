"""Loops between agents (SPEC §9) in a supervisor graph: a `create_agent` supervisor with
`LoopGuardMiddleware` delegating through `langgraph-supervisor`'s handoff tool to a worker
agent, which reports back to it; and `create_supervisor`'s own supervisor, watched by the
callback handler with its handoff tools guarded. Re-delegating the same task with the same
report is a streak; a new task or a new report is progress. Only the chat models are
scripted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph_supervisor import create_handoff_tool, create_supervisor

from loop_guard import (
    GUARD_NAME,
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    guard_tools,
)
from loop_guard.testing import ScriptedChatModel
from tests.support.agents import assert_valid_history, blocked, needs_async_context

SYNC = pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
TASKS = 10  # how many tasks a supervisor with new work to hand out delegates


class Supervisor:
    """A supervisor that delegates to one worker until it has `TASKS` reports, then
    answers; `new_tasks`: each delegation says a task of its own (else the same one);
    `new_findings`: the worker reports something new each time (else the same)."""

    def __init__(self, *, new_tasks: bool, new_findings: bool) -> None:
        self.events: list[GuardEvent] = []
        self.delegations = 0
        self.new_tasks, self.new_findings = new_tasks, new_findings
        self.config: dict[str, Any] = {"recursion_limit": 100}
        self.app = self._build()

    def _build(self) -> Any:
        supervisor = create_agent(
            ScriptedChatModel(script=self._supervise),
            [create_handoff_tool(agent_name="worker")],
            middleware=[LoopGuardMiddleware(on_event=self.events.append)],
            name="supervisor",
        )
        worker = create_agent(ScriptedChatModel(script=self._work), [], name="worker")
        graph = StateGraph(MessagesState)
        graph.add_node(supervisor, destinations=("worker", END))
        graph.add_node("worker", worker)
        graph.add_edge(START, "supervisor")
        graph.add_edge("worker", "supervisor")
        return graph.compile()

    def _supervise(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        reports = sum(
            isinstance(m, AIMessage) and m.name == "worker" and not m.tool_calls for m in messages
        )  # not the hand-back `create_supervisor` writes for the worker
        if reports >= TASKS:
            return AIMessage(content="Here is the summary.")
        task = f"Research topic {reports + 1}." if self.new_tasks else "Research the topic."
        call = {"name": "transfer_to_worker", "args": {}, "id": f"handoff-{index}"}
        return AIMessage(content=task, tool_calls=[call])

    def _work(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        self.delegations += 1
        if self.new_findings:
            return AIMessage(content=f"Finding number {self.delegations}.")
        return AIMessage(content="Nothing found.")

    def run(self, sync: bool) -> list[BaseMessage]:
        payload = {"messages": [HumanMessage("Summarise the research")]}
        if sync:
            return list(self.app.invoke(payload, self.config)["messages"])
        return list(asyncio.run(self.app.ainvoke(payload, self.config))["messages"])


class PrebuiltSupervisor(Supervisor):
    """The same supervisor built by `create_supervisor` (no middleware): its handoff tool
    guarded by `guard_tools`, the callback handler in the parent graph's run config."""

    def _build(self) -> Any:
        guard = LoopGuard(on_event=self.events.append)
        self.config["callbacks"] = [LoopGuardCallbackHandler(guard)]
        self.config["configurable"] = {"thread_id": "t"}
        worker = create_agent(ScriptedChatModel(script=self._work), [], name="worker")
        handoffs = guard_tools([create_handoff_tool(agent_name="worker")], guard)
        supervisor = create_supervisor(
            [worker], model=ScriptedChatModel(script=self._supervise), tools=handoffs
        )
        return supervisor.compile(checkpointer=InMemorySaver())


BUILT = pytest.mark.parametrize(
    "kind",
    [
        pytest.param(Supervisor, id="create_agent-middleware"),
        pytest.param(PrebuiltSupervisor, id="create_supervisor-handler"),
    ],
)


@SYNC
def test_a_supervisor_delegating_the_same_task_again_is_stopped(sync: bool) -> None:
    """The same task, the same report: steered after the 3rd delegation, stopped before a
    5th; every call answered, the graph at its end with the stop."""
    supervisor = Supervisor(new_tasks=False, new_findings=False)
    messages = supervisor.run(sync)
    assert_valid_history(messages)
    assert supervisor.delegations <= 4
    steer = next(
        i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and m.name == GUARD_NAME
    )
    reports_before_steer = [m for m in messages[:steer] if isinstance(m, AIMessage)]
    assert sum(m.name == "worker" for m in reports_before_steer) == 3
    assert blocked(messages)
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert last.text.startswith("Stopped by loop_guard")
    kinds = [event.kind for event in supervisor.events]
    assert kinds[0] == "steer"
    assert kinds.count("steer") == 1
    assert kinds[-1] == "stop"


@SYNC
def test_create_supervisor_delegating_the_same_task_again_is_stopped(sync: bool) -> None:
    """`create_supervisor`'s own supervisor, the same task and report each time: the steer
    rides on the 4th delegation's answer, the 5th is blocked, and the stop ends the graph;
    at most 4 delegations ran, every call answered."""
    supervisor = PrebuiltSupervisor(new_tasks=False, new_findings=False)
    messages = supervisor.run(sync)
    assert_valid_history(messages)
    assert supervisor.delegations <= 4
    steered = [m for m in messages if isinstance(m, ToolMessage) and "LOOP GUARD" in m.text]
    assert steered[0].text.startswith("Successfully transferred to worker")
    assert len(blocked(messages)) == 3
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert last.text.startswith("Stopped by loop_guard")
    assert [event.kind for event in supervisor.events][-1] == "stop"


@SYNC
@BUILT
@pytest.mark.parametrize(
    ("new_tasks", "new_findings"),
    [
        pytest.param(True, True, id="new-tasks-new-findings"),
        pytest.param(False, True, id="same-task-new-findings"),
        pytest.param(True, False, id="new-tasks-same-report"),
    ],
)
def test_a_supervisor_handing_out_new_work_runs_to_its_end(
    sync: bool, kind: type[Supervisor], new_tasks: bool, new_findings: bool
) -> None:
    """Each delegation carries new work (a task of its own, or findings the worker reports
    back): ten delegations, then the supervisor's answer, and no event."""
    supervisor = kind(new_tasks=new_tasks, new_findings=new_findings)
    messages = supervisor.run(sync)
    assert supervisor.events == []
    assert supervisor.delegations == TASKS
    assert messages[-1].text == "Here is the summary."
    assert not any(isinstance(m, ToolMessage) and m.status == "error" for m in messages)
    assert_valid_history(messages)
