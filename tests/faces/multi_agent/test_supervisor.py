"""Loops between agents (SPEC §9) in a supervisor graph: a `create_agent` supervisor with
`LoopGuardMiddleware` delegating through `langgraph-supervisor`'s handoff tool to a worker
agent, which reports back to it; the same supervisor with no middleware, and
`create_supervisor`'s own, each watched by the callback handler with its handoff tools
guarded. Re-delegating the same task with the same
report is a streak; a new task or a new report is progress. Only the chat models are
scripted.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from loop_guard.marks import GUARD_NAME
from tests.support.agents import assert_valid_history, blocked, needs_async_context
from tests.support.between import TASKS, HandlerSupervisor, PrebuiltSupervisor, Supervisor

SYNC = pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
BUILT = pytest.mark.parametrize(
    "kind",
    [
        pytest.param(Supervisor, id="create_agent-middleware"),
        pytest.param(HandlerSupervisor, id="create_agent-handler"),
        pytest.param(PrebuiltSupervisor, id="create_supervisor-handler"),
    ],
)
WATCHED = pytest.mark.parametrize(
    "kind",
    [
        pytest.param(HandlerSupervisor, id="create_agent"),
        pytest.param(PrebuiltSupervisor, id="create_supervisor"),
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
@WATCHED
def test_a_supervisor_watched_by_the_handler_delegating_the_same_task_again_is_stopped(
    sync: bool, kind: type[Supervisor]
) -> None:
    """A supervisor with no middleware (a `create_agent` one, or `create_supervisor`'s
    own), its handoff tool guarded, the handler on the graph's run; the same task and
    report each time: the steer rides on the 4th delegation's answer, the 5th is
    blocked, and the stop ends the graph; at most 4 delegations ran, every call
    answered. Each supervisor turn is a conversation of its own that reads the history
    again; the steer is published once, by the turn that reads the report it follows
    from."""
    supervisor = kind(new_tasks=False, new_findings=False)
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
    kinds = [event.kind for event in supervisor.events]
    assert kinds == ["steer", "block", "block", "block", "stop"]  # the steer published once


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
