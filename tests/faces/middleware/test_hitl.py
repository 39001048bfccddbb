"""`LoopGuardMiddleware` with `HumanInTheLoopMiddleware`: a reply the
guard refuses in full never reaches the human, whichever order the two are listed in; a
reply refused in part reaches the human only in the documented cases (batched mode, or
`per_call` with the human listed first), and never runs the refused call or breaks the
history, whatever the human decides.

A real `create_agent` with an `InMemorySaver`; only the model is scripted. The human
approves everything, and each approval request is traced back to the calls it was
about: none of them may be a call the guard answered itself.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain.agents.middleware.human_in_the_loop import InterruptOnConfig
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from loop_guard import LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, sequence, stubborn
from tests.support.agents import (
    LIST_DIR,
    READ_NOTES,
    ReplyRecorder,
    ToolRuns,
    ask,
    assert_stopped,
    assert_valid_history,
    blocked,
    final_stop,
    make_tools,
    needs_async_context,
    steers,
)

Order = Literal["guard-first", "hitl-first"]
ORDERS: tuple[Order, ...] = ("guard-first", "hitl-first")
InterruptMode = Literal["batched", "per_call"]


@dataclass
class Review:
    """What the human was asked, and what became of it."""

    asked: list[str] = field(default_factory=list)  # tool call ids, in the order asked
    requests: int = 0  # interrupts answered


def build(
    script: Any,
    order: Order,
    mode: InterruptMode = "batched",
    *,
    when_guard_runs: bool = False,
    **guard_options: Any,
) -> tuple[Any, ScriptedChatModel, ToolRuns]:
    """An agent whose tools a person approves; with `when_guard_runs`, only the calls the
    guard lets run (`LoopGuardMiddleware.will_run` as the approval's `when`)."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=script)
    guard = LoopGuardMiddleware(**guard_options)
    options: dict[str, Any] = {"interrupt_mode": mode}
    if "interrupt_mode" not in inspect.signature(HumanInTheLoopMiddleware).parameters:
        # langchain < 1.5 (the agents extra allows it) pauses once per response: batched.
        if mode == "per_call":
            pytest.skip("per-call interrupts need langchain >= 1.5")
        options = {}
    gate: Any = True
    if when_guard_runs:
        if "when" not in InterruptOnConfig.__annotations__:
            pytest.skip("HumanInTheLoopMiddleware has no `when` before langchain 1.5")
        gate = {"allowed_decisions": ["approve", "edit", "reject"], "when": guard.will_run}
    hitl = HumanInTheLoopMiddleware(interrupt_on={"read_file": gate, "list_dir": gate}, **options)
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[guard, hitl] if order == "guard-first" else [hitl, guard],
        checkpointer=InMemorySaver(),
    )
    return agent, model, runs


def _asked_ids(agent: Any, config: dict[str, Any], interrupts: Any) -> list[str]:
    """The tool call ids the pending interrupts ask about."""
    ids: list[str] = []
    for pending in interrupts:
        value = pending.value
        if value.get("type") == "tool_approval":  # per_call: one call, named by id
            ids.append(value["tool_call_id"])
            continue
        # batched: the requests follow the gated calls of the last AI message, in order
        # (a `when` may leave some out), each naming its call's tool and args
        messages = agent.get_state(config).values["messages"]
        last = next(m for m in reversed(messages) if isinstance(m, AIMessage))
        gated = iter(c for c in last.tool_calls if c["name"] in ("read_file", "list_dir"))
        for action in value["action_requests"]:
            call = next(
                c for c in gated if (c["name"], c["args"]) == (action["name"], action["args"])
            )
            ids.append(call["id"] or "")
    return ids


def _approve(interrupts: Any) -> Command[Any]:
    pending = list(interrupts)
    if all(p.value.get("type") == "tool_approval" for p in pending):
        return Command(resume={p.id: {"type": "approve"} for p in pending})
    (only,) = pending
    return Command(resume={"decisions": [{"type": "approve"}] * len(only.value["action_requests"])})


def approve_all(agent: Any, sync: bool) -> tuple[list[BaseMessage], Review]:
    """Run one request; the human approves every request. The final messages, the review."""
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
    review = Review()

    def step(payload: Any) -> Any:
        if sync:
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    result = step(ask())
    while result.get("__interrupt__"):
        review.requests += 1
        assert review.requests < 30, "the human is asked forever"
        review.asked.extend(_asked_ids(agent, config, result["__interrupt__"]))
        result = step(_approve(result["__interrupt__"]))
    return list(result["messages"]), review


def refused_ids(messages: list[BaseMessage]) -> set[str]:
    """Calls the guard answered itself (blocked, or not run because the request stopped)."""
    return {
        m.tool_call_id
        for m in messages
        if isinstance(m, ToolMessage) and m.response_metadata.get("loop_guard") == "blocked"
    }


@pytest.mark.parametrize("mode", ["batched", "per_call"])
@pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
@pytest.mark.parametrize("order", ORDERS)
def test_a_refused_call_never_reaches_the_human(
    order: Order, sync: bool, mode: InterruptMode
) -> None:
    """Stubborn model: the human approves the 4 calls that run, and is never asked about
    the 3 blocked ones, whichever order the two middlewares are listed in."""
    agent, model, runs = build(stubborn(READ_NOTES), order, mode)
    messages, review = approve_all(agent, sync)
    assert_valid_history(messages)
    assert not set(review.asked) & refused_ids(messages)
    assert len(review.asked) == review.requests == 4
    assert runs.counts["read_file"] == 4
    assert model.calls == 7
    assert_stopped(messages)


@pytest.mark.parametrize("order", ORDERS)
def test_an_obedient_model_is_asked_about_as_usual(order: Order) -> None:
    """No refusal, no change: every call the model makes is put to the human."""
    turns = [[READ_NOTES]] * 3 + [[LIST_DIR]]
    agent, _, runs = build(sequence(*turns), order)
    messages, review = approve_all(agent, sync=True)
    assert_valid_history(messages)
    assert len(review.asked) == review.requests == 4
    assert runs.counts == {"read_file": 3, "list_dir": 1}
    assert messages[-1].content == "done"


def test_per_call_mode_with_the_guard_first_never_asks_about_a_refused_sibling() -> None:
    """A response with the repeated call and a new one: only the new one is asked about
    (the guard, listed first, answers the refused call before the human is asked)."""
    turns = [[READ_NOTES]] * 4 + [[READ_NOTES, LIST_DIR]]
    agent, _, runs = build(sequence(*turns), "guard-first", mode="per_call")
    messages, review = approve_all(agent, sync=True)
    assert_valid_history(messages)
    refused = refused_ids(messages)
    assert len(refused) == 1
    assert not set(review.asked) & refused
    assert len(review.asked) == 5
    assert runs.counts == {"read_file": 4, "list_dir": 1}
    assert messages[-1].content == "done"


@pytest.mark.parametrize(("mode", "order"), [("batched", "guard-first"),
                                             ("batched", "hitl-first"),
                                             ("per_call", "hitl-first")])  # fmt: skip
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_refused_sibling_put_to_the_human_never_runs_and_gets_one_answer(
    mode: InterruptMode, order: Order, decision: str
) -> None:
    """The documented limits: the human may be asked about a refused call; approving it
    runs nothing, rejecting it answers it instead of the guard: one answer either way."""
    turns = [[READ_NOTES]] * 4 + [[READ_NOTES, LIST_DIR]]
    agent, _, runs = build(sequence(*turns), order, mode=mode)
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
    result = agent.invoke(ask(), config)
    reads_asked = 0
    while result.get("__interrupt__"):
        pending = list(result["__interrupt__"])
        if pending[0].value.get("type") == "tool_approval":
            answers = {}
            for p in pending:
                reads_asked += p.value["name"] == "read_file"
                refusing = decision == "reject" and p.value["name"] == "read_file"
                answers[p.id] = {"type": "reject" if refusing and reads_asked == 5 else "approve"}
            command: Command[Any] = Command(resume=answers)
        else:
            (only,) = pending
            requests = only.value["action_requests"]
            last = len(requests) > 1
            decisions = [
                {"type": "reject", "message": "no"}
                if last and decision == "reject" and r["name"] == "read_file"
                else {"type": "approve"}
                for r in requests
            ]
            command = Command(resume={"decisions": decisions})
        result = agent.invoke(command, config)
    messages = list(result["messages"])
    assert_valid_history(messages)
    assert runs.counts["read_file"] == 4  # the refused 5th read never ran
    assert runs.counts["list_dir"] == 1


@pytest.mark.parametrize("order", ORDERS)
def test_batched_mode_lists_a_refused_sibling_but_never_runs_it(order: Order) -> None:
    """The documented limit of batched mode: a response that mixes a refused call with
    a new one is reviewed as a whole, so the refused call is listed too. It is already
    answered: approving it runs nothing and the history stays valid."""
    turns = [[READ_NOTES]] * 4 + [[READ_NOTES, LIST_DIR]]
    agent, _, runs = build(sequence(*turns), order)
    messages, review = approve_all(agent, sync=True)
    assert_valid_history(messages)
    refused = refused_ids(messages)
    assert len(refused) == 1
    assert set(review.asked) & refused == refused
    assert runs.counts == {"read_file": 4, "list_dir": 1}
    assert messages[-1].content == "done"


def test_a_wrapping_middleware_sees_the_reply_last() -> None:
    """The guard decides inside the model call; a `wrap_model_call` listed before it still
    gets the model's reply last in `result`, and the refusals and the stop still reach
    the history after it."""
    outer = ReplyRecorder()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[outer, LoopGuardMiddleware()],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "t1"}})["messages"]
    # 5 model turns: 4 whose call runs (the 4th steered first), then one in which the
    # model is asked 3 times: refused in full twice, then stopped.
    assert len(outer.replies) == 5
    assert model.calls == 7
    assert all(isinstance(r, AIMessage) and r.tool_calls and r.name is None for r in outer.replies)
    assert len(blocked(messages)) == 3
    assert final_stop(messages) is not None
    assert_valid_history(messages)


@pytest.mark.parametrize("order", ORDERS)
def test_a_call_the_human_keeps_rejecting_is_steered_and_stopped(order: Order) -> None:
    """Each rejection quotes the call's own id: the guard sees the same answer every time,
    so a model that keeps asking for a rejected call is steered and stopped, not asked
    about forever."""
    agent, model, runs = build(stubborn(READ_NOTES), order)
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
    result = agent.invoke(ask(), config)
    asked = 0
    assert model.calls == 1
    while result.get("__interrupt__"):
        asked += 1
        assert asked < 30, "the human is asked forever"
        (only,) = result["__interrupt__"]
        rejections = [{"type": "reject"}] * len(only.value["action_requests"])
        result = agent.invoke(Command(resume={"decisions": rejections}), config)
    messages = list(result["messages"])
    assert_valid_history(messages)
    assert runs.counts["read_file"] == 0
    assert asked == 4
    assert len(steers(messages)) == 1
    assert final_stop(messages) is not None
