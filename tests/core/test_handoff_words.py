"""A handoff's words read back from the history: a state that catches up on a thread from a
point inside it (another process took the thread over) reads what the agent said before its
handoff, as far back as a live face reads it, so it decides as one uninterrupted replay."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loop_guard import LoopGuardConfig
from loop_guard._engine import Engine
from loop_guard._history import replay, up_to_date
from loop_guard._langchain import HANDOFF_KEY

pytestmark = pytest.mark.internals(reason="the history's replay, which every face shares")


def turn(agent: str, words: str, tool: str, number: int, answer: str) -> list[BaseMessage]:
    call = {"name": tool, "args": {}, "id": f"c{number}", "type": "tool_call"}
    metadata = {HANDOFF_KEY: "other"} if tool.startswith("transfer") else {}
    return [
        AIMessage(words, name=agent, tool_calls=[call], id=f"a{number}"),
        ToolMessage(answer, tool_call_id=f"c{number}", id=f"t{number}", response_metadata=metadata),
    ]


def test_a_state_caught_up_from_inside_the_thread_reads_the_words_before_a_handoff() -> None:
    """Alice thinks aloud beside a note, then guesses beside her handoff: the handoff
    carries both. Caught up from a state that saw the handoff's response but not its
    answer (the catch-up reads from that response on), the state is the one a replay of
    the whole thread builds."""
    engine = Engine(LoopGuardConfig())
    history: list[BaseMessage] = [HumanMessage("Guess my number", id="u1")]
    history += turn("alice", "Hmm, between 1 and 100.", "note", 1, "noted")
    history += turn("alice", "Is it 25?", "transfer_to_bob", 2, "Successfully transferred")
    history += turn("bob", "Too low.", "transfer_to_alice", 3, "Successfully transferred")
    whole = replay(engine, "u1", history)
    early = replay(engine, "u1", history[:4])
    caught = up_to_date(engine, early, history)
    assert caught is not None
    assert caught.to_dict() == whole.to_dict()
    without_thought = replay(engine, "u1", [history[0], *history[3:]])
    assert without_thought.recent[0] != whole.recent[1]  # the thought is part of the handoff
