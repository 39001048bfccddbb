"""`stream_mode="updates"`: read as docs/middleware.md shows, the chunks hold every message
the guard adds, the refusals and the stop included, sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support.agents import READ_NOTES, ToolRuns, ask, make_tools, timeline


def messages_in(chunks: list[dict[str, Any]]) -> list[BaseMessage]:
    """Every message of every node's update, a list of updates included (the docs' loop)."""
    found: list[BaseMessage] = []
    for chunk in chunks:
        for update in chunk.values():
            for part in update if isinstance(update, list) else [update]:
                found.extend((part or {}).get("messages", []))
    return found


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_the_updates_hold_the_whole_history_the_stop_included(mode: str) -> None:
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(
        model,
        make_tools(ToolRuns()),
        middleware=[LoopGuardMiddleware()],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t"}}
    if mode == "stream":
        chunks = list(agent.stream(ask(), config, stream_mode="updates"))
    else:

        async def collect() -> list[dict[str, Any]]:
            return [c async for c in agent.astream(ask(), config, stream_mode="updates")]

        chunks = asyncio.run(collect())
    assert any(isinstance(update, list) for chunk in chunks for update in chunk.values())
    history = agent.get_state(config).values["messages"]
    assert timeline([*ask()["messages"], *messages_in(chunks)]) == timeline(history)
    assert history[-1].name == "loop_guard"
