"""Providers that reuse tool-call ids: a call is told apart by its response and position.

Some OpenAI-compatible servers answer every turn with the id `call_0` (or `""`, or
`call_0`/`call_1` per turn). The guard must decide exactly as with unique ids, on every
face: steered, blocked and stopped, never left to run until the recursion limit ends it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import LoopGuardConfig, LoopGuardStop
from loop_guard.scan import Conversation, scan_conversation
from loop_guard.testing import Script, ScriptedChatModel, stubborn
from tests.support.agents import (
    LIST_DIR,
    MODES,
    READ_NOTES,
    Mode,
    ToolRuns,
    ask,
    assert_valid_history,
    faces_and_modes,
    guarded_agent,
    make_tools,
    run,
    timeline,
)

IdScheme = Callable[[int, int], str]
SCHEMES: dict[str, IdScheme] = {
    "call_0 every turn": lambda turn, position: "call_0",
    "empty": lambda turn, position: "",
    "per turn": lambda turn, position: f"call_{position}",
}


def reusing(script: Script, scheme: IdScheme) -> Script:
    """`script` with its tool-call ids replaced by the provider's reused ones."""

    def reply(messages: Any, index: int) -> AIMessage:
        message = script(messages, index)
        calls = [
            {**call, "id": scheme(index, position)}
            for position, call in enumerate(message.tool_calls)
        ]
        return message.model_copy(update={"tool_calls": calls})

    return reply


def _agent(face: str, script: Script, runs: ToolRuns) -> tuple[Any, dict[str, Any]]:
    model = ScriptedChatModel(script=script)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}, "recursion_limit": 60}
    agent, extra = guarded_agent(face, model, make_tools(runs), checkpointer=InMemorySaver())
    return agent, {**config, **extra}


def _run(face: str, script: Script, mode: Mode) -> tuple[list[str], int, list[BaseMessage]]:
    """The history's timeline (ending with the stop), the tool runs and the history."""
    runs = ToolRuns()
    agent, config = _agent(face, script, runs)
    try:
        messages = run(agent, ask(), config, mode)
    except LoopGuardStop as stop:  # the handler alone ends a run by raising
        messages = agent.get_state(config).values["messages"]
        return [*timeline(messages), f"raised:{stop}"], sum(runs.counts.values()), messages
    return timeline(messages), sum(runs.counts.values()), messages


FACES = ["middleware", "graph", "handler"]


@pytest.mark.parametrize(("face", "mode"), faces_and_modes(FACES, ["invoke", "ainvoke"], "handler"))
@pytest.mark.parametrize("scheme", ["call_0 every turn", "empty"])
def test_a_reused_id_decides_as_unique_ids_do(face: str, scheme: str, mode: Mode) -> None:
    """One call per turn, always the same id: steered, refused and stopped as with
    unique ids (4 runs, not the recursion limit)."""
    expected, expected_runs, _ = _run(face, stubborn(READ_NOTES), mode)
    assert sum("LOOP GUARD: you have called" in line for line in expected) == 1
    assert sum(line.startswith("tool:error:LOOP GUARD: this call was") for line in expected) == 3
    got, got_runs, messages = _run(face, reusing(stubborn(READ_NOTES), SCHEMES[scheme]), mode)
    assert got == expected
    assert got_runs == expected_runs == 4
    assert "Stopped by loop_guard" in got[-1]
    if scheme != "empty":
        assert_valid_history(messages)


@pytest.mark.parametrize(("face", "mode"), faces_and_modes(FACES, MODES, "handler"))
def test_ids_reused_per_turn_with_parallel_calls(face: str, mode: Mode) -> None:
    """Two parallel calls per turn, `call_0` and `call_1` every turn: the same decisions
    as with unique ids, and every call answered once."""
    expected, expected_runs, _ = _run(face, stubborn(READ_NOTES, LIST_DIR), mode)
    got, got_runs, messages = _run(
        face, reusing(stubborn(READ_NOTES, LIST_DIR), SCHEMES["per turn"]), mode
    )
    # Which sibling's result carries an in-band steer depends on which finished last.
    assert _in_band_steer_moved(got) == _in_band_steer_moved(expected)
    assert got_runs == expected_runs
    assert "Stopped by loop_guard" in got[-1]
    assert_valid_history(messages)


def _in_band_steer_moved(lines: list[str]) -> list[str]:
    """The timeline with any steer inside a tool result moved to its end."""
    moved, steers = [], []
    for line in lines:
        text, _, steer = line.partition("\n\nLOOP GUARD:")
        moved.append(text)
        steers.extend([steer] if steer else [])
    return [*moved, *steers]


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_the_scan_reads_a_history_with_reused_ids(scheme: str) -> None:
    """A recorded history whose responses have no ids and reuse tool-call ids: the scan
    finds the loop where a unique-id history has it."""

    def history(ids: IdScheme) -> list[BaseMessage]:
        name, args = READ_NOTES
        messages: list[BaseMessage] = [HumanMessage("Summarise notes.md")]
        for turn in range(7):
            call_id = ids(turn, 0)
            messages.append(AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}]))
            messages.append(ToolMessage("File not found", tool_call_id=call_id, status="error"))
        return messages

    def found(messages: list[BaseMessage]) -> list[tuple[int, str]]:
        report = scan_conversation(LoopGuardConfig(), Conversation("c", messages))
        return [(f.call_index, f.event.kind) for f in report.findings]

    expected = found(history(lambda turn, position: f"call_{turn}"))
    assert expected == [(3, "steer"), (5, "block"), (6, "block"), (7, "block"), (7, "stop")]
    assert found(history(SCHEMES[scheme])) == expected


def _once_more_beside_another(ids: IdScheme) -> Script:
    """`list_dir(".")` four times, then a response of `list_dir("src")` and the fifth
    `list_dir(".")` (which must be refused), then an answer."""
    same, other = LIST_DIR, ("list_dir", {"path": "src"})

    def script(messages: Any, index: int) -> AIMessage:
        if index > 4:
            return AIMessage("done")
        calls = [same] if index < 4 else [other, same]
        return AIMessage(
            "",
            tool_calls=[
                {"name": name, "args": dict(args), "id": ids(index, n), "type": "tool_call"}
                for n, (name, args) in enumerate(calls)
            ],
        )

    return script


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("face", FACES)
def test_calls_sharing_an_id_within_one_response_are_told_apart(face: str, mode: Mode) -> None:
    """Two calls of one response with the same empty id: the repeated one is refused and
    the new one runs, as with unique ids (the new one is not taken for the repeat, nor
    the repeat for the new one)."""
    results = []
    for ids in (lambda turn, position: f"c{turn}_{position}", SCHEMES["empty"]):
        runs = ToolRuns()
        agent, config = _agent(face, _once_more_beside_another(ids), runs)
        messages = run(agent, ask(), config, mode)
        refused = sum("was blocked" in str(m.content) for m in messages if m.type == "tool")
        lines = sorted(_in_band_steer_moved(timeline(messages)))  # same-id answers: any order
        results.append((runs.counts["list_dir"], refused, lines))
    assert results[1] == results[0]
    assert results[0][:2] == (5, 1)
