"""One guard, many conversations at once: each decides exactly as it would alone."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent
from loop_guard.testing import ScriptedChatModel, tool_calls_message
from tests.support.agents import (
    ask,
    assert_valid_history,
    guarded_agent,
    timeline,
)

ASYNC_CONVERSATIONS = 200
THREADS = 16


def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
    """Behaviour picked by the task name: a parallel loop, a serial loop, or healthy work."""
    task = str(messages[0].content)
    turn = sum(isinstance(m, AIMessage) for m in messages)
    kind = int(task.rsplit("-", 1)[1]) % 3
    if kind == 0:  # a loop in parallel calls, last in the batch, beside a varying sibling
        return tool_calls_message(
            ("list_dir", {"path": f"{task}/{turn % 2}"}), ("read_file", {"path": "notes.md"})
        )
    if kind == 1:  # a plain serial loop
        return tool_calls_message(("list_dir", {"path": task}))
    if turn < 6:  # healthy: different files, and a job whose progress advances
        return tool_calls_message(
            ("read_file", {"path": f"{task}-{turn}.md"}), ("job_status", {"job": task})
        )
    return AIMessage(content=f"done {task}")


def build(face: str, guard_events: list[GuardEvent]) -> Any:
    model = ScriptedChatModel(script=script)
    agent, _ = guarded_agent(
        face, model, on_event=guard_events.append, checkpointer=InMemorySaver()
    )
    return agent


def config(task: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": task}, "recursion_limit": 200}


def by_conversation(events: list[GuardEvent]) -> dict[str, list[tuple[str, str, int]]]:
    grouped: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for event in events:
        grouped[event.conversation].append((event.kind, event.tool, event.streak))
    return dict(grouped)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("face", ["middleware", "graph"])
def test_concurrent_conversations_match_isolated_runs(face: str) -> None:
    """200 asyncio conversations and 16 OS threads through one guard instance: every
    conversation's history and events equal those of the same conversation run alone."""
    async_tasks = [f"async-{n}" for n in range(ASYNC_CONVERSATIONS)]
    thread_tasks = [f"thread-{n}" for n in range(THREADS)]

    # The reference: every conversation alone, one after another, none other in flight.
    alone_events: list[GuardEvent] = []
    alone = build(face, alone_events)
    expected_history = {
        task: timeline(alone.invoke(ask(task), config(task))["messages"])
        for task in async_tasks + thread_tasks
    }
    expected_events = by_conversation(alone_events)

    shared_events: list[GuardEvent] = []
    shared = build(face, shared_events)
    histories: dict[str, list[BaseMessage]] = {}
    barrier = threading.Barrier(THREADS + 1)

    def in_thread(task: str) -> None:
        barrier.wait()
        histories[task] = shared.invoke(ask(task), config(task))["messages"]

    async def in_event_loop() -> None:
        barrier.wait()
        results = await asyncio.gather(
            *(shared.ainvoke(ask(task), config(task)) for task in async_tasks)
        )
        for task, result in zip(async_tasks, results, strict=True):
            histories[task] = result["messages"]

    threads = [threading.Thread(target=in_thread, args=(task,)) for task in thread_tasks]
    for thread in threads:
        thread.start()
    asyncio.run(in_event_loop())
    for thread in threads:
        thread.join()

    shared_by_conversation = by_conversation(shared_events)
    assert len(histories) == ASYNC_CONVERSATIONS + THREADS
    for task, messages in histories.items():
        assert_valid_history(messages)
        assert timeline(messages) == expected_history[task], task
        assert shared_by_conversation.get(task, []) == expected_events.get(task, []), task
    kinds = {kind for events in expected_events.values() for kind, _, _ in events}
    assert kinds == {"steer", "block", "stop"}  # the mix really exercised every decision
