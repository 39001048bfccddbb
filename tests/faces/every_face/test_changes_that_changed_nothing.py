"""A change that changed nothing (SPEC §8, a state change between repeats is progress):
an edit answered "the replacement is the same as the original", sent again and again with
other calls between, among them calls that themselves change nothing (a send the
recipient rejects, an edit elsewhere answered the same way). Each of those is a first
call of its args, and used to restart the window after a change, so the repeated edit was
never steered. A state-changing call answered as its earlier run was changed nothing: the
changes made since make no new question of it, and it is steered at its 3rd run, once.
A check repeated after real changes stays a new question. Every face, sync and async, and
the scan. Only the chat model is scripted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopGuardConfig
from loop_guard.scan import Conversation, scan_conversation
from loop_guard.testing import ScriptedChatModel, sequence
from tests.support.agents import MODES, faces_and_modes, guarded_agent, run

NO_CHANGE = "No changes made: the replacement is the same as the original."
EDIT = ("edit_file", {"path": "a.py", "old": "return 1", "new": "return 1"})


@tool
def edit_file(path: str, old: str, new: str) -> str:
    """Replace text in a file."""
    return NO_CHANGE if old == new else f"Edited {path}: {old!r} -> {new!r}."


@tool
def send_message(to: str, text: str) -> str:
    """Send a message."""
    return "Message not sent: the recipient rejected it."


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "def f():\n    return 1\n"


@tool
def run_tests(path: str) -> str:
    """Run the tests."""
    return "1 failed: test_f"


TOOLS: list[BaseTool] = [edit_file, send_message, read_file, run_tests]
Between = Callable[[int], tuple[str, dict[str, Any]]]
BETWEEN: dict[str, Between] = {
    "a send rejected": lambda n: ("send_message", {"to": f"user{n}", "text": "Fixed?"}),
    "an edit elsewhere that changes nothing": lambda n: (
        "edit_file",
        {"path": f"b{n}.py", "old": "x", "new": "x"},
    ),
}


def turns(between: Between) -> list[list[tuple[str, dict[str, Any]]]]:
    """The same edit, then one of the calls between, then a read: 6 rounds."""
    rounds = [[[EDIT], [between(n)], [("read_file", {"path": f"f{n}.py"})]] for n in range(6)]
    return [turn for round_ in rounds for turn in round_]


def edits_before_steer(messages: list[BaseMessage]) -> int:
    edits = 0
    for message in messages:
        if isinstance(message, HumanMessage) and message.name == "loop_guard":
            return edits
        if isinstance(message, ToolMessage) and "LOOP GUARD" in message.text:
            return edits
        if isinstance(message, AIMessage) and [c["args"] for c in message.tool_calls] == [EDIT[1]]:
            edits += 1
    return -1


@pytest.mark.parametrize(
    ("face", "mode"), faces_and_modes(["middleware", "graph", "handler"], MODES[:2], "middleware")
)
@pytest.mark.parametrize("shape", list(BETWEEN))
def test_an_edit_that_changed_nothing_is_steered_at_its_3rd_run(
    shape: str, face: str, mode: Any
) -> None:
    events: list[GuardEvent] = []
    agent, extra = guarded_agent(
        face,
        ScriptedChatModel(script=sequence(*turns(BETWEEN[shape]))),
        TOOLS,
        on_event=events.append,
        checkpointer=InMemorySaver(),
    )
    config = {**extra, "configurable": {"thread_id": "t"}, "recursion_limit": 100}
    messages = run(agent, {"messages": [HumanMessage("Fix f")]}, config, mode)
    assert [(e.kind, e.reason, e.tool) for e in events] == [("steer", "interleaved", "edit_file")]
    assert edits_before_steer(messages) == 3


@pytest.mark.parametrize(
    ("face", "mode"), faces_and_modes(["middleware", "graph", "handler"], MODES[:2], "middleware")
)
def test_a_check_after_each_real_change_stays_a_new_question(face: str, mode: Any) -> None:
    """Real edits, the same red test after each: never steered (catalogue B5)."""
    script = sequence(
        *[
            turn
            for n in range(6)
            for turn in (
                [("edit_file", {"path": "a.py", "old": "return 1", "new": f"return {n + 2}"})],
                [("run_tests", {"path": "tests"})],
            )
        ]
    )
    events: list[GuardEvent] = []
    agent, extra = guarded_agent(
        face, ScriptedChatModel(script=script), TOOLS, on_event=events.append
    )
    run(agent, {"messages": [HumanMessage("Fix f")]}, {**extra, "recursion_limit": 100}, mode)
    assert events == []


def test_the_scan_reads_a_recorded_edit_that_changed_nothing_alike() -> None:
    messages: list[BaseMessage] = [HumanMessage("Fix f")]
    for number, [(name, args)] in enumerate(turns(BETWEEN["a send rejected"])):
        answer = {"edit_file": NO_CHANGE, "send_message": "Message not sent: the recipient "
                  "rejected it.", "read_file": "def f():\n    return 1\n"}[name]  # fmt: skip
        call = {"name": name, "args": args, "id": f"c{number}", "type": "tool_call"}
        messages += [
            AIMessage("", tool_calls=[call]),
            ToolMessage(answer, tool_call_id=f"c{number}"),
        ]
    report = scan_conversation(LoopGuardConfig(), Conversation("edits", messages))
    assert [(f.call_index, f.event.kind, f.event.tool) for f in report.findings] == [
        (7, "steer", "edit_file")
    ]
