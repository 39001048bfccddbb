"""Two loops side by side in one reply (SPEC §8, interleaved repeats): a model that asks,
in every reply, for both `read_file(path="notes.md")` and `list_dir(path=".")`, each
answered alike every time. With the default settings each is a loop of its own: each
runs 4 times and is blocked from its 5th, and the stop comes with the 3rd block, as for
one loop. Pi mode keeps SPEC §4, where only a batch's last call counts. Every face,
sync and async, and the scan of the same loop recorded without the guard. Only the chat
model is scripted."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopGuardConfig, LoopGuardMiddleware, LoopGuardStop
from loop_guard.scan import Conversation, scan_conversation
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support.agents import (
    LIST_DIR,
    MODES,
    READ_NOTES,
    ToolRuns,
    ask,
    assert_valid_history,
    faces_and_modes,
    guarded_agent,
    make_tools,
    run,
)

BOTH = (READ_NOTES, LIST_DIR)
NOTES = "# Notes\nNothing new."


# Before Python 3.11 an async run gives the handler no run context to end it cleanly by.
@pytest.mark.parametrize(
    ("face", "mode"),
    [
        *faces_and_modes(["middleware", "graph"], MODES[:2], needs_context="middleware"),
        *faces_and_modes(["handler"], MODES[:2], needs_context="handler"),
    ],
)
def test_two_loops_side_by_side_are_each_blocked_from_their_5th_run(face: str, mode: Any) -> None:
    runs = ToolRuns()
    events: list[GuardEvent] = []
    model = ScriptedChatModel(script=stubborn(*BOTH))
    agent, extra = guarded_agent(
        face,
        model,
        make_tools(runs, notes=NOTES),
        on_event=events.append,
        checkpointer=InMemorySaver(),
    )
    config = {**extra, "configurable": {"thread_id": "t"}, "recursion_limit": 100}
    try:
        messages = run(agent, ask(), config, mode)
    except LoopGuardStop:
        assert face == "handler"  # the handler ends an agent at the top of a graph so
        messages = list(agent.get_state(config).values["messages"])
    assert dict(runs.counts) == {"read_file": 4, "list_dir": 4}
    kinds = [event.kind for event in events]
    assert kinds[0] == "steer"
    assert "`read_file`" in events[0].message
    assert "`list_dir`" in events[0].message
    assert kinds.count("block") == 3
    assert kinds[-1] == "stop"
    assert {event.tool for event in events if event.kind == "block"} == {"read_file", "list_dir"}
    assert_valid_history(messages)


def stubborn_agent(**options: Any) -> tuple[Any, ToolRuns, list[GuardEvent]]:
    """`create_agent` asking for both calls in every reply, with `LoopGuardMiddleware(**options)`,
    checkpointed; its tools' runs and the guard's events."""
    from langchain.agents import create_agent

    runs = ToolRuns()
    events: list[GuardEvent] = []
    agent = create_agent(
        ScriptedChatModel(script=stubborn(*BOTH)),
        make_tools(runs, notes=NOTES),
        middleware=[LoopGuardMiddleware(on_event=events.append, **options)],
        checkpointer=InMemorySaver(),
    )
    return agent, runs, events


def test_pi_mode_counts_only_the_last_call_of_a_batch() -> None:
    """SPEC §4: `list_dir`, last in each reply, is blocked from its 5th run; `read_file`
    beside it is never blocked."""
    agent, runs, events = stubborn_agent(config=LoopGuardConfig.pi())
    agent.invoke(ask(), {"configurable": {"thread_id": "t"}, "recursion_limit": 100})
    assert runs.counts["list_dir"] == 4
    assert runs.counts["read_file"] > 4
    assert {event.tool for event in events if event.kind == "block"} == {"list_dir"}


def test_the_scan_finds_each_loop_side_by_side() -> None:
    """The same loop recorded without the guard, 8 replies: the scan blocks each call
    from its 5th run and stops with the 3rd block."""
    messages: list[BaseMessage] = [HumanMessage("Summarise notes.md")]
    for reply in range(8):
        calls = [
            {"name": name, "args": args, "id": f"{name}-{reply}", "type": "tool_call"}
            for name, args in BOTH
        ]
        messages.append(AIMessage("", tool_calls=calls))
        messages.append(ToolMessage(NOTES, tool_call_id=f"read_file-{reply}"))
        messages.append(ToolMessage("README.md\nsrc/", tool_call_id=f"list_dir-{reply}"))
    report = scan_conversation(LoopGuardConfig(), Conversation("side", messages))
    blocks = [f for f in report.findings if f.event.kind == "block"]
    assert [(f.call_index, f.event.tool) for f in blocks] == [
        (9, "read_file"),
        (10, "list_dir"),
        (11, "read_file"),
    ]
    stop = report.first("stop")
    assert stop is not None
    assert stop.call_index == 11


def test_with_exit_behavior_ask_the_two_loops_pause_for_a_person_at_the_same_point() -> None:
    """`exit_behavior="ask"`: the same runs and blocks, and the stop pauses the run for a
    person instead of ending it."""
    agent, runs, events = stubborn_agent(exit_behavior="ask")
    state = agent.invoke(ask(), {"configurable": {"thread_id": "t"}, "recursion_limit": 100})
    assert "__interrupt__" in state
    assert dict(runs.counts) == {"read_file": 4, "list_dir": 4}
    assert [event.kind for event in events].count("block") == 3


def test_a_call_beside_another_answered_a_fresh_time_is_a_loop_of_its_own() -> None:
    """A read made beside the listing in every reply, answered the same notes stamped with
    a new time: masked with its earlier runs once it recurs (as a counted call is), it is a
    loop of its own, blocked beside the listing."""
    from langchain.agents import create_agent

    counter = iter(range(100))

    @tool
    def read_notes(path: str) -> str:
        """Read the notes."""
        return f'{{"ok": true, "stamp": "10:00:{next(counter):02d}", "text": "notes"}}'

    events: list[GuardEvent] = []
    calls = (("read_notes", {"path": "notes.md"}), LIST_DIR)
    agent = create_agent(
        ScriptedChatModel(script=stubborn(*calls)),
        [read_notes, *make_tools(ToolRuns())],  # the toolbox's `list_dir` beside it
        middleware=[LoopGuardMiddleware(on_event=events.append)],
    )
    agent.invoke(ask(), {"recursion_limit": 100})
    assert "read_notes" in {event.tool for event in events if event.kind == "block"}
    assert events[-1].kind == "stop"
