"""Sends that answer a fresh counter (SPEC §8, what is fresh each time is not progress):
OpenClaw's message-loop shapes, one tool named `message` with the verb in an argument,
each identical call answered with a JSON receipt whose only change is a short id of what
it made (`"om_0"`, then `"om_1"`; `fileId`, `pollId`, `runId`, a bare `id` in a `message`
object). Two results of the same call that differ only in ids the call did not ask for
are the same result: each shape is steered and blocked, and the block stays after another
call. A poll whose content changes, or a listing whose records change, stays progress.
Every face, sync and async, and the scan. Only the chat model is scripted."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopGuardConfig, LoopGuardStop
from loop_guard.scan import Conversation, scan_conversation
from loop_guard.testing import Script, ScriptedChatModel, sequence, stubborn
from tests.support.agents import MODES, faces_and_modes, guarded_agent, run

Receipt = Callable[[int], dict[str, Any]]


def message_args(action: str, target: str, text: str = "") -> dict[str, Any]:
    """The arguments of a call of the `message` tool."""
    return {"action": action, "target": target, "text": text}


def fresh_id(key: str, prefix: str) -> Receipt:
    """A receipt whose only change is the id under `key`: `prefix_0`, then `prefix_1`..."""
    return lambda n: {"ok": True, key: f"{prefix}_{n}"}


SHAPES: dict[str, tuple[dict[str, Any], Receipt]] = {
    "send": (message_args("send", "feishu:oc_chat", "ping"), fresh_id("messageId", "om")),
    "upload-file": (
        message_args("upload-file", "feishu:oc_chat", "report.pdf"),
        fresh_id("fileId", "f"),
    ),
    "poll": (message_args("poll", "feishu:oc_chat", "Lunch at 12?"), fresh_id("pollId", "pl")),
    "run": (message_args("send", "slack:#ops", "deploy"), fresh_id("runId", "run")),
    "bare id": (
        message_args("send", "qa", "hi"),
        lambda n: {"ok": True, "message": {"id": f"qa_{n}", "text": "hi"}},
    ),
}
PROGRESS: dict[str, tuple[dict[str, Any], Receipt]] = {
    "a poll whose content changes": (
        message_args("read", "job:j1"),
        lambda n: {"ok": True, "jobId": "j1", "done": n},
    ),
    "a listing whose records change": (
        message_args("read", "feishu:oc_chat"),
        lambda n: {"ok": True, "messages": [{"id": f"om_{n}"}, {"id": f"om_{n + 1}"}]},
    ),
}


def message_tool(receipt: Receipt) -> BaseTool:
    counter = itertools.count()

    @tool
    def message(action: str, target: str, text: str = "") -> str:
        """Send, upload or read messages of a chat."""
        if action == "list":
            return json.dumps({"ok": True, "messages": []})
        return json.dumps(receipt(next(counter)))

    return message


def drive(face: str, mode: Any, script: Script, receipt: Receipt) -> list[GuardEvent]:
    events: list[GuardEvent] = []
    agent, extra = guarded_agent(
        face,
        ScriptedChatModel(script=script),
        [message_tool(receipt)],
        on_event=events.append,
        checkpointer=InMemorySaver(),
    )
    config = {**extra, "configurable": {"thread_id": "t"}, "recursion_limit": 80}
    try:
        run(agent, {"messages": [HumanMessage("Tell the team")]}, config, mode)
    except LoopGuardStop:
        assert face == "handler"
    return events


FACES_MODES = faces_and_modes(["middleware", "graph", "handler"], MODES[:2], "middleware")


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_same_send_answered_a_fresh_short_id_is_steered_and_blocked(
    shape: str, face: str, mode: Any
) -> None:
    """21 identical sends scripted: a near-repeat (its ids masked), steered at its 5th run
    and blocked from its 7th, then stopped."""
    args, receipt = SHAPES[shape]
    events = drive(face, mode, stubborn(("message", args)), receipt)
    assert [event.kind for event in events] == ["steer", "block", "block", "block", "stop"]


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_blocked_send_stays_blocked_after_another_call(shape: str, face: str, mode: Any) -> None:
    """7 sends, a listing of the chat, 3 sends more: the sends after the listing are
    blocked still (the sticky case)."""
    args, receipt = SHAPES[shape]
    send, listing = ("message", args), ("message", {"action": "list", "target": "chat"})
    script = sequence(*[[send]] * 7, [listing], *[[send]] * 3)
    events = drive(face, mode, script, receipt)
    kinds = [event.kind for event in events]
    assert kinds[0] == "steer"
    assert kinds.count("block") == 3
    assert kinds[-1] == "stop"


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
@pytest.mark.parametrize("shape", list(PROGRESS))
def test_a_call_whose_answer_changes_beyond_its_ids_stays_progress(
    shape: str, face: str, mode: Any
) -> None:
    args, receipt = PROGRESS[shape]
    script = sequence(*[[("message", args)]] * 12, answer="all read")
    assert drive(face, mode, script, receipt) == []


def test_the_scan_reads_a_recorded_send_loop_alike() -> None:
    """The same sends recorded without the guard: the scan steers and blocks them at the
    calls the live guard does."""
    args, receipt = SHAPES["upload-file"]
    messages: list[BaseMessage] = [HumanMessage("Tell the team")]
    for n in range(12):
        call = {"name": "message", "args": args, "id": f"c{n}", "type": "tool_call"}
        messages += [
            AIMessage("", tool_calls=[call]),
            ToolMessage(json.dumps(receipt(n)), tool_call_id=f"c{n}"),
        ]
    report = scan_conversation(LoopGuardConfig(), Conversation("receipts", messages))
    assert [(f.call_index, f.event.kind) for f in report.findings][:2] == [
        (5, "steer"),
        (7, "block"),
    ]
