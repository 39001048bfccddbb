"""Threads checkpointed mid-loop by earlier versions, resumed by this one, decide as one
uninterrupted run: the same runs of a stuck call before the block, every call answered.

The checkpoints were written by the old commits (`tests/support/fixtures/upgrade/write_fixture.py`
says how); a real `create_agent` (or, for the node's face, the graph of
`tests/support/agents.py`) resumes them from SQLite, only the model is scripted.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from contextlib import AbstractContextManager, nullcontext
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

from loop_guard import LoopGuardMiddleware, LoopGuardStop
from loop_guard.testing import ScriptedChatModel, stubborn
from loop_guard.upgrades import aupgrade_thread, upgrade_thread
from tests.support import FIXTURES
from tests.support.agents import (
    ask,
    assert_valid_history,
    blocked,
    final_stop,
    guarded_agent,
    needs_async_context,
    timeline,
)

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
    """Upgrade the thread, then resume it to its end: a thread paused for approval with an
    approval, one moved on from a removed node as it is."""
    if sync:
        saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
        agent = build(saver, approval=approval)
        upgraded = upgrade_thread(agent, CONFIG)
        assert approval or upgraded is not None
        return drive(agent, APPROVE if upgraded is None else None)

    async def go() -> list[BaseMessage]:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            agent = build(saver, approval=approval)
            upgraded = await aupgrade_thread(agent, CONFIG)
            assert approval or upgraded is not None
            return await adrive(agent, APPROVE if upgraded is None else None)

    return asyncio.run(go())


def assert_resumes_as_one_run(fixture: str, tmp_path: Path, *, approval: bool, sync: bool) -> None:
    """A copy of the thread in `fixture`, upgraded and resumed to its end, decides as the
    same request run without a pause does."""
    messages = resume(copy(fixture, tmp_path), approval=approval, sync=sync)
    assert_like_uninterrupted(messages, approval=approval)


SYNC = pytest.mark.parametrize("sync", [True, False], ids=["invoke", "ainvoke"])
# Resuming a paused approval in an async run needs a run context (Python 3.11).
SYNC_IN_CONTEXT = pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)


@SYNC_IN_CONTEXT
@pytest.mark.parametrize(
    "fixture",
    [
        "release-0.1.0.sqlite",  # 544d6c4, the previous release: 2 calls approved
        "release-0.1.0-approved-1.sqlite",  # the same, 1 call approved
        "release-0.1.0-approved-3.sqlite",  # the same, 3 calls approved (and steered)
        "id-keyed.sqlite",  # 845c20e^: calls keyed by tool-call id
        "after-model-approval.sqlite",  # 08902b3^: the reply waits for approval undecided
    ],
)
def test_a_request_paused_for_approval_resumes_as_one_run(
    fixture: str, sync: bool, tmp_path: Path
) -> None:
    assert_resumes_as_one_run(fixture, tmp_path, approval=True, sync=sync)


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
    assert_resumes_as_one_run(fixture, tmp_path, approval=False, sync=sync)


@SYNC_IN_CONTEXT
@pytest.mark.parametrize("fixture", ["before-model-node.sqlite", "after-model-node.sqlite"])
def test_an_upgraded_thread_resumed_with_approval_finishes_as_one_run(
    fixture: str, sync: bool, tmp_path: Path
) -> None:
    """The agent now asks a person about every call: the upgraded thread is asked about the
    calls it has left to run, not resumed for ever, and stops where one run stops."""
    assert_resumes_as_one_run(fixture, tmp_path, approval=True, sync=sync)


def face_agent(face: str, checkpointer: Any) -> tuple[Any, dict[str, Any]]:
    """The stubborn agent of the fixture writer, guarded as `face` does it, and its config."""
    model = ScriptedChatModel(script=stubborn(("list_dir", {"path": "."})))
    agent, extra = guarded_agent(face, model, [list_dir], checkpointer=checkpointer)
    return agent, {**CONFIG, **extra}


def ending(face: str) -> AbstractContextManager[object]:
    """How a stopped request ends on `face`: the handler's with `LoopGuardStop`."""
    return pytest.raises(LoopGuardStop) if face == "handler" else nullcontext()


def run_face(face: str, path: Path, payload: Any, *, sync: bool) -> list[BaseMessage]:
    """Run `face`'s agent on thread `t` of the SQLite database at `path` to its end."""
    if sync:
        saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
        agent, config = face_agent(face, saver)
        with ending(face):
            agent.invoke(payload, config)
        return list(agent.get_state(config).values["messages"])

    async def go() -> list[BaseMessage]:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            agent, config = face_agent(face, saver)
            with ending(face):
                await agent.ainvoke(payload, config)
            return list((await agent.aget_state(config)).values["messages"])

    return asyncio.run(go())


@SYNC_IN_CONTEXT
@pytest.mark.parametrize("face", ["graph", "handler"])
def test_a_release_thread_of_another_face_resumes_as_one_run(
    face: str, sync: bool, tmp_path: Path
) -> None:
    """Paused before the tools by 0.1.0 after 3 runs (steered): `LoopGuardNode`, or the
    callback handler, of a new process goes on from the thread's history alone."""
    messages = run_face(face, copy(f"release-0.1.0-{face}.sqlite", tmp_path), None, sync=sync)
    reference = run_face(face, tmp_path / "reference.sqlite", ask("List the directory"), sync=True)
    assert runs_before_block(reference) == 4
    assert runs_before_block(messages) == runs_before_block(reference)
    assert timeline(messages) == timeline(reference)
    assert_valid_history(messages)


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


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"Error: {path} not found"


def paused_agent(checkpointer: Any, events: list[Any]) -> Any:
    """The fixture writer's `middleware-before-tools` agent: a failing read forever, each
    tool step paused for a person (`interrupt_before=["tools"]`)."""
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    return create_agent(
        model,
        [read_file],
        middleware=[LoopGuardMiddleware(on_event=events.append)],
        checkpointer=checkpointer,
        interrupt_before=["tools"],
    )


def approve_every_step(
    path: Path, *, upgrade: bool, sync: bool
) -> tuple[list[BaseMessage], list[str]]:
    """Resume the thread at `path` with today's code, a person approving every tool step
    until nothing is left to run: its messages and the events published meanwhile."""
    events: list[Any] = []
    if sync:
        agent = paused_agent(SqliteSaver(sqlite3.connect(path, check_same_thread=False)), events)
        if upgrade:
            upgrade_thread(agent, CONFIG)
        for _ in range(30):
            if not agent.get_state(CONFIG).next:
                break
            agent.invoke(None, CONFIG)
        messages = list(agent.get_state(CONFIG).values["messages"])
        return messages, [event.kind for event in events]

    async def go() -> list[BaseMessage]:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            agent = paused_agent(saver, events)
            if upgrade:
                await aupgrade_thread(agent, CONFIG)
            for _ in range(30):
                if not (await agent.aget_state(CONFIG)).next:
                    break
                await agent.ainvoke(None, CONFIG)
            return list((await agent.aget_state(CONFIG)).values["messages"])

    return asyncio.run(go()), [event.kind for event in events]


def reads_run(messages: list[BaseMessage]) -> int:
    return sum(isinstance(m, ToolMessage) and not blocked([m]) for m in messages)


@SYNC_IN_CONTEXT
@pytest.mark.parametrize("upgrade", [False, True], ids=["as-is", "upgraded"])
@pytest.mark.parametrize("approved", [1, 3])
def test_a_thread_paused_before_the_tools_by_the_release_resumes_exactly(
    approved: int, upgrade: bool, sync: bool, tmp_path: Path
) -> None:
    """Paused before each tool step by 0.1.0, a person having approved 1 or 3 of them:
    today's code resumes it as one uninterrupted run of today's does, 4 runs of the
    failing read, one steer, three blocks and the stop. (0.1.0 counted "Error: ..." as a
    success: read from its snapshot, each of its pauses cost one more run.)"""
    path = copy(f"release-0.1.0-paused-{approved}.sqlite", tmp_path)
    messages, kinds = approve_every_step(path, upgrade=upgrade, sync=sync)
    reference = tmp_path / "reference.sqlite"
    events: list[Any] = []
    agent = paused_agent(SqliteSaver(sqlite3.connect(reference, check_same_thread=False)), events)
    agent.invoke(ask("List the directory"), CONFIG)
    expected, _ = approve_every_step(reference, upgrade=False, sync=True)
    assert reads_run(expected) == 4
    assert reads_run(messages) == 4
    assert sum(m.type == "human" and m.name == "loop_guard" for m in messages) == 1
    assert timeline(messages) == timeline(expected)
    assert kinds[-4:] == ["block", "block", "block", "stop"]
    assert_valid_history(messages)
