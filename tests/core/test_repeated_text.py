"""Repeated text inside one reply: the detector on the catalogue of loops and look-alikes
(`tests/support/texts.py`), fed whole and chunk by chunk, and the engine's ladder for a
reply cut for it (steer, blocks, stop), its snapshot and its cost."""

from __future__ import annotations

import random

import pytest

from loop_guard import Block, LoopCost, LoopGuard, LoopGuardConfig, Steer, Stop
from loop_guard._engine import Engine
from loop_guard._messages import REPLY
from loop_guard._repeated_text import TextWatch, find_repetition
from loop_guard._state import RequestState
from loop_guard.testing import GuardDriver, capture_events
from tests.support import slow_except
from tests.support.texts import DIVIDERS, LOOPS, NOT_LOOPS, Text


@pytest.mark.parametrize("text", LOOPS, ids=lambda text: text.name)
def test_every_loop_is_found_after_its_healthy_prefix(text: Text) -> None:
    found = find_repetition(text.text)
    assert found is not None
    assert len(text.prefix) <= found.start < len(text.prefix) + found.period + 200
    assert found.repeats >= 3


@pytest.mark.parametrize("text", NOT_LOOPS, ids=lambda text: text.name)
def test_no_look_alike_is_taken_for_a_loop(text: Text) -> None:
    assert find_repetition(text.text) is None


@pytest.mark.parametrize("size", [1, 3, 7, 64, 1000])
@pytest.mark.parametrize("text", LOOPS + NOT_LOOPS, ids=lambda text: text.name)
def test_streaming_finds_what_the_whole_reply_shows(text: Text, size: int) -> None:
    """Checks come every 64 characters of the reply however it is chunked: a stream finds
    what the whole reply shows, the same repetition, and stops a check after the loop's
    `cut_by` characters of repetition; a look-alike never."""
    watch = TextWatch()
    fed = 0
    for start in range(0, len(text.text), size):
        fed += size
        if watch.feed(text.text[start : start + size]) is not None:
            break
    assert watch.finish() == find_repetition(text.text)
    if watch.found is not None:
        assert fed <= len(text.prefix) + text.cut_by + 2 * watch.found.period + size + 64
        assert fed < len(text.text) or len(text.text) - len(text.prefix) < 5000


@pytest.mark.parametrize("seed", slow_except(range(8), lambda seed: seed == 0))
@pytest.mark.parametrize("text", LOOPS + NOT_LOOPS, ids=lambda text: text.name)
def test_chunks_gathered_until_the_next_check_give_what_each_chunk_does(
    text: Text, seed: int
) -> None:
    """Fed chunk by chunk, or gathered until `due` and fed at once (as the middleware's
    watch does): the same repetition, found at the same chunk."""
    sizes = random.Random(seed).choices(range(1, 20), k=len(text.text))
    chunks, start = [], 0
    for size in sizes:
        if start >= len(text.text):
            break
        chunks.append(text.text[start : start + size])
        start += size
    each, gathering = TextWatch(), TextWatch()
    gathered: list[str] = []
    due = gathering.due
    for index, chunk in enumerate(chunks):
        found_each = each.feed(chunk)
        gathered.append(chunk)
        due -= len(chunk)
        found_gathered = None
        if due <= 0:
            found_gathered = gathering.feed("".join(gathered))
            gathered.clear()
            due = gathering.due
        assert found_gathered == found_each, index
        if found_each is not None:
            break
    else:
        gathering.feed("".join(gathered))
    assert gathering.finish() == each.finish() == find_repetition(text.text)
    assert gathering.length == each.length


def test_the_watch_keeps_a_bounded_tail() -> None:
    """A long reply is not kept whole: the watch holds a window, so its work per check
    does not grow with the reply."""
    watch = TextWatch()
    essay = next(text for text in NOT_LOOPS if text.name == "essay").text
    for _ in range(20):
        assert watch.feed(essay) is None
    assert watch.length == 20 * len(essay)
    assert sum(map(len, watch._pieces)) <= 4 * 1000 + 2 * 2000 + 64


@pytest.mark.parametrize("rest", [1, 40, 63])
def test_the_last_check_of_a_finished_reply_sees_the_whole_window(rest: int) -> None:
    """A reply that ends short of a check: its last check reads a tail as long as every
    other check's, so a repetition first found there is measured in full."""
    watch = TextWatch()
    essay = next(text for text in NOT_LOOPS if text.name == "essay").text
    reply = (essay * (20_000 // len(essay) + 1))[: 20_000 // 64 * 64 + rest]
    assert watch.feed(reply) is None
    window = 4 * 1000 + 2 * 2000
    assert sum(map(len, watch._pieces)) >= window
    assert watch.finish() is None
    assert sum(map(len, watch._pieces)) >= window


def test_min_chars_sets_how_much_repetition_makes_a_loop() -> None:
    text = "Intro. " + "Let me check the config. " * 30  # 750 characters of repetition
    found = find_repetition(text)
    assert found is not None
    assert text[: found.start] == "Intro. Let me check the config."
    assert find_repetition(text, min_chars=2000) is None


def test_a_short_chant_is_cut_at_half_of_min_chars() -> None:
    """A unit of five characters or more, ten times or more: half of `min_chars`."""
    assert find_repetition("Sure. " + "again " * 80) is None  # 480 characters
    assert find_repetition("Sure. " + "again " * 90) is not None  # 540 characters
    assert find_repetition("Sure. " + "Let me check the config again and again. " * 9) is None
    assert find_repetition("Sure. " + " the" * 200) is None  # a unit of four: 1,000
    assert find_repetition("Sure. " + " the" * 260) is not None


def test_a_line_of_code_is_a_short_chant_in_a_block_of_code_only() -> None:
    line = "    total = total + row.amount\n" * 30  # 930 characters
    assert find_repetition("```python\n" + line) is not None
    for data in ("```\n", "```json\n", "```log\n", "Text first.\n```\n"):
        assert find_repetition(data + line) is None, data


def test_symbols_need_a_loop_of_min_chars_and_many_copies() -> None:
    """Symbols alone, the same unit many times: `min_chars`. Fewer copies of a long line
    (a frame's sides) and digits between separators (numbers, matrices) need four times as
    much."""
    assert find_repetition("🎉" * 900) is None
    assert find_repetition("🎉" * 1100) is not None
    side = "|" + " " * 58 + "|\n"  # 60 characters
    assert find_repetition(side * 60) is None  # 3,600 characters, 60 copies
    assert find_repetition(side * 66) is not None
    assert find_repetition("0, " * 1150) is None
    assert find_repetition("0, " * 1400) is not None
    assert find_repetition("ab " * 1200) is not None


@pytest.mark.parametrize("rule", DIVIDERS)
def test_a_divider_streamed_in_chunks_is_layout_and_a_runaway_rule_is_still_cut(rule: str) -> None:
    """1,000 characters of a rule, streamed 50 at a time, are left whole; the same rule
    running on is cut within four times `min_chars`, as data is."""
    watch = TextWatch()
    divider = rule * 1000
    assert all(watch.feed(divider[at : at + 50]) is None for at in range(0, len(divider), 50))
    assert watch.finish() is None
    runaway = TextWatch()
    fed = next((at for at in range(0, 20_000, 50) if runaway.feed(rule * 50) is not None), None)
    assert fed is not None
    assert fed <= 4 * 1000 + 200


def test_a_unit_running_on_in_one_line_is_cut_at_min_chars_in_a_code_block_too() -> None:
    """Digits, letters and spaces back to back, verbatim, with neither line break nor
    punctuation: a runaway whatever its alphabet. A value between separators (a fill of
    zeros) and a whole line (a row) keep the room of data."""
    for unit in ("0123456789012", "1 2 3 4 5 6 7 ", "abcdefghijklm"):
        assert find_repetition("```\n" + unit * (950 // len(unit))) is None, unit
        assert find_repetition("```\n" + unit * (1100 // len(unit))) is not None, unit
    assert find_repetition("0" * 900) is None
    assert find_repetition("0" * 1100) is not None
    for data in ("0 ", "0.0, ", "[0, 0], ", "0,0,0,0,0,0,0,0\n", "0123456789012\n"):
        assert find_repetition("```\n" + data * (3500 // len(data))) is None, data


def counted(line: str, first: int, count: int) -> str:
    """`line` with its `{n}` counting from `first`, `count` times."""
    return "".join(line.format(n=n) for n in range(first, first + count))


STEP = "Step {n}: let me try the same query again.\n"  # 43 characters at two digits


def test_a_sentence_whose_counter_alone_changes_is_cut_at_twice_min_chars() -> None:
    intro = "The query timed out.\n"
    text = intro + counted(STEP, 41, 200)
    found = find_repetition(text)
    assert found is not None
    assert text[: found.start].rstrip() == intro + STEP.format(n=41).rstrip()
    assert found.period == len(STEP.format(n=41))
    assert find_repetition(intro + counted(STEP, 41, 45)) is None  # 1,935 characters
    assert find_repetition(intro + counted(STEP, 41, 50)) is not None  # 2,150
    assert find_repetition(intro + counted(STEP, 41, 50), min_chars=2000) is None


@pytest.mark.parametrize(
    "text",
    [
        "```\n" + counted(STEP, 41, 100) + "```\n",  # quoted in a code block: a log
        counted("| {n} | open | no booking yet. |\n", 10, 80),  # a table's rows
        counted("{n},open,no booking yet\n", 10, 100),  # CSV rows: no sentence
        counted("Open seats {n}\n", 10, 150),  # a label: no sentence
        counted("2025-03-14 09:12:{n} INFO Retrying the connection.\n", 10, 50),  # two numbers
    ],
    ids=["fenced", "table", "csv", "label", "log"],
)
def test_counted_rows_of_data_are_no_loop(text: str) -> None:
    assert find_repetition(text) is None


def test_the_cut_keeps_one_copy_and_ends_at_a_sentence() -> None:
    found = find_repetition("Sure. I will check the file. " + "I will check it again. " * 100)
    assert found is not None
    text = "Sure. I will check the file. " + "I will check it again. " * 100
    assert text[: found.start].rstrip() == "Sure. I will check the file. I will check it again."


def test_a_refrain_between_new_verses_is_no_loop() -> None:
    chorus = "Oh the river runs and the river rolls, and it carries me home.\n"
    verses = "".join(
        f"Verse {n}: the {n}th morning came with a new song about place number {n}.\n" + chorus
        for n in range(40)
    )
    assert find_repetition(verses) is None


# The engine's ladder.


def test_a_cut_reply_steers_then_blocks_then_stops() -> None:
    guard = LoopGuard(abort_threshold=2)
    session = guard.session("t")
    session.start_request("r")
    with capture_events(guard) as events:
        first = session.repeated_text("reply-1", repeats=40, tokens=500)
        assert isinstance(first, Steer)
        assert session.take_steer() == first
        second = session.repeated_text("reply-2", repeats=41, tokens=600)
        assert isinstance(second, Steer)  # the block's message, due the same way
        assert "cut again" in second.message
        third = session.repeated_text("reply-3", repeats=42, tokens=700)
    assert isinstance(third, Stop)
    assert "kept repeating the same text" in third.message
    assert [(e.kind, e.tool, e.reason) for e in events] == [
        ("steer", REPLY, "repeated_text"),
        ("block", REPLY, "repeated_text"),
        ("block", REPLY, "repeated_text"),
        ("stop", REPLY, "abort_threshold"),
    ]
    assert events[-1].cost == LoopCost(model_calls=3, tokens=1800)
    assert guard.stats.calls == 0  # no tool call was decided
    assert session.steer_pending is False  # a stop drops what was due


def test_telling_the_same_reply_twice_changes_nothing() -> None:
    """A retried hook or a history read again tells a reply twice: it counts once."""
    session = LoopGuard().session("t")
    session.start_request("r")
    session.repeated_text("reply-1", repeats=40)
    state = session.state
    session.repeated_text("reply-1", repeats=40)
    assert session.state is state


def test_text_blocks_and_tool_blocks_add_up_to_the_stop() -> None:
    driver = GuardDriver(LoopGuard(abort_threshold=3))
    session = driver.session
    for _ in range(6):  # a streak: steered at 3, blocked at 5 and 6
        driver.step("ls", {}, "same")
    assert session.state.blocks == 2
    session.repeated_text("reply-1", repeats=30)  # the request's first cut: a steer
    assert session.stop is None
    assert isinstance(session.repeated_text("reply-2", repeats=30), Stop)


def test_the_snapshot_keeps_the_cut_replies() -> None:
    engine = Engine(LoopGuardConfig())
    state, _ = engine.repeated_text(RequestState(request_id="r"), "reply-1", 40)
    restored = RequestState.from_dict(state.to_dict())
    assert restored.text_loops == ("reply-1",)
    _, decisions = engine.repeated_text(restored, "reply-1", 40)
    assert decisions == ()
    _, decisions = engine.repeated_text(restored, "reply-2", 40)
    assert [type(d) for d in decisions][-1] is Block


@pytest.mark.parametrize(
    "config",
    [
        LoopGuardConfig(detect_repeated_text=False),
        LoopGuardConfig(enabled=False),
        LoopGuardConfig.pi(),
    ],
    ids=["off", "disabled", "pi"],
)
def test_switched_off_it_decides_nothing(config: LoopGuardConfig) -> None:
    engine = Engine(config)
    state, decisions = engine.repeated_text(RequestState(), "reply-1", 40)
    assert decisions == ()
    assert state.text_loops == ()


def test_configuration_is_checked() -> None:
    with pytest.raises(ValueError, match="repeated_text_chars must be an integer >= 100"):
        LoopGuardConfig(repeated_text_chars=50)
    env = {"LOOP_GUARD_DETECT_REPEATED_TEXT": "off", "LOOP_GUARD_REPEATED_TEXT_CHARS": "2000"}
    config = LoopGuardConfig.from_env(env)
    assert (config.detect_repeated_text, config.repeated_text_chars) == (False, 2000)
