"""What the engine remembers about one request of one conversation, and its snapshot.

The engine (`_engine.py`) is the only code that makes a new state; this module holds
the state's shape and its JSON-safe form, so a checkpointed snapshot and the live
state are one type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, final

from loop_guard import _messages
from loop_guard._values import (
    NO_COST,
    STOP_CODES,
    Block,
    Call,
    LoopCost,
    Result,
    Steer,
    StopReason,
)


class Outcome(Enum):
    """What became of a batch entry that has no result to count (a result is an `Answer`).

    No outcome (`None`): the call was not checked yet.
    """

    ALLOWED = "allowed"  # checked and let through; no result yet
    BLOCKED = "blocked"  # blocked (counted toward the stop)
    NOT_RUN = "not_run"  # not run because the request had stopped (not counted)
    IGNORED = "ignored"  # a result the guard does not see (ignored tool or error)


ALLOWED, BLOCKED, NOT_RUN, IGNORED = Outcome  # compared by identity on every step
# An outcome's snapshot value, read without the enum's `value` descriptor (every step).
_OUTCOME_VALUES = {outcome: outcome.value for outcome in Outcome}

ERROR = "!"  # prefixed to an error result's fingerprint in a step: steps know their errors
# Prefixed to the fingerprint of a result taken as returned, its fresh values not masked:
# its call was new to the request (`Engine.record_result` masks it once the call recurs).
EXACT = "="
_NEAR = "~"  # between an answer's result and its variant, in a snapshot


class Answer(NamedTuple):
    """A result as its batch entry keeps it: what the step it makes compares."""

    result: str  # the result fingerprint, `ERROR`-prefixed for an error
    variant: str = ""  # the result as returned, when masked (`Result.variant`)
    # An error read off the result's text ("Error: ..."), not signalled by the tool: a
    # tool relaying text cannot tell its own failure from a page that says so. Weak
    # evidence (see `Failing.weak`).
    reported: bool = False

    @classmethod
    def of(cls, result: Result) -> Answer:
        """The answer a `Result` makes."""
        if result.is_error:
            return cls(ERROR + result.fingerprint, result.variant, result.error_reported)
        return cls(result.fingerprint, result.variant)

    @property
    def is_error(self) -> bool:
        """Whether the call failed."""
        return self.result.startswith(ERROR)


# The args fingerprint of every call to a tool that does not exist: args do not matter.
UNKNOWN_ARGS = "unknown-tool"
# The args fingerprint of every failing call to a tool that fails whatever its args.
SAME_ERROR_ARGS = "same-error"


class Entry(NamedTuple):
    """A call of the open batch and what became of it so far (a tuple: made often)."""

    call: Call
    outcome: Outcome | Answer | None = None  # `None`: not checked yet
    block: Block | None = None  # the verdict of a blocked call, for siblings asking again

    @property
    def unanswered(self) -> bool:
        """Whether the call still waits for its result: not checked, or let through."""
        outcome = self.outcome
        return outcome is None or outcome is ALLOWED


class Steered(NamedTuple):
    """A step the model was steered away from in this request (ignored steering)."""

    step: Step
    level: int  # the streak a return resumes from; 0: a return must not resume a streak
    again: bool  # steered a second time already, on a return
    seen: int  # identical runs so far in this request, toward the backstop
    limit: int  # the run that is blocked, when not the tool's backstop (0): a cycle's


class Failing(NamedTuple):
    """The one error a tool has returned for every call since it last did anything else."""

    tool: str
    error: str  # the error's result, as its steps compare it (`Answer.result`)
    args: tuple[str, ...]  # the first few args fingerprints it answered: were they varied?
    calls: int  # calls of the tool it answered in a row
    # Weak evidence: a shell's exit status, an error read off the result's text, or
    # errors alike only once what they quote of their input was masked. Steered once,
    # never blocked.
    weak: bool = False


class Step(NamedTuple):
    """A counted (call, result) pair: the unit a streak is made of.

    See How the guard decides: words, and the streak.

    A tuple: steps are compared on every counted step, against the last one and the
    recent ones, and a tuple compares in C.
    """

    tool: str
    args: str  # the args fingerprint
    result: str  # the result fingerprint


@final
@dataclass(slots=True, kw_only=True)
class RequestState:
    """Everything the guard remembers about one request of one conversation.

    Treated as immutable: the engine never changes a state it was given or handed out;
    a transition changes only its own fresh copy (`clone`) before returning it. Not
    `frozen=True`, so that the copy can be changed in place: a step would otherwise
    build several new states. `to_dict`/`from_dict` give a JSON-safe form for
    checkpointing.
    """

    request_id: str | None = None
    last: Step | None = None
    streak: int = 0
    variant: str = ""  # the last step's result as returned, when masked (`Result.variant`)
    near: bool = False  # the streak holds results equal only once masked: near-repeats
    warned: bool = False
    blocks: int = 0
    steer: Steer | None = None  # due before the model's next call
    stopped: StopReason | None = None
    stop_tool: str = ""
    batch: tuple[Entry, ...] = ()
    batch_explicit: bool = False
    settled: tuple[Entry, ...] = ()  # the last settled batch: late siblings ask it
    # Beyond Pi (see How the guard decides: beyond the Pi extension): the last counted steps
    # of the request, for cycles and interleaved repeats.
    recent: tuple[Step, ...] = ()
    counted: int = 0  # steps counted in this request
    runs: tuple[int, ...] = ()  # per cycle period 2, 3, ...: steps matching one period back
    cycle_warned: bool = False
    # The calls beside the counted one in the last batches, each with the batches in a
    # row it came back with the same result in: a call repeated side by side in every
    # batch is a loop of its own (see How the guard decides: interleaved repeats).
    beside: tuple[tuple[Step, int], ...] = ()
    # Level 0 when a return must not resume a streak: a cycle's steps (the cycle
    # escalates) and interleaved repeats. Every entry counts toward its backstop.
    steered: tuple[Steered, ...] = ()
    unknown: tuple[str, ...] = ()  # tools found not to exist
    available: tuple[str, ...] = ()  # the tools that do, as the tool node listed them
    failing: tuple[Failing, ...] = ()
    # Successful calls that changed something (an edit, a write, a send), newest last
    # (they outlive a request), and the steps counted since the newest was new in this
    # request: a check repeated after a change asks a new question.
    changes: tuple[Step, ...] = ()
    since_change: int = -1  # -1: no new change in this request
    # What each of the last requests counted since its last change, newest last: a call
    # and result met in several user turns is a repeat, each turn counting once.
    turns: tuple[tuple[Step, ...], ...] = ()
    # The fingerprint of the user message that began the request ("" when unknown), and
    # whether it is the previous request's again: only a turn that brings nothing new
    # counts what earlier turns did (a new question may well need the same lookup).
    question: str = ""
    asked_again: bool = False
    # What loops cost (see `LoopCost`): charged so far; the run of repeats not yet
    # charged (charged when the guard steps in); whether the guard stepped into the loop
    # the last steps belong to; the tokens of the open batch's response.
    cost: LoopCost = NO_COST
    unpaid: LoopCost = NO_COST
    looping: bool = False
    batch_tokens: int = 0
    # A person let the stopped request go on (`exit_behavior="ask"`): how often, and the
    # blocks it must reach before it may stop again (the gap doubles with each answer).
    resumed: int = 0
    rearm: int = 0
    # The replies (by message id) cut for repeating their own text in this request.
    text_loops: tuple[str, ...] = ()
    judged_at: int = 0  # counted steps when the judge was last asked in this request

    @property
    def awaiting(self) -> tuple[Call, ...]:
        """Calls of the open batch still waiting for a result (and not blocked)."""
        return tuple(entry.call for entry in self.batch if entry.unanswered)

    @property
    def latest(self) -> tuple[Call, ...]:
        """Calls of the open batch, then of the last settled one: the latest responses."""
        return tuple(entry.call for entry in (*self.batch, *self.settled))

    @property
    def steer_pending(self) -> bool:
        """Whether a steer message is due before the model's next call."""
        return self.steer is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe snapshot (call args are not kept, only their fingerprints).

        A field still at a fresh state's value is left out (`from_dict` restores it): the
        snapshot is written at every model call and kept in every checkpoint. `"v"` is
        its shape's version (`SCHEMA_VERSION`), for `migrate`.

        Examples:
            >>> RequestState(request_id="r-1", streak=2).to_dict()
            {'v': 1, 'request_id': 'r-1', 'streak': 2}
        """
        snapshot: dict[str, Any] = {"v": SCHEMA_VERSION, "request_id": self.request_id}
        if self.last is not None:
            last = self.last
            snapshot["last"] = {"tool": last.tool, "args": last.args, "result": last.result}
        if self.streak:
            snapshot["streak"] = self.streak
        if self.variant:
            snapshot["variant"] = self.variant
        if self.near:
            snapshot["near"] = True
        if self.warned:
            snapshot["warned"] = True
        if self.blocks:
            snapshot["blocks"] = self.blocks
        steer = self.steer
        if steer is not None:
            call = steer.call
            snapshot["steer"] = [
                steer.reason,
                steer.message,
                steer.streak,
                call.tool,
                call.fingerprint,
            ]
        if self.stopped is not None:
            snapshot["stopped"] = STOP_CODES[self.stopped]
        if self.stop_tool:
            snapshot["stop_tool"] = self.stop_tool
        if self.batch:
            snapshot["batch"] = entries_to_json(self.batch)
        if self.batch_explicit:
            snapshot["batch_explicit"] = True
        if self.settled:
            snapshot["settled"] = entries_to_json(self.settled)
        if self.recent:
            snapshot["recent"] = list(map(list, self.recent))
        if self.counted:
            snapshot["counted"] = self.counted
        if self.runs:
            snapshot["runs"] = list(self.runs)
        if self.cycle_warned:
            snapshot["cycle_warned"] = True
        if self.beside:
            snapshot["beside"] = [[list(step), batches] for step, batches in self.beside]
        if self.steered:
            snapshot["steered"] = [[list(entry.step), *entry[1:]] for entry in self.steered]
        if self.unknown:
            snapshot["unknown"] = list(self.unknown)
        if self.available:
            snapshot["available"] = list(self.available)
        if self.failing:
            snapshot["failing"] = [
                [e.tool, e.error, list(e.args), e.calls, *([True] if e.weak else [])]
                for e in self.failing
            ]
        if self.changes:
            snapshot["changes"] = list(map(list, self.changes))
        if self.since_change >= 0:
            snapshot["since_change"] = self.since_change
        if self.turns:
            snapshot["turns"] = [list(map(list, turn)) for turn in self.turns]
        if self.question:
            snapshot["question"] = self.question
        if self.asked_again:
            snapshot["asked_again"] = True
        if self.cost is not NO_COST:  # identity: written at every model call
            snapshot["cost"] = cost_to_json(self.cost)
        if self.unpaid is not NO_COST:
            snapshot["unpaid"] = cost_to_json(self.unpaid)
        if self.looping:
            snapshot["looping"] = True
        if self.batch_tokens:
            snapshot["batch_tokens"] = self.batch_tokens
        if self.resumed:
            snapshot["resumed"] = self.resumed
            snapshot["rearm"] = self.rearm
        if self.text_loops:
            snapshot["text_loops"] = list(self.text_loops)
        if self.judged_at:
            snapshot["judged_at"] = self.judged_at
        return snapshot

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RequestState:
        """Rebuild a state from `to_dict` output; `None` or `{}` gives a fresh state.

        An older snapshot is migrated first (`migrate`).

        Raises:
            ValueError: If a newer version of the guard wrote the snapshot.
        """
        if not data:
            return cls()
        data = migrate(data)
        last = None if data.get("last") is None else Step(**data["last"])
        steer = data.get("steer")
        return cls(
            request_id=data.get("request_id"),
            last=last,
            streak=int(data.get("streak", 0)),
            variant=str(data.get("variant", "")),
            near=bool(data.get("near", False)),
            warned=bool(data.get("warned", False)),
            blocks=int(data.get("blocks", 0)),
            steer=None if steer is None else steer_from_json(steer),
            stopped=_STOP_REASONS.get(data.get("stopped", "")),
            stop_tool=str(data.get("stop_tool", "")),
            batch=entries_from_json(data.get("batch", ())),
            batch_explicit=bool(data.get("batch_explicit", False)),
            settled=entries_from_json(data.get("settled", ())),
            recent=tuple(map(Step._make, data.get("recent", ()))),
            counted=int(data.get("counted", 0)),
            runs=tuple(int(n) for n in data.get("runs", ())),
            cycle_warned=bool(data.get("cycle_warned", False)),
            beside=tuple(
                (Step._make(step), int(batches)) for step, batches in data.get("beside", ())
            ),
            steered=tuple(steered_from_json(row) for row in data.get("steered", ())),
            unknown=tuple(data.get("unknown", ())),
            available=tuple(data.get("available", ())),
            failing=tuple(
                Failing(str(tool), str(error), tuple(args), int(calls), bool(weak))
                for tool, error, args, calls, *weak in data.get("failing", ())
            ),
            changes=tuple(map(Step._make, data.get("changes", ()))),
            since_change=int(data.get("since_change", -1)),
            turns=tuple(tuple(map(Step._make, turn)) for turn in data.get("turns", ())),
            question=str(data.get("question", "")),
            asked_again=bool(data.get("asked_again", False)),
            cost=cost_from_json(data.get("cost")),
            unpaid=cost_from_json(data.get("unpaid")),
            looping=bool(data.get("looping", False)),
            batch_tokens=int(data.get("batch_tokens", 0)),
            resumed=int(data.get("resumed", 0)),
            rearm=int(data.get("rearm", 0)),
            text_loops=tuple(map(str, data.get("text_loops", ()))),
            judged_at=int(data.get("judged_at", 0)),
        )


_STOP_REASONS: dict[str, StopReason] = {code: reason for reason, code in STOP_CODES.items()}

SCHEMA_VERSION = 1
"""The shape of the snapshots `RequestState.to_dict` writes, kept in their `"v"` field.

A snapshot without one (version 0) was written by 0.1.0 or an earlier version: see
`migrate`.
"""


def migrate(data: Mapping[str, Any], keys: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """`data` in the shape of `SCHEMA_VERSION`, from the shape of any earlier version.

    Version 0, a snapshot without `"v"`, covers every shape written before versions were
    recorded: a steer due as a bare flag (`steer_pending`), a steer without its call,
    steered steps without their run count or limit, and calls keyed by their tool-call
    id (before calls were keyed by their response and position). `keys` maps the
    tool-call ids of the latest responses to their keys now (`_langchain.call_keys`);
    without it, such a call stays unknown to the state: a run on it is not counted.

    Examples:
        >>> old = {"request_id": "r", "batch": [["call_1", "read", "f1", "allowed"]]}
        >>> migrate(old, {"call_1": "response-7#0"})["batch"]
        [['response-7#0', 'read', 'f1', 'allowed']]

    Raises:
        ValueError: If a newer version of the guard wrote the snapshot.
    """
    version = data.get("v", 0)
    if version == SCHEMA_VERSION:
        return data
    if version != 0:
        msg = (
            f"loop guard state of schema version {version!r}, newer than this version's "
            f"{SCHEMA_VERSION}: written by a newer langchain-loop-guard"
        )
        raise ValueError(msg)
    return _from_version_0(data, keys or {})


def _from_version_0(data: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    snapshot = {name: value for name, value in data.items() if name != "steer_pending"}
    snapshot["v"] = SCHEMA_VERSION
    last = data.get("last")
    steer = data.get("steer")
    if steer is None and data.get("steer_pending") and last is not None:
        streak = int(data["streak"])
        steer = ["repeat", _messages.repeat_steer_text(last["tool"], streak), streak]
    if steer is not None and last is not None and len(steer) == 3:
        steer = [*steer, last["tool"], last["args"]]  # the steer was about the last step
    snapshot["steer"] = None if last is None else steer
    # No run count: the streak it was steered at. No limit: 0, the tool's own backstop.
    snapshot["steered"] = [
        [step, level, again, *(more or [level]), *([] if len(more) > 1 else [0])]
        for step, level, again, *more in data.get("steered", ())
    ]
    for name in ("batch", "settled"):
        snapshot[name] = [[keys.get(key, key), *rest] for key, *rest in data.get(name, ())]
    return snapshot


_new_state = object.__new__  # `clone` sets every field: no constructor needed


def clone(state: RequestState) -> RequestState:
    """A copy of `state` for one transition to change in place before it hands it out.

    Field by field, spelled out: it runs for every transition, and the keyword
    constructor (or `dataclasses.replace`) costs several times as much.

    Examples:
        >>> from dataclasses import fields
        >>> state = RequestState(**{field.name: object() for field in fields(RequestState)})
        >>> copy = clone(state)
        >>> copy is not state and all(
        ...     getattr(copy, field.name) is getattr(state, field.name) for field in fields(state)
        ... )
        True
    """
    copy = _new_state(RequestState)
    copy.request_id = state.request_id
    copy.last = state.last
    copy.streak = state.streak
    copy.variant = state.variant
    copy.near = state.near
    copy.warned = state.warned
    copy.blocks = state.blocks
    copy.steer = state.steer
    copy.stopped = state.stopped
    copy.stop_tool = state.stop_tool
    copy.batch = state.batch
    copy.batch_explicit = state.batch_explicit
    copy.settled = state.settled
    copy.recent = state.recent
    copy.counted = state.counted
    copy.runs = state.runs
    copy.cycle_warned = state.cycle_warned
    copy.beside = state.beside
    copy.steered = state.steered
    copy.unknown = state.unknown
    copy.available = state.available
    copy.failing = state.failing
    copy.changes = state.changes
    copy.since_change = state.since_change
    copy.turns = state.turns
    copy.question = state.question
    copy.asked_again = state.asked_again
    copy.cost = state.cost
    copy.unpaid = state.unpaid
    copy.looping = state.looping
    copy.batch_tokens = state.batch_tokens
    copy.resumed = state.resumed
    copy.rearm = state.rearm
    copy.text_loops = state.text_loops
    copy.judged_at = state.judged_at
    return copy


def position(entries: tuple[Entry, ...], key: str) -> int:
    """Where the call with this `Call.key` is among `entries`; -1 when it is not."""
    for index, entry in enumerate(entries):
        if entry.call.key == key:
            return index
    return -1


def entries_to_json(entries: tuple[Entry, ...]) -> list[list[Any]]:
    rows = []
    for call, outcome, block in entries:
        row: list[Any] = [call.key, call.tool, call.fingerprint, outcome_to_json(outcome)]
        if block is not None:
            row += [block.message, block.reason, block.streak, block.blocks]
        rows.append(row)
    return rows


def entries_from_json(rows: Any) -> tuple[Entry, ...]:
    entries = []
    for key, tool, fingerprint, outcome, *blocked in rows:
        call = Call(key=key, tool=tool, fingerprint=fingerprint)
        block = None
        if blocked:
            message, reason, streak, blocks = blocked
            block = Block(call=call, message=message, reason=reason, streak=streak, blocks=blocks)
        entries.append(Entry(call=call, outcome=outcome_from_json(outcome), block=block))
    return tuple(entries)


def outcome_to_json(outcome: Outcome | Answer | None) -> str | list[Any] | None:
    """An entry's outcome in a snapshot: an `Outcome` by its value, an answer as
    `result~variant` (as 0.1.0 wrote it), a reported error as a list."""
    if outcome is None or isinstance(outcome, Outcome):
        return None if outcome is None else _OUTCOME_VALUES[outcome]
    if outcome.reported:
        return list(outcome)
    return f"{outcome.result}{_NEAR}{outcome.variant}" if outcome.variant else outcome.result


def outcome_from_json(value: Any) -> Outcome | Answer | None:
    if value is None:
        return None
    if isinstance(value, list):
        result, variant, reported = value
        return Answer(str(result), str(variant), bool(reported))
    for outcome in Outcome:
        if value == outcome.value:
            return outcome
    result, _, variant = str(value).partition(_NEAR)
    return Answer(result, variant)


def steer_from_json(row: Any) -> Steer:
    reason, message, streak, tool, fingerprint = row
    call = Call(tool=tool, fingerprint=fingerprint)
    return Steer(call=call, message=message, streak=int(streak), reason=reason)


def cost_to_json(cost: LoopCost) -> list[int]:
    """A cost's counts up to its last that is not 0: a count added in a later version is
    written only when it is used, so that earlier versions read the snapshot.

    Examples:
        >>> cost_to_json(LoopCost(2, 1)), cost_to_json(LoopCost(chars_kept_out=9))
        ([2, 1], [0, 0, 0, 0, 0, 0, 9])
    """
    counts = list(cost.to_tuple())
    while counts and not counts[-1]:
        counts.pop()
    return counts


def cost_from_json(row: Any) -> LoopCost:
    cost = NO_COST if row is None else LoopCost(*map(int, row))
    return cost if cost else NO_COST  # no cost is `NO_COST`, told by identity


def steered_from_json(row: Any) -> Steered:
    step, level, again, seen, limit = row
    return Steered(Step._make(step), int(level), bool(again), int(seen), int(limit))
