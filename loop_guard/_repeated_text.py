"""Repeated text: a reply that keeps repeating a chunk of itself (a sentence, a line, a code
block) until the model's output limit, as a degenerate model does. Pure, no framework.

`TextWatch` follows one reply as it is generated, a chunk at a time, and says where the
repetition began as soon as there is enough of it; `find_repetition` checks a finished
reply the same way.

How a repetition is recognised. Every `_CHECK_EVERY` characters the watch takes the last
`_NEEDLE` characters of the reply and looks for them earlier on (within `_MAX_PERIOD`).
Found, the distance is the repeated unit's length, and the reply's tail is either

- *exact*: the same unit back to back (the distance holds for the whole tail), or
- *near*: made of a few sentences or lines only (at most `_VARIANTS`), in any order,
  each many times: one anchor sentence followed by one of a few variants; or
- *counted*: the same sentence back to back but for its counter ("Step 41: let me try
  again." then "Step 42: …"), found as an exact unit once digits are masked.

Either is a loop once it covers `min_chars` characters, the unit having come at least three
times (near: `_NEAR_OCCURRENCES` sentences). What looks repetitive and is not stays below
that: a table's or a list's rows differ, code repeats a line here and there, a refrain
comes back after a new verse, a divider is short. Data needs four times as much: a unit
without a letter, or inside a code block. Exact repetitions are runaways sooner:

- a *chant*, a unit of `_CHANT_UNIT` characters or more with a letter, `_CHANT_COPIES`
  times or more, outside a code block (or a whole line of code, in a block of a
  programming language): half of `min_chars`;
- *symbols*, a unit with neither letter nor digit (emoji, an ASCII art line)
  `_SYMBOL_COPIES` times or more: `min_chars`. A frame's sides come fewer times, and
  digits are numbers: they keep the room of data. So does *formatting*, whitespace alone,
  or a unit within one line of spaces, rule characters (`-`, `=`, `*`, `_`, `+`, `~`,
  `#`, `.`, `:`, `|`) and box drawing (`─`, `━`): a horizontal rule or padding is the
  layout of an answer, not a model repeating itself, and a 1,000-character divider is
  left whole (empty bullets, one per line, are not layout);
- a *run-on*, a unit of words, numbers and spaces only that is not one value between
  spaces ("0123456789012" or "1 2 3 4 5 6 7 " over and over), in a code block too:
  `min_chars`. Its copies run together in one line with nothing between them, where data
  has separators: a fill of zeros between spaces or commas, rows, objects, tags.

A counted sentence needs `_COUNTED_FACTOR` times `min_chars`, outside a code block, and a
sentence with one number: three words or more, a sentence's end and no table's pipes. Logs
are quoted in code blocks and their lines hold several numbers; rows of data are no
sentences.

The work per check is bounded by the window it looks at (C string searches and
comparisons), so watching a reply costs time linear in its length.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import final

_NEEDLE = 40  # characters whose recurrence marks a candidate repetition
_MAX_PERIOD = 2000  # the longest repeated unit looked for, in characters
_CHECK_EVERY = 64  # characters generated between two checks
_RECENT = _NEEDLE + _MAX_PERIOD  # the tail a check looks at first: the needle, and before it
_NEAR_OCCURRENCES = 10  # sentences that make a near-repetition, at least
_VARIANTS = 4  # different sentences a near-repetition may have, at most
_SYMBOLS_FACTOR = 4  # how much more text a unit of symbols only must cover
_CHANT_UNIT = 5  # characters of a unit that makes a chant, at least
_CHANT_COPIES = 10  # copies of it back to back, at least
_SYMBOL_COPIES = 64  # copies of a unit of symbols that make a runaway, at least
_COUNTED_FACTOR = 2  # how much more text a sentence whose counter alone changes must cover
_LETTER = re.compile(r"[^\W\d_]")  # a letter, in any script
_DIGIT = re.compile(r"\d")
# Layout: a rule or padding within one line (spaces, the characters of rules and tables,
# box drawing, block elements), or whitespace alone.
_FORMATTING = re.compile(r"[ \t\-=*_+~#.:|\u2500-\u259f]+|\s+")
_WORDS = re.compile(r"[^\W\d_]+")
_PLAIN = re.compile(r"[\w \t]+")  # words, numbers and spaces: no punctuation, no line break
_NUMBER = re.compile(r"[0-9]+")
_NOT_WORD = re.compile(r"\W")
# Digits masked, so that the copies of a sentence that differ in a counter alone are alike.
# Every ASCII character is in the table (most map to themselves): none is looked up in vain.
_MASK_DIGITS = str.maketrans({chr(c): "0" if "1" <= chr(c) <= "9" else chr(c) for c in range(128)})
_MASK_ASCII_DIGITS = bytes.maketrans(b"123456789", b"000000000")  # the same, for ASCII text
_SENTENCE_WORDS = 3  # words of a sentence, at least: most pieces of a near-repetition are
_FENCE = "```"  # opens and closes a markdown code block
_FENCE_TAG = re.compile(r"```[ \t]*([^\s`]*)")  # a code block's opening, and its language
# Code blocks that quote data, output or markup, where a line may well repeat verbatim.
_DATA_TAGS = frozenset(
    {"", "json", "jsonl", "yaml", "yml", "toml", "csv", "tsv", "xml", "html", "text", "txt",
     "plaintext", "log", "console", "output", "shell-session", "diff", "markdown", "md"}
)  # fmt: skip
_ENDS = ".!?\u3002\uff01\uff1f"  # what ends a sentence, in Latin and CJK script
# A sentence or a line, with its closing punctuation (no backtracking over blank lines).
_PIECE = re.compile(rf"[^\n{_ENDS}]+[{_ENDS}]*")
# Where a cut may end: after a line break or a sentence's end, so the text kept reads whole.
_BOUNDARY = re.compile(rf"\n|[{_ENDS}](?=\s)|\s")
# A sentence's end: Latin punctuation before a space, CJK punctuation anywhere.
_SENTENCE_END = re.compile(r"[.!?](?=\s)|[\u3002\uff01\uff1f]")

DEFAULT_MIN_CHARS = 1000
"""The repeated text, back to back, that makes a loop by default (about 250 tokens)."""


@final
@dataclass(frozen=True, slots=True)
class Repetition:
    """Where a reply began repeating itself.

    Attributes:
        start: Where the first repeat begins: the reply's first `start` characters are
            what it said before, with one copy of the repeated text; the rest repeats it.
        period: The repeated unit's length, in characters.
        repeats: How many times the unit was there when it was found (at least 3).

    Examples:
        >>> found = find_repetition("Hello. " + "I am done. " * 200)
        >>> found.period, found.start
        (11, 17)
    """

    start: int
    period: int
    repeats: int


@final
class TextWatch:
    """Follows one reply as it is generated and finds where it starts repeating itself.

    Feed it the reply's text chunk by chunk (`feed`), then `finish`; each returns the
    `Repetition` once one is found (and the same one after that). It keeps only the tail
    of the reply that a repetition can span.

    Args:
        min_chars: The repeated text, back to back, that makes a loop.

    Examples:
        >>> watch = TextWatch()
        >>> found = None
        >>> for n in range(400):
        ...     found = found or watch.feed("Let me check again. ")
        >>> found.start, found.repeats
        (20, 25)
    """

    __slots__ = (
        "_checked",
        "_fences",
        "_min_chars",
        "_pending",
        "_pieces",
        "_recent",
        "due",
        "found",
    )

    def __init__(self, min_chars: int = DEFAULT_MIN_CHARS) -> None:
        self._min_chars = min_chars
        # The tail kept: enough for the longest repetition to be recognised, and its unit,
        # as the texts checked (each `_CHECK_EVERY` characters: so many of them hold it),
        # joined only when its end may repeat; and the recent characters, where a check
        # looks first.
        window = _SYMBOLS_FACTOR * min_chars + 2 * _MAX_PERIOD
        self._pieces: deque[str] = deque(maxlen=-(-window // _CHECK_EVERY))
        self._recent = ""  # at least the last `_RECENT` characters checked, at most twice
        self._checked = 0  # characters of the reply checked
        self._fences = 0  # code fences in them
        self._pending: list[str] = []  # the text since the last check
        self.due = _CHECK_EVERY
        """Characters to come before the next check. Checks come every `_CHECK_EVERY`
        characters of the reply, however it is chunked, so gathering chunks until `due`
        and feeding them at once gives what feeding each would. Once a repetition is
        found, nothing more is checked and `due` means nothing."""
        self.found: Repetition | None = None
        """The repetition found, once found."""

    @property
    def length(self) -> int:
        """Characters fed so far."""
        return self._checked + _CHECK_EVERY - self.due

    def feed(self, chunk: str) -> Repetition | None:
        """Add the next chunk of the reply; the repetition, once there is one."""
        if self.found is None:
            self._pending.append(chunk)
            self.due -= len(chunk)
            if self.due <= 0:
                self._check_due()
        return self.found

    def finish(self) -> Repetition | None:
        """The reply is complete: check what came since the last check."""
        if self.found is None and self.due < _CHECK_EVERY:
            # The last text is short of a piece: the tail keeps the piece it would push
            # out, so that it still spans the whole window.
            self._pieces = deque(self._pieces, maxlen=len(self._pieces) + 1)
            self._check("".join(self._pending))
            self._pending.clear()
            self.due = _CHECK_EVERY
        return self.found

    def _check_due(self) -> None:
        """Check at each multiple of `_CHECK_EVERY` characters the text pending reaches,
        until a repetition is found; the rest waits for the next check."""
        pending = self._pending
        text = "".join(pending)
        pending.clear()
        start = 0
        while len(text) - start >= _CHECK_EVERY and self.found is None:
            # The common case, a text of exactly `_CHECK_EVERY`: a slice of it whole is
            # the text itself, no copy.
            self._check(text[start : start + _CHECK_EVERY])
            start += _CHECK_EVERY
        rest = text[start:]
        if rest:
            pending.append(rest)
        self.due = _CHECK_EVERY - len(rest)

    def _check(self, new: str) -> None:
        recent = self._recent + new
        if "`" in new:  # a fence that ends in the new text has a backtick there
            # The two characters before may begin it; alone they hold none.
            self._fences += recent[-len(new) - 2 :].count(_FENCE)
        self._checked += len(new)
        self._pieces.append(new)
        if len(recent) > 2 * _RECENT:  # cut back now and then: one copy a check, not two
            recent = recent[-_RECENT:]
        self._recent = recent
        needle = recent[-_NEEDLE:]
        # The common case, on the recent text alone: its last words are new, and so they
        # are with digits masked (without a digit, they are their own mask), or they end no
        # counted sentence.
        if recent.rfind(needle, -_RECENT, -1) < 0 and (
            _mask_digits(needle) == needle
            or _counter_period(last := recent[-_RECENT:], _mask_digits(last)) is None
        ):
            return
        tail = "".join(self._pieces)
        found = _repetition_at_end(tail, self._min_chars, self._fences)
        if found is not None:
            offset = self._checked - len(tail)  # where the tail begins in the reply
            self.found = Repetition(found.start + offset, found.period, found.repeats)


def find_repetition(text: str, min_chars: int = DEFAULT_MIN_CHARS) -> Repetition | None:
    """Where a finished reply began repeating itself, or `None` when it did not.

    It is read as if it were generated, so a repetition is found where a watch of the
    generation would have found it (`TextWatch`).

    Examples:
        >>> find_repetition("| a | 1 |\\n| b | 2 |\\n") is None
        True
        >>> find_repetition("ok " * 1000).period
        3
    """
    watch = TextWatch(min_chars)
    watch.feed(text)
    return watch.finish()


def _repetition_at_end(text: str, min_chars: int, fences: int) -> Repetition | None:
    """The repetition `text` ends in, if it is long enough to be a loop; `fences`: the
    code fences of the reply up to the end of `text`."""
    if len(text) < 2 * _NEEDLE:
        return None
    fences -= text.count(_FENCE)  # those before `text`: counted only for a candidate
    period = _period(text)
    if period is not None:
        found = _exact(text, period, min_chars, fences) or _near(text, min_chars, fences)
        if found is not None:
            return found
    return _counted(text, min_chars, fences)


def _period(text: str) -> int | None:
    """How far back the last `_NEEDLE` characters of `text` came before, nearest first (it
    may overlap them, for a short unit); `None` when they are new."""
    needle_at = len(text) - _NEEDLE
    previous = text.rfind(text[needle_at:], max(0, needle_at - _MAX_PERIOD), len(text) - 1)
    return None if previous < 0 else needle_at - previous


def _exact(text: str, period: int, min_chars: int, fences: int) -> Repetition | None:
    """The unit of `period` characters back to back at the end of `text`, if it covers
    enough."""
    covered = _covered(text, period)
    if covered < 3 * period or covered < _needed(text, period, covered, min_chars, fences):
        return None
    start = len(text) - covered + period
    return Repetition(_boundary(text, start, period), period, covered // period)


def _covered(text: str, period: int) -> int:
    """The characters at the end of `text` that are a unit of `period` characters back to
    back: the tail that equals the text one period before it, and that unit before it."""
    room = len(text) - period  # the longest tail that has text one period before it
    holds, fails = _NEEDLE, room + 1  # the needle's recurrence says `holds` holds
    # Gallop, then halve: a few comparisons, each a C memcmp.
    while holds < room:
        probe = min(2 * holds, room)
        if not _periodic(text, period, probe):
            fails = probe
            break
        holds = probe
    while fails - holds > 1 and holds < room:
        middle = (holds + fails) // 2
        if _periodic(text, period, middle):
            holds = middle
        else:
            fails = middle
    return holds + period


def _periodic(text: str, period: int, length: int) -> bool:
    """Whether the last `length` characters equal the `length` before them by `period`."""
    end = len(text)
    return text[end - length :] == text[end - length - period : end - period]


def _near(text: str, min_chars: int, fences: int) -> Repetition | None:
    """The last `min_chars` of `text` (four times as many in a code block) made of a few
    sentences only, in any order, each many times: the tail a model stuck between a few
    phrasings ends in. Most of them must be sentences: bare labels and values are data."""
    span = min_chars
    if len(text) < span:
        return None
    if _fenced(text, len(text) - span, fences):
        span *= _SYMBOLS_FACTOR
        if len(text) < span:
            return None
    pieces = _PIECE.findall(text, len(text) - span)[1:]  # the first may be cut
    if len(pieces) < _NEAR_OCCURRENCES:
        return None
    said = {piece.strip() for piece in pieces}
    if len(said) > _VARIANTS:
        return None
    sentences = sum(len(_WORDS.findall(piece)) >= _SENTENCE_WORDS for piece in pieces)
    if 2 * sentences < len(pieces):
        return None  # most are bare labels or values, not sentences
    # Where it began: back to the first of the sentences that are all among those few.
    found = [(match.start(), match.group().strip()) for match in _PIECE.finditer(text)]
    begin = len(found)
    while begin > 1 and found[begin - 1][1] in said:
        begin -= 1
    first: set[str] = set()
    for index in range(begin, len(found)):
        start, piece = found[index]
        if piece in first:  # one copy of each is kept
            period = start - found[begin][0]
            return Repetition(start, period, len(found) - begin)
        first.add(piece)
    return None


def _counted(text: str, min_chars: int, fences: int) -> Repetition | None:
    """The sentence a model keeps saying with only a counter changing ("Step 41: let me
    try again.", "Step 42: let me try again.", …): the unit back to back at the end of
    `text` once digits are masked, over twice `min_chars`, outside a code block, and a
    sentence with one number (`_counter_sentence`). Logs are quoted in code blocks, a log
    line holds several numbers, and rows of data are no sentences."""
    span = _COUNTED_FACTOR * min_chars
    if len(text) < span:
        return None
    period = _counter_period(text, _mask_digits(text[-_RECENT:]))
    if period is None:
        return None
    covered = _covered(_mask_digits(text), period)
    start = len(text) - covered
    if covered < max(span, 3 * period) or _fenced(text, start, fences):
        return None
    return Repetition(_boundary(text, start + period, period), period, covered // period)


def _mask_digits(text: str) -> str:
    """`text` with the digits 1 to 9 turned to 0: alike but for their numbers, the copies
    of a counted sentence are equal."""
    if text.isascii():  # a table of bytes: a fraction of the work of a mapping's lookups
        return text.encode("ascii").translate(_MASK_ASCII_DIGITS).decode("ascii")
    return text.translate(_MASK_DIGITS)


def _counter_period(text: str, masked: str) -> int | None:
    """The unit's length, when the end of `text` repeats a sentence with a counter, numbers
    aside; `masked`: the end of `text` with its digits masked."""
    period = _period(masked)
    return period if period is not None and _counter_sentence(text[-period:]) else None


def _counter_sentence(unit: str) -> bool:
    """Whether `unit`, a repeated unit, is a sentence with a counter: one number, three
    words or more, a sentence's end, and no table's pipes."""
    if "|" in unit:
        return False
    # The unit turned to begin after a character that is no part of a word or a number,
    # so that none of them is split between its two ends.
    cut = _NOT_WORD.search(unit)
    if cut is None:
        return False
    turned = unit[cut.end() :] + unit[: cut.end()]
    return (
        len(_NUMBER.findall(turned)) == 1
        and len(_WORDS.findall(turned)) >= _SENTENCE_WORDS
        and _SENTENCE_END.search(turned + turned[:1]) is not None
    )


def _needed(text: str, period: int, covered: int, min_chars: int, fences: int) -> int:
    """The text that the unit of `period` characters ending `text`, back to back over
    `covered` characters, must cover to make a loop: half of `min_chars` for a chant,
    `min_chars` for prose, for many copies of symbols and for a unit that runs on in one
    line (`_runs_on`), four times as much for other data (a unit without a letter:
    dividers, matrices, dumps; anything in a code block but a line of code: logs, traces
    and data are quoted there)."""
    unit = text[len(text) - period :]
    copies = covered // period
    start = len(text) - covered
    data = min_chars if _runs_on(unit) else _SYMBOLS_FACTOR * min_chars
    if not _LETTER.search(unit):
        if _FORMATTING.fullmatch(unit):
            return _SYMBOLS_FACTOR * min_chars
        many_symbols = copies >= _SYMBOL_COPIES and not _DIGIT.search(unit)
        return min_chars if many_symbols else data
    fenced = _fenced(text, start, fences)
    chant = period >= _CHANT_UNIT and copies >= _CHANT_COPIES
    if chant and (not fenced or ("\n" in unit and _in_code(text, start))):
        return min_chars // 2
    return data if fenced else min_chars


def _runs_on(unit: str) -> bool:
    """Whether copies of `unit` back to back run on in one line with no separator but
    spaces: made of words, numbers and spaces only, and not one value between spaces. Data
    has its separators: a fill of zeros ("0 0 0", "0.0, 0.0"), rows, objects, tags."""
    if not _PLAIN.fullmatch(unit):
        return False
    values = set(unit.split())
    return len(values) != 1 or unit in values


def _fenced(text: str, at: int, fences: int) -> bool:
    """Whether position `at` of `text` is inside a code block (`fences` before `text`)."""
    return (fences + text.count(_FENCE, 0, at)) % 2 == 1


def _in_code(text: str, at: int) -> bool:
    """Whether the code block position `at` of `text` is in was opened, within `text`,
    with the name of a programming language (not of data or output)."""
    opened = text.rfind(_FENCE, 0, at)
    if opened < 0:
        return False  # opened before the window: taken as data
    tag = _FENCE_TAG.match(text, opened)
    return tag is not None and tag.group(1).lower() not in _DATA_TAGS


def _boundary(text: str, start: int, period: int) -> int:
    """`start` moved on to the next line or sentence end within one unit, if any, so that
    the text kept ends where a sentence or a line does."""
    if start <= 0 or text[start - 1] in "\n .!?":
        return start
    found = _BOUNDARY.search(text, start, start + min(period, 200))
    return found.end() if found is not None else start
