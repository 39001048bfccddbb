"""Control flow inside a tool is no result: a tool that asks a human with LangGraph's
`interrupt()` is counted once per call, with what it returns after the resume; a batch
cancelled mid-run leaves its calls to the run that answers them.

Real graphs (`StateGraph` + `ToolNode`, `create_agent`) on an `InMemorySaver`; only the
model is scripted. The human approves every call, resuming with `Command(resume=...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from loop_guard import GuardEvent, LoopGuardStop
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support.agents import (
    FACES,
    Face,
    ToolRuns,
    ask,
    assert_valid_history,
    current_request,
    final_stop,
    guarded_agent,
    interrupt_in_async_tool,
    needs_async_context,
    steers,
    timeline,
)

FETCH = ("fetch", {"url": "example.com"})
APPROVED = "approved"


def make_fetch(runs: ToolRuns, *, asks_human: bool) -> BaseTool:
    """A fetch that, when it `asks_human`, waits for the human's answer first (LangGraph's
    approval pattern); it returns a text only that answer completes."""

    def answer(url: str) -> str:
        return str(interrupt({"approve": url})) if asks_human else APPROVED

    def fetch(url: str) -> str:
        decision = answer(url)
        runs.hit("fetch")
        return f"{url}: {decision}"

    async def afetch(url: str) -> str:
        decision = answer(url)
        await asyncio.sleep(0)
        runs.hit("fetch")
        return f"{url}: {decision}"

    return StructuredTool.from_function(
        func=fetch, coroutine=afetch, name="fetch", description="Fetch a page."
    )


def build(face: Face, tools: list[BaseTool], events: list[GuardEvent]) -> tuple[Any, Any]:
    """The agent for a face, and its config."""
    model = ScriptedChatModel(script=stubborn(FETCH))
    agent, extra = guarded_agent(
        "graph" if face == "node" else face,
        model,
        tools,
        on_event=events.append,
        checkpointer=InMemorySaver(),
    )
    return agent, {"configurable": {"thread_id": "t"}, "recursion_limit": 200, **extra}


def approve_every_call(agent: Any, config: Any, sync: bool) -> tuple[list[BaseMessage], int]:
    """Run one request, the human approving every call; the history and the approvals."""

    def step(payload: Any) -> Any:
        if sync:
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    approvals = 0
    try:
        result = step(ask())
        while result.get("__interrupt__"):
            approvals += 1
            assert approvals < 30, "the stuck call was never steered nor blocked"
            result = step(Command(resume=APPROVED))
    except LoopGuardStop:  # the handler alone ends a run by raising
        pass
    return list(agent.get_state(config).values["messages"]), approvals


@pytest.mark.parametrize(
    ("face", "mode"),
    [
        *((face, "invoke") for face in FACES),
        *(
            pytest.param(face, "ainvoke", marks=[interrupt_in_async_tool, *handler])
            for face, handler in (
                (f, [needs_async_context] if f == "handler" else []) for f in FACES
            )
        ),
    ],
)
def test_an_approved_call_counts_once_with_its_result_after_the_resume(
    face: Face, mode: str
) -> None:
    """The human approves each of the stuck model's calls: steered at the 3rd, blocked
    at the 5th, exactly as when nobody is asked; each call is counted with the text it
    returns once approved, with `LoopGuardNode` too: an interrupt is no result, and the
    result after the approval is the one counted."""
    events: list[GuardEvent] = []
    runs = ToolRuns()
    agent, config = build(face, [make_fetch(runs, asks_human=True)], events)
    sync = mode == "invoke"
    messages, approvals = approve_every_call(agent, config, sync)

    baseline_events: list[GuardEvent] = []
    baseline_runs = ToolRuns()
    baseline, baseline_config = build(
        face, [make_fetch(baseline_runs, asks_human=False)], baseline_events
    )
    expected, _ = approve_every_call(baseline, baseline_config, sync)

    assert_valid_history(messages)
    assert timeline(current_request(messages)) == timeline(current_request(expected))
    assert approvals == runs.counts["fetch"] == baseline_runs.counts["fetch"] == 4
    assert [e.kind for e in events] == [e.kind for e in baseline_events]
    assert [e.kind for e in events][:2] == ["steer", "block"]
    assert events[0].streak == 3
    assert len(steers(messages)) == (0 if face == "handler" else 1)  # the handler: in-band
    if face != "handler":
        assert final_stop(messages) is not None


@pytest.mark.parametrize(
    "face", ["node", pytest.param("handler", marks=needs_async_context), "middleware"]
)
def test_a_batch_cancelled_mid_run_gives_no_extra_run_after(face: Face) -> None:
    """The 2nd call is cancelled (asyncio) while it runs; run again from its checkpoint,
    the stuck call is steered and blocked as if nothing had been cancelled: 4 finished
    runs, with `LoopGuardNode` too: the cancellation is no error result that would break
    the streak, and the re-run's result is the one counted."""
    started = 0
    finished = ToolRuns()

    async def afetch(url: str) -> str:
        nonlocal started
        started += 1
        if started == 2:
            await asyncio.Event().wait()  # never set: cancelled here
        finished.hit("fetch")
        return f"{url}: page"

    def fetch(url: str) -> str:
        raise AssertionError("the async path runs")

    slow = StructuredTool.from_function(
        func=fetch, coroutine=afetch, name="fetch", description="Fetch a page."
    )
    events: list[GuardEvent] = []
    agent, config = build(face, [slow], events)

    async def main() -> list[BaseMessage]:
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(agent.ainvoke(ask(), config), timeout=1.0)
        assert (started, finished.counts["fetch"]) == (2, 1)
        with contextlib.suppress(LoopGuardStop):  # the handler alone ends a run by raising
            await agent.ainvoke(None, config)  # run again from the checkpoint
        return list(agent.get_state(config).values["messages"])

    messages = asyncio.run(main())
    assert_valid_history(messages)
    assert finished.counts["fetch"] == 4
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    if face != "handler":
        assert final_stop(messages) is not None
