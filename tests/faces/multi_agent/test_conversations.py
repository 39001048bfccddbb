"""What agents say is the work (SPEC §9): two agents taking turns, each writing its words
beside the handoff, are a conversation, not a loop, as long as the words are new; the
same words bounced back and forth are a loop, steered within 3 laps and stopped within 6.
On every face that sees the shared history (`tests/support/talk.py`): a swarm with
`LoopGuardMiddleware` on each agent, the swarm watched by the handler with `guard_tools`
on its handoffs, a network of one's own with `LoopGuardNode`; sync and async; and on a
checkpointed thread taken over mid-chat by agents built afresh, as another worker process
builds them. Only the chat models are scripted."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from loop_guard.marks import GUARD_NAME
from tests.support.agents import FACES, Face, assert_valid_history, blocked, needs_async_context
from tests.support.between import Network
from tests.support.talk import (
    DONE,
    GUESSES,
    NUMBER,
    ROUNDS,
    Chat,
    bounce,
    guessing,
    handoff_to,
    handoffs_run,
    review,
    speakers,
    steered_at,
)

FACES_SYNC = [
    pytest.param(face, sync, id=f"{face}-{'invoke' if sync else 'ainvoke'}",
                 marks=() if sync else needs_async_context)
    for face in FACES
    for sync in (True, False)
]  # fmt: skip


@pytest.mark.parametrize(("face", "sync"), FACES_SYNC)
def test_a_guessing_game_runs_to_its_answer(face: Face, sync: bool) -> None:
    """Alice guesses beside each handoff, bob answers "Too high." or "Too low." beside
    his (the same two phrases over and over): every lap brings a new guess, so the game
    runs its 6 guesses to the answer, with no event."""
    chat = Chat(face, guessing())
    messages = chat.start(sync)
    assert messages[-1].text == NUMBER
    assert handoffs_run(messages) == 2 * len(GUESSES)
    assert chat.events == []
    assert_valid_history(messages)


@pytest.mark.parametrize(("face", "sync"), FACES_SYNC)
def test_review_rounds_run_to_the_final_draft(face: Face, sync: bool) -> None:
    """A writer hands each new draft over, the reviewer hands back comments on it, for 8
    rounds, every message new: the rounds run to the final draft with no event."""
    chat = Chat(face, review(), answer=DONE)
    messages = chat.start(sync)
    assert messages[-1].text == DONE
    assert handoffs_run(messages) == 2 * ROUNDS
    assert chat.events == []
    assert_valid_history(messages)


@pytest.mark.parametrize(("face", "sync"), FACES_SYNC)
def test_the_same_words_bounced_beside_handoffs_are_steered_then_stopped(
    face: Face, sync: bool
) -> None:
    """The same two lines handed back and forth: steered within 3 laps (a lap is a handoff
    each way), stopped within 6, the run at its end with the stop, every call answered."""
    chat = Chat(face, bounce())
    messages = chat.start(sync)
    assert_valid_history(messages)
    steer = steered_at(messages)
    assert steer is not None
    assert handoffs_run(messages[:steer]) <= 2 * 3
    attempted = handoffs_run(messages) + len(blocked(messages))
    assert attempted <= 2 * 6
    assert chat.kinds()[0] == "steer"
    assert chat.kinds()[-1] == "stop"
    assert chat.kinds().count("steer") == 1
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME


def describe(message: BaseMessage) -> str:
    calls = [call["name"] for call in getattr(message, "tool_calls", [])]
    return f"{message.type}:{message.name}:{calls}:{message.text[:60]}"


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("chat_lines", [guessing, bounce], ids=["guessing", "bounce"])
def test_a_chat_taken_over_by_fresh_agents_mid_way_decides_as_one_run(
    face: Face, chat_lines: object, tmp_path: Path
) -> None:
    """The chat pauses before each of bob's turns on SQLite; from the second pause on,
    agents and guards built afresh (as another worker process builds them) take the
    thread over: the history they read decides exactly as one uninterrupted run, the
    guessing game to its answer with no event, the bounced words to the same stop."""
    lines = chat_lines()  # type: ignore[operator]
    reference = Chat(face, lines)
    expected = reference.start(sync=True)

    def saver() -> SqliteSaver:
        return SqliteSaver(sqlite3.connect(tmp_path / "chat.sqlite", check_same_thread=False))

    first = Chat(face, lines, checkpointer=saver(), interrupt_before=["bob"])
    first.start(sync=True)
    first.run(None, sync=True)  # a second pause
    events = list(first.events)
    messages: list[BaseMessage] = []
    for _ in range(30):
        fresh = Chat(face, lines, checkpointer=saver(), interrupt_before=["bob"])
        messages = fresh.run(None, sync=True)
        events.extend(fresh.events)
        if not fresh.app.get_state(fresh.config).next:
            break
    assert [describe(m) for m in messages] == [describe(m) for m in expected]
    assert [(e.kind, e.reason) for e in events] == [(e.kind, e.reason) for e in reference.events]


@pytest.mark.parametrize(
    "sync",
    [pytest.param(True, id="invoke"), pytest.param(False, id="ainvoke", marks=needs_async_context)],
)
def test_a_guessing_game_in_a_network_watched_by_the_handler_runs_to_its_answer(
    sync: bool,
) -> None:
    """A network of one's own watched by the callback handler (no node): its handoffs
    name where they go (`__handoff_destination`), so the handler reads their results,
    words included, from the history; the game runs to its answer with no event."""
    network = Network("handler", scripts=speakers(guessing(), NUMBER), handoff=handoff_to)
    messages = network.run(sync)
    assert messages[-1].text == NUMBER
    assert handoffs_run(messages) == 2 * len(GUESSES)
    assert network.events == []
