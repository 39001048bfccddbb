"""Repeated text: what watching a reply for repetition costs, how it scales, what a cut saves.

`LoopGuardMiddleware` watches every streamed token of a reply (a callback handler feeding a
`TextWatch`) and reads the finished reply whole (`find_repetition`). Measured here:

- **cost**: a healthy 10,000-token reply streamed through `create_agent` (`stream_mode=
  "messages"`) with the middleware, against the same middleware with
  `detect_repeated_text=False` (and no middleware, for context), interleaved; and the check
  alone (the same chunks fed to a `TextWatch`, plus `find_repetition` of the whole reply) as
  a fraction of the guarded run: the steadier number, since it is not a difference of two
  noisy wall times;
- **linearity**: `find_repetition`, and a `TextWatch` fed 4-character chunks, per character
  at growing sizes, on healthy prose and on look-alikes that keep the detector busy;
- **savings**: the chunks a degenerate reply's model generates with the guard (the stream is
  cut) and without one.

Inputs are deterministic: the prose is pseudo-words drawn from SHA-256 digests.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from _harness import Scale, Section, Target, interleave, median, quartiles, ratio, us
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from loop_guard import LoopGuardMiddleware, TextWatch, find_repetition
from loop_guard.testing import ScriptedChatModel, asked_to_answer, steered

CHUNK = 4  # characters per streamed chunk: about a token
NEEDLE = 40  # no stretch of this many characters recurs in the healthy prose


@dataclass(frozen=True)
class Sizes:
    tokens: int  # chunks of the healthy reply streamed through the agent
    rounds: int  # agent runs per variant
    lengths: tuple[int, ...]  # characters, for linearity
    repeats: int  # samples per size, for linearity
    chant_chars: int  # the degenerate reply's length


FULL_SIZES = Sizes(10_000, 15, (10_000, 40_000, 160_000, 640_000), 7, 40_000)
QUICK_SIZES = Sizes(500, 2, (4_000, 16_000), 1, 8_000)

# ---------------------------------------------------------------------------- texts

_CONSONANTS, _VOWELS = "bcdfghklmnprstvz", "aeiou"


def _word(value: int) -> str:
    """A pseudo-word of one to three syllables (about 500,000 of them)."""
    syllables, value = 1 + value % 3, value // 3
    out = []
    for _ in range(syllables):
        out.append(_CONSONANTS[value % 16] + _VOWELS[value // 16 % 5])
        value //= 80
    return "".join(out)


@functools.cache
def healthy_text(length: int) -> str:
    """Varied prose of `length` characters in which no 40-character stretch recurs."""
    parts: list[str] = []
    size = sentence = 0
    while size < length:
        digest = hashlib.sha256(b"sentence %d" % sentence).digest()
        count = 4 + digest[27] % 6  # 4 to 9 words, 3 bytes each
        words = [_word(int.from_bytes(digest[3 * i : 3 * i + 3], "big")) for i in range(count)]
        end = ".\n\n" if digest[28] % 6 == 0 else (", " if digest[28] % 6 == 1 else ". ")
        text = " ".join(words).capitalize() + end
        parts.append(text)
        size += len(text)
        sentence += 1
    text = "".join(parts)[:length]
    stretches = len(text) - NEEDLE + 1
    if len({text[i : i + NEEDLE] for i in range(stretches)}) != stretches:
        raise AssertionError("the healthy prose repeats a 40-character stretch")
    return text


def table_text(length: int) -> str:
    """A table of many similar rows (every row differs from the last in a few digits)."""
    rows = ["| run | job | status | owner | took |\n", "|---|---|---|---|---|\n"]
    size, n = sum(map(len, rows)), 0
    while size < length:
        row = f"| {n:06d} | nightly-build | passed | platform-team | {n * 37 % 997:3d} s |\n"
        rows.append(row)
        size, n = size + len(row), n + 1
    return "".join(rows)[:length]


def newline_runs(length: int) -> str:
    """Runs of 900 newlines, each short of a loop (symbols need 1,000), between lines of
    prose: the detector finds the run's recurrence at every check and must rule it out."""
    prose = healthy_text(length // 10 + 60)  # a line of 60 per 961 characters
    parts, at, size = [], 0, 0
    while size < length:
        line = prose[at : at + 60].replace("\n", " ") + "\n"
        parts += [line, "\n" * 900]
        at, size = at + 60, size + len(line) + 900
    return "".join(parts)[:length]


TEXTS: dict[str, Callable[[int], str]] = {
    "healthy prose": healthy_text,
    "table of similar rows": table_text,
    "newline runs short of a loop": newline_runs,
    "one run of newlines (a loop)": lambda length: "\n" * length,
}

PREFIX = "The build log shows one failing test, test_parse_dates. "
CHANT = "Let me check the file again. "
ANSWER = "The failing test is test_parse_dates; the fix is in dates.py."

# ---------------------------------------------------------------------------- runs


def chunks_of(text: str) -> list[str]:
    return [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)]


def watch_time(chunks: Sequence[str]) -> float:
    """A `TextWatch` fed `chunks`, then finished: seconds."""
    start = time.perf_counter()
    watch = TextWatch()
    for chunk in chunks:
        watch.feed(chunk)
    watch.finish()
    return time.perf_counter() - start


def find_time(text: str) -> float:
    start = time.perf_counter()
    find_repetition(text)
    return time.perf_counter() - start


Script = Callable[[Sequence[BaseMessage], int], AIMessage]


Guard = LoopGuardMiddleware[Any, Any] | None


def stream_run(script: Script, middleware: Guard) -> tuple[float, ScriptedChatModel]:
    """One agent run, its reply streamed in chunks: wall time of the stream, and the model."""
    model = ScriptedChatModel(script=script, chunk_chars=CHUNK)
    agent = create_agent(model, tools=[], middleware=[] if middleware is None else [middleware])
    payload: Any = {"messages": [HumanMessage("Why does the build fail?")]}
    start = time.perf_counter()
    for _ in agent.stream(payload, stream_mode="messages"):
        pass
    return time.perf_counter() - start, model


def guard_spoke(middleware: Guard) -> bool:
    if middleware is None:
        return False
    stats = middleware.guard.stats
    return bool(stats.steers or stats.blocks or stats.stops)


# ---------------------------------------------------------------------------- sections


def cost_rows(sizes: Sizes, section: Section) -> None:
    reply = healthy_text(sizes.tokens * CHUNK)
    chunks = chunks_of(reply)
    problems: set[str] = set()

    def agent_variant(make: Callable[[], Guard]) -> Callable[[], float]:
        def sample() -> float:
            middleware = make()
            seconds, model = stream_run(lambda m, i: AIMessage(reply), middleware)
            if model.chunks != len(chunks) + 1 or guard_spoke(middleware):
                problems.add(f"{model.chunks} chunks generated, the guard spoke")
            return seconds

        return sample

    variants = {
        "check on": agent_variant(LoopGuardMiddleware),
        "check off": agent_variant(lambda: LoopGuardMiddleware(detect_repeated_text=False)),
        "no middleware": agent_variant(lambda: None),
        "check alone": lambda: watch_time(chunks) + find_time(reply),
    }
    samples = interleave(variants, sizes.rounds)
    on, off = samples["check on"], samples["check off"]
    added = [a / b - 1 for a, b in zip(on, off, strict=True)]
    alone = [a / b for a, b in zip(samples["check alone"], on, strict=True)]
    base = median(off)
    labels = {
        "check on": "LoopGuardMiddleware()",
        "check off": "LoopGuardMiddleware(detect_repeated_text=False)",
        "no middleware": "no middleware (context)",
        "check alone": "the check alone: TextWatch fed the chunks + find_repetition",
    }
    for name, label in labels.items():
        value = median(samples[name])
        section.rows.append([label, us(value), us(value / len(chunks)), ratio(value / base)])
    shares = []
    for name, values in (
        ("added by the check: on / off - 1, per round", added),
        ("the check alone / the guarded run, per round", alone),
    ):
        low, high = quartiles(values)
        shares.append([name, f"{median(values):.1%}", f"{low:.1%} … {high:.1%}"])
    section.extra_tables.append(
        ("The check's share of the pipeline:", ["measure", "median", "IQR"], shares)
    )
    for name, values in (("pipeline overhead (on vs off)", added), ("check alone", alone)):
        value = median(values)
        low, high = quartiles(values)
        section.targets.append(
            Target(
                f"repeated-text check, {name}, {sizes.tokens:,}-token streamed reply",
                "≤ 5%",
                f"{value:.1%} (IQR {low:.1%} … {high:.1%})",
                value <= 0.05,
            )
        )
    section.notes += [f"**cost runs not healthy: {p}.**" for p in sorted(problems)]


def linearity_table(sizes: Sizes, section: Section) -> None:
    lengths = sizes.lengths
    rows = []
    for case, make in TEXTS.items():
        texts = {str(n): make(n) for n in lengths}
        found = find_repetition(texts[str(lengths[-1])])
        where = "—" if found is None else f"{found.start:,}"
        chunked = {n: chunks_of(text) for n, text in texts.items()}
        methods: dict[str, dict[str, Callable[[], float]]] = {
            "find_repetition": {n: functools.partial(find_time, t) for n, t in texts.items()},
            f"TextWatch, {CHUNK}-char chunks": {
                n: functools.partial(watch_time, c) for n, c in chunked.items()
            },
        }
        spreads = []
        for method, variants in methods.items():
            samples = interleave(variants, sizes.repeats)
            per_char = [median(samples[str(n)]) / n for n in lengths]
            spreads.append(per_char[-1] / per_char[0])
            rows.append([case, method, *(us(t * 1000) for t in per_char), ratio(spreads[-1])])
            rows[-1].append(where)
        if found is None:
            section.targets.append(
                Target.at_most(
                    f"repetition check linear, {case}: per-character time at {lengths[-1]:,}"
                    f" vs {lengths[0]:,} chars (the worse of the two checks)",
                    1.5,
                    max(spreads),
                )
            )
    columns = ["text", "check", *(f"per 1,000 chars @ {n:,}" for n in lengths)]
    section.extra_tables.append(
        (
            f"Linearity: time per 1,000 characters (median of {sizes.repeats} runs, sizes"
            " interleaved); *largest / smallest* is the per-character time at the largest size"
            " over the smallest's; *loop from* is where a loop was found (the watch stops"
            " looking there), at the largest size.",
            [*columns, "largest / smallest", "loop from"],
            rows,
        )
    )


def savings_table(sizes: Sizes, section: Section) -> None:
    chanting = (PREFIX + CHANT * (sizes.chant_chars // len(CHANT) + 1))[: sizes.chant_chars]

    def until_steered(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        return AIMessage(ANSWER if steered(messages) else chanting)

    def always(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        return AIMessage(ANSWER if asked_to_answer(messages) else chanting)

    seconds, model = stream_run(until_steered, None)
    whole = model.chunks
    rows = [["no middleware", "any", f"{model.calls}", f"{whole:,}", "—", us(seconds)]]
    for label, script in (("stops when steered", until_steered), ("keeps chanting", always)):
        seconds, model = stream_run(script, LoopGuardMiddleware())
        rows.append(
            [
                "LoopGuardMiddleware()",
                label,
                f"{model.calls}",
                f"{model.chunks:,}",
                f"{model.chunks / whole:.1%}",
                us(seconds),
            ]
        )
    section.extra_tables.append(
        (
            f"What a cut saves: a {len(chanting):,}-character reply ({len(PREFIX)} characters"
            f" of prose, then {CHANT.strip()!r} over and over) streamed in {CHUNK}-character"
            " chunks; the chunks the model generated in the whole run (every model call).",
            ["agent", "model", "model calls", "chunks generated", "vs no middleware", "wall"],
            rows,
        )
    )


def run(scale: Scale) -> Section:
    sizes = QUICK_SIZES if scale.quick else FULL_SIZES
    section = Section(
        key="text",
        title="Repeated text",
        what=(
            f"A healthy {sizes.tokens:,}-token reply ({sizes.tokens * CHUNK:,} characters of"
            f" prose, {CHUNK}-character chunks) streamed through `create_agent`"
            ' (`stream_mode="messages"`, no tools), median of'
            f" {sizes.rounds} interleaved runs per variant; *vs check off* is against"
            " `LoopGuardMiddleware(detect_repeated_text=False)`. *The check alone* feeds the"
            " same chunks to a `TextWatch` and reads the finished reply with"
            " `find_repetition`, as the middleware does. The streamed run's wall time moves"
            " by ±20% between identical runs (two threads hand each chunk over), so the"
            " difference *on / off* is noisy; the share of the check alone is the steady"
            " measure (the middleware adds a callback per chunk on top of it)."
        ),
        columns=["variant", "median", "per chunk", "vs check off"],
    )
    cost_rows(sizes, section)
    linearity_table(sizes, section)
    savings_table(sizes, section)
    return section
