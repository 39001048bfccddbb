"""`exit_behavior="ask"` asks exactly where `"end"` would stop, never after a person approved
a call it then refuses, and does what the person decided: an edit runs the edited call, a
rejection passes its message on, as `HumanInTheLoopMiddleware` does with its own.

A real `create_agent` with an `InMemorySaver`; only the model is scripted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents.middleware.human_in_the_loop import HITLResponse
from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.types import Command

from loop_guard.testing import stubborn
from tests.faces.middleware.test_ask import MODES, Asking, question
from tests.faces.middleware.test_hitl import (
    InterruptMode,
    Order,
    _approve,
    _asked_ids,
    build,
    refused_ids,
)
from tests.support.agents import LIST_DIR, ask, assert_valid_history, needs_async_context

READ = ("read_file", {"path": "a.txt"})
STOP: HITLResponse = {"decisions": [{"type": "reject"}]}


def answer_to(messages: list[BaseMessage], tool_call_id: str) -> ToolMessage:
    (answer,) = [
        m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == tool_call_id
    ]
    return answer


@pytest.mark.parametrize("mode", MODES)
def test_two_loops_in_one_reply_are_asked_about_where_end_stops(mode: str) -> None:
    """A reply with two stubborn calls: each has run as often when the person is asked as
    when `"end"` stops the request."""
    ended = Asking(LIST_DIR, READ, exit_behavior="end")
    ended.run(ask(), mode)
    asking = Asking(LIST_DIR, READ)
    assert "__interrupt__" in asking.run(ask(), mode)
    assert asking.runs.counts == ended.runs.counts


# With the guard asking and `HumanInTheLoopMiddleware` gating the same tool, the person
# approves every call put to them and stops the request when the guard asks.


def approve_then_stop(agent: Any, sync: bool) -> tuple[list[str], int, list[BaseMessage]]:
    """Run one request: the calls put to approval (their ids), the guard's questions, the
    final messages."""
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}

    def step(payload: Any) -> Any:
        if sync:
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    approvals: list[str] = []
    questions = 0
    result = step(ask())
    for _ in range(30):
        pending = result.get("__interrupt__")
        if not pending:
            return approvals, questions, list(result["messages"])
        if any("loop_guard" in p.value for p in pending):
            questions += 1
            result = step(Command(resume=STOP))
        else:
            approvals.extend(_asked_ids(agent, config, pending))
            result = step(_approve(pending))
    raise AssertionError("the person is asked forever")


@pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
@pytest.mark.parametrize("interrupt_mode", ["batched", "per_call"])
@pytest.mark.parametrize("order", ["guard-first", "hitl-first"])
def test_no_call_put_to_approval_is_then_blocked(
    interrupt_mode: InterruptMode, order: Order, sync: bool
) -> None:
    """With the approval gated by `will_run`, in either order and either mode: the person
    approves the 4 calls that run, is asked by the guard where it would stop, and is never
    asked to approve a call the guard blocks or asks about itself."""
    agent, _, runs = build(
        stubborn(READ), order, interrupt_mode, when_guard_runs=True, exit_behavior="ask"
    )
    approvals, questions, messages = approve_then_stop(agent, sync)
    assert_valid_history(messages)
    assert questions == 1
    assert runs.counts["read_file"] == 4
    assert not set(approvals) & refused_ids(messages)
    assert len(approvals) == 4


@pytest.mark.parametrize("interrupt_mode", ["batched", "per_call"])
@pytest.mark.parametrize("order", ["guard-first", "hitl-first"])
def test_a_reply_blocked_in_part_puts_only_its_running_calls_to_approval(
    interrupt_mode: InterruptMode, order: Order
) -> None:
    """A reply whose one call is blocked and whose other runs: with `will_run`, only the
    call that runs is put to a person."""
    agent, _, _ = build(
        stubborn(READ, LIST_DIR),
        order,
        interrupt_mode,
        when_guard_runs=True,
        exit_behavior="ask",
    )
    approvals, _, messages = approve_then_stop(agent, sync=True)
    assert_valid_history(messages)
    assert refused_ids(messages)
    assert not set(approvals) & refused_ids(messages)


@pytest.mark.parametrize("mode", MODES)
def test_an_edit_runs_the_edited_call(mode: str) -> None:
    """The edit Agent Inbox and Agent Chat UI send: the call runs with the edited args."""
    agent = Asking(READ)
    asked = question(agent.run(ask(), mode))["loop_guard"]["tool_call_id"]
    edited = {"name": "read_file", "args": {"path": "b.txt"}}
    agent.resume({"decisions": [{"type": "edit", "edited_action": edited}]}, mode)
    assert "contents of b.txt" in answer_to(agent.messages(), asked).text
    assert agent.runs.counts["read_file"] > 4  # it ran


@pytest.mark.parametrize("mode", MODES)
def test_a_rejection_passes_its_message_on(mode: str) -> None:
    """Rejected with a message: the request ends, and the message answers the call, as
    `HumanInTheLoopMiddleware` answers a call rejected with one."""
    reason = "Use the copy in the cache instead."
    agent = Asking(READ)
    asked = question(agent.run(ask(), mode))["loop_guard"]["tool_call_id"]
    done = agent.resume({"decisions": [{"type": "reject", "message": reason}]}, mode)
    assert "__interrupt__" not in done
    assert_valid_history(done["messages"])
    assert reason in answer_to(done["messages"], asked).text
    assert agent.runs.counts["read_file"] == 4


@pytest.mark.parametrize("mode", MODES)
def test_a_response_answers_in_the_tools_place_and_the_request_goes_on(mode: str) -> None:
    """`respond`, as `HumanInTheLoopMiddleware` reads it: the person's text is the call's
    result (the tool does not run for it), and the request goes on, the limits raised."""
    agent = Asking(READ)
    asked = question(agent.run(ask(), mode))["loop_guard"]["tool_call_id"]
    answer = "a.txt is empty; stop reading it."
    paused = agent.resume({"decisions": [{"type": "respond", "message": answer}]}, mode)
    responded = answer_to(agent.messages(), asked)
    assert (responded.text, responded.status) == (answer, "success")
    assert "__interrupt__" in paused  # the stubborn model looped again, and is asked again
    assert agent.runs.counts["read_file"] == 4 + 4  # nothing ran for the answered call


@pytest.mark.parametrize("mode", MODES)
def test_an_edit_to_a_tool_the_agent_lacks_is_answered_not_run(mode: str) -> None:
    agent = Asking(READ)
    asked = question(agent.run(ask(), mode))["loop_guard"]["tool_call_id"]
    edited = {"name": "delete_everything", "args": {}}
    agent.resume({"decisions": [{"type": "edit", "edited_action": edited}]}, mode)
    refused = answer_to(agent.messages(), asked)
    assert refused.status == "error"
    assert "`delete_everything`, which is not a tool of this agent" in refused.text
    assert agent.runs.counts["read_file"] >= 4
