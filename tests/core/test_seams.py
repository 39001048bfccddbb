"""The seams between the faces and the session: the reply step every face takes, the exit
behaviours told apart in one module, the final answer the middleware and the node share, and
the model turn's modes."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import get_args

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

import loop_guard
from loop_guard import LoopGuard, LoopGuardStop
from loop_guard._exits import (
    EXIT_BEHAVIORS,
    ExitBehavior,
    FinalAnswer,
    asks_a_person,
    checked,
    ends_with_answer,
    raise_after_run,
    raises,
)
from loop_guard._faces import checked_guard, reply_step
from loop_guard._turn import Calling, Done, Reasking
from loop_guard._values import Block, Proceed, Steer, Stop

PACKAGE = Path(loop_guard.__file__).parent


def reply(n: int, *, path: str = "a.txt") -> AIMessage:
    return AIMessage(
        content="",
        id=f"reply-{n}",
        tool_calls=[{"name": "read_file", "args": {"path": path}, "id": f"call-{n}"}],
    )


def answer(n: int, text: str = "File not found") -> ToolMessage:
    return ToolMessage(text, tool_call_id=f"call-{n}", name="read_file")


def test_the_reply_step_decides_records_and_finishes_a_stubborn_model() -> None:
    """Steered at the warn threshold, blocked from the block threshold on, stopped after
    the blocks: each reply decided in full, its answers recorded and the batch finished."""
    guard = LoopGuard(warn_threshold=2, block_threshold=3, abort_threshold=2)
    session = guard.session("thread-1")
    seen: list[tuple[type, type | None, str | None]] = []
    for n in range(6):
        step = reply_step(guard, session, reply(n), [answer(n)])
        [outcome] = step.calls
        seen.append((type(outcome.verdict), type(step.after), outcome.message))
        if isinstance(step.after, Stop):
            break
    kinds = [(verdict, after) for verdict, after, _ in seen]
    assert kinds == [
        (Proceed, type(None)),
        (Proceed, Steer),
        (Block, type(None)),
        (Block, Stop),
    ]
    assert seen[0][2] is None
    assert seen[2][2] is not None
    assert "was blocked" in seen[2][2]


def test_a_reply_decided_earlier_has_only_its_awaited_answers_recorded() -> None:
    """Given the calls awaited: no verdicts again, and an answer whose call no batch awaits (a call
    the session never saw) is not recorded."""
    guard = LoopGuard(warn_threshold=2)
    session = guard.session("thread-1")
    reply_step(guard, session, reply(0), settle=False, claim=False)
    assert [call.id for call in session.awaiting] == ["call-0"]
    step = reply_step(guard, session, reply(0), [answer(0)], awaiting=session.awaiting)
    assert step.calls == ()
    assert session.awaiting == ()
    assert session.state.counted == 1
    unseen = reply_step(guard, session, reply(9), [answer(9)], awaiting=session.awaiting)
    assert unseen.after is None
    assert session.state.counted == 1
    assert not any(call.id == "call-9" for call in session.latest_calls)


def test_an_unclaimed_step_leaves_the_steer_due() -> None:
    guard = LoopGuard(warn_threshold=2)
    session = guard.session("thread-1")
    for n in range(2):
        step = reply_step(guard, session, reply(n), [answer(n)], claim=False)
        assert step.after is None
    assert session.steer_pending
    assert isinstance(reply_step(guard, session, None).after, Steer)
    assert not session.steer_pending


@pytest.mark.parametrize("error", [ValueError, TypeError])
def test_every_face_checks_its_guard_alike(error: type[Exception]) -> None:
    with pytest.raises(error, match="guard must be a LoopGuard, got dict"):
        checked_guard({}, error)
    guard = LoopGuard()
    assert checked_guard(guard) is guard


def test_the_exit_behaviours_are_told_apart_in_one_place() -> None:
    assert get_args(ExitBehavior) == EXIT_BEHAVIORS
    assert [checked(b) for b in EXIT_BEHAVIORS] == list(EXIT_BEHAVIORS)
    with pytest.raises(ValueError, match="Invalid exit_behavior: 'raise'"):
        checked("raise")
    assert [asks_a_person(b) for b in EXIT_BEHAVIORS] == [False, False, False, True]
    assert [ends_with_answer(b) for b in EXIT_BEHAVIORS] == [False, True, False, False]
    assert [raises(b) for b in EXIT_BEHAVIORS] == [False, False, True, False]
    raise_after_run("error", None)
    stop = _stop()
    raise_after_run("end", stop)
    with pytest.raises(LoopGuardStop):
        raise_after_run("error", stop)
    compared = re.compile(r"exit_behavior\s*(==|!=|in\b|not in\b)")
    elsewhere = [
        path.name
        for path in PACKAGE.glob("*.py")
        if path.name != "_exits.py" and compared.search(path.read_text())
    ]
    assert elsewhere == []
    assert loop_guard.ExitBehavior is ExitBehavior


def _stop() -> Stop:
    guard = LoopGuard(warn_threshold=2, block_threshold=3, abort_threshold=1)
    session = guard.session("thread-1")
    for n in range(5):
        step = reply_step(guard, session, reply(n), [answer(n)])
        if isinstance(step.after, Stop):
            return step.after
    raise AssertionError("never stopped")


def test_the_final_answer_is_asked_after_the_history_and_ends_the_request() -> None:
    """The stop's answers take the place of answers with their ids, the others follow;
    the model's reply ends the request in place of the guard's message, unless it calls
    a tool."""
    withheld = ToolMessage("withheld", tool_call_id="call-1", name="read_file", id="t-1")
    not_run = ToolMessage("not run", tool_call_id="call-2", name="read_file")
    stop_message = AIMessage(content="stopped", name="loop_guard")
    final = FinalAnswer.of(_stop(), [withheld, not_run, stop_message])
    history = [
        HumanMessage("go", id="h-0"),
        ToolMessage("File not found", tool_call_id="call-1", name="read_file", id="t-1"),
    ]
    assert final.prompt(history) == [history[0], withheld, not_run, final.question]
    assert final.ended_with(reply(3)) is None
    ending = final.ended_with(AIMessage(content="Here is what I found."))
    assert ending is not None
    assert ending[:3] == (withheld, not_run, final.question)
    assert ending[-1].name == "loop_guard"


def test_the_turn_modes_are_frozen_records_set_in_two_places() -> None:
    for mode in (Calling, Reasking, Done, FinalAnswer):
        assert mode.__dataclass_params__.frozen  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Reasking(2).reasks_left = 1  # type: ignore[misc]
    tree = ast.parse((PACKAGE / "_turn.py").read_text())
    [turn] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Turn"]
    setters: dict[str, set[str]] = {}
    for method in turn.body:
        if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
            continue
        for node in ast.walk(method):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and isinstance(part.value, ast.Name)
                        and part.value.id == "self"
                    ):
                        setters.setdefault(part.attr, set()).add(method.name)
    assert setters.pop("mode") == {"next_request", "take"}
    assert set(setters) <= {"_sent", "_cut", "_read"}  # the model call's own fields
