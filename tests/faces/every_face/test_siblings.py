"""Identical siblings (`dedupe_siblings`, opt-in): identical calls of one response run once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import LoopGuard, LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, sequence
from tests.support.agents import ask, assert_valid_history, build_graph

FACES = ["middleware", "graph"]


def toolbox(runs: Counter[str]) -> list[BaseTool]:
    @tool
    def test_suite(target: str) -> str:
        """Run the test suite (slow)."""
        runs[target] += 1
        time.sleep(0.05)  # long enough for the duplicates to arrive while it runs
        if target == "broken":
            raise ToolException("build failed")
        return f"{target}: 12 passed"

    test_suite.handle_tool_error = True
    return [test_suite]


def build(face: str, runs: Counter[str], *turns: Any, **options: Any) -> Any:
    model = ScriptedChatModel(script=sequence(*turns))
    if face == "middleware":
        return create_agent(
            model,
            toolbox(runs),
            middleware=[LoopGuardMiddleware(**options)],
            checkpointer=InMemorySaver(),
        )
    return build_graph(model, toolbox(runs), LoopGuard(**options), checkpointer=InMemorySaver())


def answers(messages: list[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


SUITE = ("test_suite", {"target": "all"})


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_identical_siblings_run_once_and_share_the_result(face: str, mode: str) -> None:
    runs: Counter[str] = Counter()
    agent = build(face, runs, [SUITE, SUITE, ("test_suite", {"target": "x"}), SUITE],
                  dedupe_siblings=True)  # fmt: skip
    config = {"configurable": {"thread_id": "t"}}
    if mode == "invoke":
        messages = agent.invoke(ask(), config)["messages"]
    else:
        messages = asyncio.run(agent.ainvoke(ask(), config))["messages"]
    assert runs == {"all": 1, "x": 1}
    assert_valid_history(messages)
    results = answers(messages)
    marks = [m.response_metadata.get("loop_guard") for m in results]
    assert marks == [None, "duplicate", None, "duplicate"]
    original_id = results[0].tool_call_id
    for duplicate in (results[1], results[3]):
        assert isinstance(duplicate.content, str)
        assert duplicate.content.endswith("all: 12 passed")
        assert original_id in duplicate.content
    assert len({m.tool_call_id for m in results}) == 4


@pytest.mark.parametrize("face", FACES)
def test_without_the_option_every_sibling_runs(face: str) -> None:
    runs: Counter[str] = Counter()
    agent = build(face, runs, [SUITE, SUITE, SUITE])
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "t"}})["messages"]
    assert runs == {"all": 3}
    assert all(m.response_metadata.get("loop_guard") is None for m in answers(messages))


@pytest.mark.parametrize("face", FACES)
def test_a_failing_original_fails_its_duplicates_alike(face: str) -> None:
    runs: Counter[str] = Counter()
    broken = ("test_suite", {"target": "broken"})
    agent = build(face, runs, [broken, broken], dedupe_siblings=True)
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "t"}})["messages"]
    assert runs == {"broken": 1}
    results = answers(messages)
    assert [m.status for m in results] == ["error", "error"]
    assert all("build failed" in str(m.content) for m in results)


@pytest.mark.parametrize("face", FACES)
def test_shared_results_count_as_one_repeat_of_the_same_result(face: str) -> None:
    """Three responses of four identical siblings: the same streak as four serial calls
    would give three times (the batch's last call is compared: see How the guard
    decides: batches)."""
    runs: Counter[str] = Counter()
    events: list[str] = []
    options = {"dedupe_siblings": True, "on_event": lambda e: events.append(e.kind)}
    if face == "graph":
        model = ScriptedChatModel(script=sequence(*[[SUITE] * 4] * 3))
        guard = LoopGuard(dedupe_siblings=True, on_event=lambda e: events.append(e.kind))
        agent: Any = build_graph(model, toolbox(runs), guard, checkpointer=InMemorySaver())
    else:
        agent = build(face, runs, *[[SUITE] * 4] * 3, **options)
    agent.invoke(ask(), {"configurable": {"thread_id": "t"}})
    assert runs == {"all": 3}
    assert events == ["steer"]


@pytest.mark.parametrize("face", FACES)
def test_sequential_tool_execution_still_runs_once(face: str) -> None:
    """With one worker the original runs before its duplicates start: they find its
    output ready (a duplicate that gave up waiting would have run the tool itself)."""
    runs: Counter[str] = Counter()
    agent = build(face, runs, [SUITE, SUITE, SUITE], dedupe_siblings=True)
    config = {"configurable": {"thread_id": "t"}, "max_concurrency": 1}
    messages = agent.invoke(ask(), config)["messages"]
    assert runs == {"all": 1}
    assert_valid_history(messages)


def test_a_retried_original_shares_its_retry() -> None:
    """ToolRetryMiddleware around the guard: the original's second attempt is a new run
    that the duplicate receives; the tool runs as often as it would without dedupe."""
    from langchain.agents.middleware import ToolRetryMiddleware

    attempts: Counter[str] = Counter()

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        attempts[url] += 1
        time.sleep(0.02)
        if attempts[url] == 1:
            raise ConnectionError("transient")
        return "page body"

    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0.01, jitter=False)
    call = ("fetch", {"url": "u"})
    agent = create_agent(
        ScriptedChatModel(script=sequence([call, call])),
        [fetch],
        middleware=[retry, LoopGuardMiddleware(dedupe_siblings=True)],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "t"}})["messages"]
    assert attempts == {"u": 2}
    results = answers(messages)
    assert [m.status for m in results] == ["success", "success"]
    assert all(str(m.content).endswith("page body") for m in results)


@pytest.mark.internals(reason="the run identical siblings share")
def test_cancelling_one_sibling_leaves_the_others_their_result() -> None:
    from loop_guard import Call
    from loop_guard._faces import ashared_run

    guard = LoopGuard(dedupe_siblings=True)
    calls = [Call.of("fetch", {"url": "u"}, id=f"c{n}") for n in range(3)]
    runs: Counter[str] = Counter()

    async def body() -> ToolMessage:
        runs["fetch"] += 1
        await asyncio.sleep(0.2)
        return ToolMessage("page", tool_call_id="c0")

    async def sibling(index: int, timeout: float | None = None) -> str:
        run = ashared_run(guard, "t", calls[index], calls, body)
        try:
            message = await (asyncio.wait_for(run, timeout) if timeout else run)
        except asyncio.TimeoutError:  # builtin `TimeoutError` only from Python 3.11
            return "timed out"
        return str(message.content)

    async def main() -> list[str]:
        return list(await asyncio.gather(sibling(0), sibling(1, 0.05), sibling(2)))

    original, cancelled, duplicate = asyncio.run(main())
    assert (original, cancelled) == ("page", "timed out")
    assert duplicate.endswith("page")
    assert "duplicate of call `c0`" in duplicate
    assert runs == {"fetch": 1}
