"""Threads checkpointed mid-loop by earlier versions, resumed by this one, decide as one
uninterrupted run: the same runs of a stuck call before the block, every call answered.

The checkpoints were written by the old commits (`tests/support/fixtures/upgrade/write_fixture.py`
says how); a real `create_agent` resumes them from SQLite, only the model is scripted.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

from loop_guard import LoopGuardMiddleware, aupgrade_thread, upgrade_thread
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support import FIXTURES
from tests.support.agents import ask, assert_valid_history, blocked, final_stop, needs_async_context

UPGRADE_FIXTURES = FIXTURES / "upgrade"
CONFIG: dict[str, Any] = {"configurable": {"thread_id": "t"}}
APPROVE = Command(resume={"decisions": [{"type": "approve"}]})


@tool
def list_dir(path: str) -> str:
    """List a directory."""
    return "README.md\nsrc/"


def build(checkpointer: Any, *, approval: bool) -> Any:
    model = ScriptedChatModel(script=stubborn(("list_dir", {"path": "."})))
    middleware: list[Any] = [LoopGuardMiddleware()]
    if approval:
        middleware.append(HumanInTheLoopMiddleware(interrupt_on={"list_dir": True}))
    return create_agent(model, [list_dir], middleware=middleware, checkpointer=checkpointer)


def runs_before_block(messages: list[BaseMessage]) -> int:
    """Tool runs before the guard's first block."""
    blocks = {id(m) for m in blocked(messages)}
    runs = 0
    for message in messages:
        if id(message) in blocks:
            return runs
        runs += isinstance(message, ToolMessage)
    return runs


def drive(agent: Any, first: Any) -> list[BaseMessage]:
    result = agent.invoke(first, CONFIG)
    for _ in range(30):
        if not result.get("__interrupt__"):
            return list(result["messages"])
        result = agent.invoke(APPROVE, CONFIG)
    raise AssertionError("the human is asked forever")


async def adrive(agent: Any, first: Any) -> list[BaseMessage]:
    result = await agent.ainvoke(first, CONFIG)
    for _ in range(30):
        if not result.get("__interrupt__"):
            return list(result["messages"])
        result = await agent.ainvoke(APPROVE, CONFIG)
    raise AssertionError("the human is asked forever")


def uninterrupted(*, approval: bool) -> list[BaseMessage]:
    return drive(build(InMemorySaver(), approval=approval), ask("List the directory"))


def assert_like_uninterrupted(messages: list[BaseMessage], *, approval: bool) -> None:
    reference = uninterrupted(approval=approval)
    assert runs_before_block(reference) == 4
    assert runs_before_block(messages) == runs_before_block(reference)
    assert len(blocked(messages)) == len(blocked(reference))
    assert final_stop(messages) is not None
    assert_valid_history(messages)


def copy(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copyfile(UPGRADE_FIXTURES / name, path)
    return path


def resume(path: Path, *, approval: bool, sync: bool) -> list[BaseMessage]:
    first = APPROVE if approval else None
    if sync:
        saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
        agent = build(saver, approval=approval)
        upgraded = upgrade_thread(agent, CONFIG)
        assert approval or upgraded is not None
        return drive(agent, first)

    async def go() -> list[BaseMessage]:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            agent = build(saver, approval=approval)
            upgraded = await aupgrade_thread(agent, CONFIG)
            assert approval or upgraded is not None
            return await adrive(agent, first)

    return asyncio.run(go())


SYNC = pytest.mark.parametrize("sync", [True, False], ids=["invoke", "ainvoke"])


@pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
@pytest.mark.parametrize(
    "fixture",
    [
        "release-0.1.0.sqlite",  # 544d6c4, the previous release
        "id-keyed.sqlite",  # 845c20e^: calls keyed by tool-call id
        "after-model-approval.sqlite",  # 08902b3^: the reply waits for approval undecided
    ],
)
def test_a_request_paused_for_approval_resumes_as_one_run(
    fixture: str, sync: bool, tmp_path: Path
) -> None:
    messages = resume(copy(fixture, tmp_path), approval=True, sync=sync)
    assert_like_uninterrupted(messages, approval=True)


@SYNC
@pytest.mark.parametrize(
    "fixture",
    [
        "before-model-node.sqlite",  # b574a1b^: paused before the guard's before_model
        "after-model-node.sqlite",  # 08902b3^: paused before the guard's after_model
    ],
)
def test_a_thread_paused_before_a_removed_node_resumes_as_one_run(
    fixture: str, sync: bool, tmp_path: Path
) -> None:
    messages = resume(copy(fixture, tmp_path), approval=False, sync=sync)
    assert_like_uninterrupted(messages, approval=False)


def test_without_upgrading_such_a_thread_the_resume_does_nothing(tmp_path: Path) -> None:
    """What `upgrade_thread` is for: LangGraph runs nothing for a node the graph lacks."""
    path = copy("before-model-node.sqlite", tmp_path)
    agent = build(SqliteSaver(sqlite3.connect(path, check_same_thread=False)), approval=False)
    before = agent.get_state(CONFIG).values["messages"]
    assert agent.get_state(CONFIG).next == ()
    assert agent.invoke(None, CONFIG)["messages"] == before


def test_upgrading_a_current_thread_changes_nothing(tmp_path: Path) -> None:
    path = copy("release-0.1.0.sqlite", tmp_path)
    agent = build(SqliteSaver(sqlite3.connect(path, check_same_thread=False)), approval=True)
    state = agent.get_state(CONFIG)
    assert upgrade_thread(agent, CONFIG) is None
    assert agent.get_state(CONFIG).config == state.config
