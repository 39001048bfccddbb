"""Small frozen value classes: what goes into the engine and the decisions that come out."""

from __future__ import annotations

import hashlib
import itertools
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, final

from loop_guard._fingerprint import args_fingerprint, result_fingerprint

_anonymous_ids = itertools.count(1)
_new = object.__new__
_set = object.__setattr__  # as a frozen dataclass's own __init__ sets its fields

StopReason = Literal["abort_threshold", "use_terminate"]
"""Why a request was stopped: the setting that stopped it.

- `'abort_threshold'`: that many calls were blocked within one request (see How the
  guard decides: stop).
- `'use_terminate'`: the setting is on and every call of a batch was blocked.
"""

STOP_CODES: dict[StopReason, str] = {"abort_threshold": "abort", "use_terminate": "terminate"}
"""Each stop reason's code: what a snapshot keeps (as earlier versions wrote it, so that
workers of either version read each other's) and what the deprecated `Stop.kind` says."""

Reason = Literal[
    "repeat",
    "cycle",
    "interleaved",
    "returned",
    "unknown_tool",
    "same_error",
    "repeated_text",
    "judge",
]
"""Which detector a steer or block came from.

- `'repeat'`: the same call and result in a row (see How the guard decides: the streak).
- `'cycle'`: a sequence of 2..`max_cycle_period` steps repeated lap after lap.
- `'interleaved'`: the same call and result recurring with other calls between.
- `'returned'`: the model went back to a call it had been steered away from (a
  block with this reason is the steer's backstop).
- `'unknown_tool'`: repeated calls to a tool that does not exist.
- `'same_error'`: a tool returning the identical error whatever its args.
- `'repeated_text'`: a reply that kept repeating a chunk of its own text (its
  decisions' `call.tool` is `REPLY`).
- `'judge'`: the judge model found the agent making no progress (a steer only; its
  `call.tool` is `JUDGE`).
"""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One tool call proposed by the model, compared by name and fingerprint.

    See How the guard decides: words.

    `id` is the model's tool call id, which the call's answer carries. `key` tells the
    call apart from every other call of the conversation: the engine knows calls by it.
    It defaults to the id, but a provider may give every turn's call the same id (or
    none), so adapters key a call by its response and its position in it. A call with
    neither gets a fresh key, so it is always a call of its own.

    Examples:
        >>> a = Call.of("read", {"path": "a.txt", "n": 1.0}, id="call_1")
        >>> a == Call.of("read", {"n": 1, "path": "a.txt"}, id="call_2")
        True
        >>> Call.of("read", {}, id="call_0", key="response-7#0").key
        'response-7#0'
    """

    tool: str
    fingerprint: str
    args: Any = field(default=None, compare=False, repr=False)
    id: str = field(default_factory=lambda: f"loop_guard-{next(_anonymous_ids)}", compare=False)
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.id)

    @classmethod
    def of(cls, tool: str, args: Any, *, id: str | None = None, key: str | None = None) -> Call:
        """Build a call; its fingerprint is the SHA-256 of the canonical JSON of `args`."""
        canonical = args_fingerprint(args).encode("utf-8", "surrogatepass")
        fingerprint = hashlib.sha256(canonical).hexdigest()
        key = key or id or f"loop_guard-{next(_anonymous_ids)}"
        return make_call(tool, fingerprint, args, key if id is None else id, key)


def make_call(tool: str, fingerprint: str, args: Any, id: str, key: str) -> Call:
    """`Call(tool=..., fingerprint=..., args=..., id=..., key=...)`, without the keyword
    packing of a class call, which costs more than setting the fields: `Call.of` and
    the engine's settling each make a call on every step.

    Examples:
        >>> call = make_call("read", "f", {"n": 1}, "call_1", "k")
        >>> call == Call(tool="read", fingerprint="f"), call.args, call.id, call.key
        (True, {'n': 1}, 'call_1', 'k')
    """
    call = _new(Call)
    _set(call, "tool", tool)
    _set(call, "fingerprint", fingerprint)
    _set(call, "args", args)
    _set(call, "id", id)
    _set(call, "key", key)
    return call


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """What a tool returned for a call, reduced to its fingerprint and error flag.

    Examples:
        >>> Result.of("same text") == Result.of([{"type": "text", "text": "same text"}])
        True
        >>> Result.of("same text") == Result.of("same text", is_error=True)
        False
    """

    fingerprint: str
    is_error: bool = False
    available_tools: tuple[str, ...] | None = None
    """Set when the call named a tool that does not exist: the tools that do."""
    variant: str = ""
    """Set when `fingerprint` is of the result with its fresh values masked (ids,
    timestamps, durations; `normalize_fresh`): the result as returned, told apart by a
    short hash, so that a result equal to another only once masked is a near-repeat."""
    error_reported: bool = False
    """Set when the error was read off the result's text (`reports_error`), not signalled
    by the tool: weak evidence, as a tool relaying a page that says "Error:" could
    otherwise get its calls judged broken."""
    masked: Callable[[], Result] | None = field(default=None, compare=False, repr=False)
    """Set when `fingerprint` is of the result as returned, its fresh values not masked
    yet: makes the masked result. Masking costs a pass over the text, so the engine asks
    for it only when the call recurs (a new call cannot be a repeat).

    Examples:
        >>> from loop_guard._volatile import normalize_fresh
        >>> text = "sent, message id 3f2a9c1e"
        >>> result = Result.of(text, masked=lambda: Result.of(normalize_fresh(text)))
        >>> result.masked() == Result.of("sent, message id <id>")
        True
    """

    @classmethod
    def of(
        cls,
        content: Any,
        *,
        is_error: bool = False,
        available_tools: tuple[str, ...] | None = None,
        variant: str = "",
        masked: Callable[[], Result] | None = None,
    ) -> Result:
        """Build a result from a tool's content (text, content blocks or any value)."""
        result = _new(cls)  # as in `make_call`: a result is made on every step
        reported = not is_error and reports_error(content)
        is_error = is_error or reported
        _set(result, "fingerprint", result_fingerprint(content, is_error=is_error))
        _set(result, "is_error", is_error)
        _set(result, "available_tools", available_tools)
        _set(result, "variant", variant)
        _set(result, "error_reported", reported)
        _set(result, "masked", masked)
        return result

    def carrying(self, news: Sequence[str]) -> Result:
        """This result with the new work that came with it from other agents (the task a
        handoff hands over, what the agent it went to reported back): new work is
        progress, so the same answer carrying other news is another result.

        Examples:
            >>> moved = Result.of("Successfully transferred to worker")
            >>> moved.carrying([]) is moved
            True
            >>> moved.carrying(["Found A"]) == moved.carrying(["Found B"])
            False
        """
        if not news:
            return self
        masked = self.masked  # masked later, the result still carries its news
        return replace(
            self,
            fingerprint=result_fingerprint([self.fingerprint, *news], is_error=self.is_error),
            masked=None if masked is None else lambda: masked().carrying(news),
        )


# A tool that returns its failure instead of raising it says so first: "Error: flight
# HAT030 not available", "ERROR:\nParameter `old_str` is required".
_REPORTED_ERROR = re.compile(r"\s*error\b\s*[:!-]", re.IGNORECASE)
REPORTED_HEAD = 64
"""The characters of a result's text that `reports_error` reads."""


def reports_error(content: Any) -> bool:
    """Whether a result's text opens by reporting an error (`"Error: ..."`): such a
    result is an error result, as if the tool had raised.

    Examples:
        >>> reports_error("Error: flight HAT030 not available"), reports_error("0 errors")
        (True, False)
    """
    if not isinstance(content, str):
        return False
    head = content[:1]
    # Most results open with neither: the pattern is not run on every step.
    if head not in "eE" and not head.isspace():
        return False
    return _REPORTED_ERROR.match(content, 0, REPORTED_HEAD) is not None


@final
@dataclass(frozen=True, slots=True)
class LoopCost:
    """What loops cost one request, or every request a guard saw (`GuardStats.cost`).

    *Spent in a loop*: the model responses of a loop the guard stepped into, from the
    loop's first repeat on. A repeat is a counted step that is the step before it (a
    streak), the step one lap back (a cycle), or a step the model was steered away from.
    The unbroken run of repeats that ends in the guard's first steer or block is charged
    when the guard steps in (a run of repeats it never steps into is healthy work,
    charged to nothing); every repeat after that is charged as it comes, until a step
    that is no repeat ends the loop. A response with a blocked call is charged too.
    Each response charged is one model call, the tool runs of its calls that ran and,
    when its message carries `usage_metadata`, its tokens.

    *Saved*: the tool runs the guard prevented (blocked calls, and the calls of a stopped
    request). What a stop saved beyond that is what the loop would have gone on to
    cost: a live guard cannot know it, a recording shows it, so the scan counts the
    model calls, tool runs and tokens a recorded conversation spent after the point
    the guard would have stopped it.

    *Kept out of the context*: what `LoopGuardMiddleware(compact_repeats=True)` kept
    out of what the model was sent, summed over its model calls (each call's input
    counted once); a scan counts what it would keep out of each recorded model call's
    input. Tokens are estimated from the call's reported input tokens (`usage_metadata`)
    and the characters it was sent. `LoopCost` adds up with `+`.

    Attributes:
        model_calls: Model calls spent in loops.
        tool_runs: Tool runs spent in loops.
        tokens: Tokens of those model calls (0 when the messages carry no usage).
        tool_runs_saved: Tool runs prevented (and, in a scan, recorded after the stop).
        model_calls_saved: In a scan, model calls recorded after the stop.
        tokens_saved: In a scan, their tokens.
        chars_kept_out: Characters of repeated results (and of the guard's repeated
            messages) kept out of the model's context by compaction.
        tokens_kept_out: Their tokens, estimated (0 when the model reports no usage).

    Examples:
        >>> total = LoopCost(model_calls=2, tool_runs=2) + LoopCost(1, tool_runs_saved=1)
        >>> total.model_calls, total.tool_runs, total.tool_runs_saved
        (3, 2, 1)
    """

    model_calls: int = 0
    tool_runs: int = 0
    tokens: int = 0
    tool_runs_saved: int = 0
    model_calls_saved: int = 0
    tokens_saved: int = 0
    chars_kept_out: int = 0
    tokens_kept_out: int = 0

    def __add__(self, other: LoopCost) -> LoopCost:
        return LoopCost(
            self.model_calls + other.model_calls,
            self.tool_runs + other.tool_runs,
            self.tokens + other.tokens,
            self.tool_runs_saved + other.tool_runs_saved,
            self.model_calls_saved + other.model_calls_saved,
            self.tokens_saved + other.tokens_saved,
            self.chars_kept_out + other.chars_kept_out,
            self.tokens_kept_out + other.tokens_kept_out,
        )

    def __bool__(self) -> bool:
        return any(self.to_tuple())

    def to_tuple(self) -> tuple[int, int, int, int, int, int, int, int]:
        """The counts in field order (a snapshot's form, `LoopCost(*counts)`)."""
        return (
            self.model_calls,
            self.tool_runs,
            self.tokens,
            self.tool_runs_saved,
            self.model_calls_saved,
            self.tokens_saved,
            self.chars_kept_out,
            self.tokens_kept_out,
        )


NO_COST = LoopCost()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Proceed:
    """Run the call."""

    call: Call


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """Do not run the call; answer it with `message` as an error result."""

    call: Call
    message: str
    streak: int
    blocks: int
    reason: Reason = "repeat"
    cost: LoopCost = field(default=NO_COST, compare=False)
    """What loops cost the request so far, this block included."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Steer:
    """Show the model `message` before its next call (once per streak)."""

    call: Call
    message: str
    streak: int
    reason: Reason = "repeat"
    cost: LoopCost = field(default=NO_COST, compare=False)
    """What loops cost the request so far, the repeats this steer is about included."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """End the request: no further model call; `message` tells the user why."""

    call: Call
    message: str
    streak: int
    blocks: int
    reason: StopReason = "abort_threshold"
    cost: LoopCost = field(default=NO_COST, compare=False)
    """What loops cost the request, up to its end."""

    @property
    def kind(self) -> str:
        """Deprecated: the code of `reason` (`STOP_CODES`); read `reason`."""
        message = "Stop.kind is deprecated: read Stop.reason"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return STOP_CODES[self.reason]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Charge:
    """A cost the request's loops just incurred (see `LoopCost`): counted in the
    guard's stats; nothing for an adapter to do."""

    call: Call
    cost: LoopCost


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """The judge model was asked whether the agent is making progress
    (`LoopGuardMiddleware(judge=...)`): counted in the guard's stats; nothing for an
    adapter to do (a verdict of no progress comes with its `Steer`).

    Attributes:
        call: Names the judge (`call.tool` is `JUDGE`).
        progress: The verdict: `False` when the judge found the agent going round.
        tokens: What the judge's call cost (0 when its reply carries no usage).
        at: The request's counted steps when the judge was asked.
        reason: The judge's own words, for logs (model output: never shown to the agent).
    """

    call: Call
    progress: bool
    tokens: int = 0
    at: int = 0
    reason: str = ""


Decision = Proceed | Block | Steer | Stop | Charge | Judged
"""Everything the engine can decide; adapters act on each with one `match`."""


class LoopGuardStop(RuntimeError):
    """Raised when the guard stopped a request and the run could not end by itself.

    The middleware raises it with `exit_behavior="error"`; tools wrapped by
    `guard_tools` raise it when a call arrives after the request was stopped.

    Attributes:
        stop: The `Stop` decision: its `reason`, the repeated `call`, `blocks`, and the
            `message` for the user.

    Examples:
        >>> stop = Stop(call=Call.of("read", {}), message="why", streak=4, blocks=3)
        >>> str(LoopGuardStop(stop))
        'why'
    """

    def __init__(self, stop: Stop) -> None:
        """Wrap the `Stop` that ended the request."""
        self.stop = stop
        super().__init__(stop.message)
