"""A guard's events and counters: what it tells about the decisions it reaches.

`Events` counts each decision and publishes the events of its steers, blocks and
stops to the `loop_guard` logger, to `on_event` and to every subscribed sink (the
adapters subscribe the sinks: `_faces.attach_sinks`).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, final

from loop_guard._messages import REPLY
from loop_guard._values import (
    NO_COST,
    Block,
    Charge,
    Decision,
    Judged,
    LoopCost,
    Proceed,
    Reason,
    Steer,
    Stop,
    StopReason,
)

logger = logging.getLogger("loop_guard")
# A library's records go where the application sends them; with logging never configured,
# nowhere (not Python's last-resort handler, which would print warnings on stderr).
logger.addHandler(logging.NullHandler())

EventKind = Literal["steer", "block", "stop", "error", "judge"]

RETIRED_KINDS: Mapping[str, EventKind] = {"warn": "steer", "abort": "stop", "terminate": "stop"}
"""The event kinds of earlier versions, by the kind each is now: still accepted, with a
`DeprecationWarning`, where a kind is passed in (`event_kinds`)."""


def event_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """`kinds`, a retired kind (`RETIRED_KINDS`) replaced by its kind now, with a
    `DeprecationWarning` for the caller's caller.

    Examples:
        >>> sorted(event_kinds(["steer", "block"]))
        ['block', 'steer']
    """
    current = set()
    for kind in kinds:
        if kind in RETIRED_KINDS:
            message = f"event kind {kind!r} is deprecated: use {RETIRED_KINDS[kind]!r}"
            warnings.warn(message, DeprecationWarning, stacklevel=3)
        current.add(RETIRED_KINDS.get(kind, kind))
    return frozenset(current)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardEvent:
    """A steer, block or stop, as passed to `on_event` and logged on `loop_guard`.

    Attributes:
        kind: `'steer'`, `'block'`, `'stop'`, `'judge'` when the judge model was asked
            (`LoopGuardMiddleware(judge=...)`), or `'error'` when the guard itself failed
            on an event (the agent went on unguarded for it).
        conversation: The conversation key: the thread id, followed by the graph's
            namespace in a subgraph or subagent (`"t|worker:<task id>"`); outside a
            thread, `"run:<top-level run id>"` or `"request:<request id>"`.
        tool: The repeated tool; `REPLY` (`"(reply)"`) for a reply that repeated its
            own text.
        args: The repeated call's args (`None` when not known, e.g. after a restore).
        streak: Identical steps in a row when the event happened (for a cycle: its
            laps; for an interleaved repeat: its occurrences in the window).
        blocks: Calls blocked so far in this request.
        message: The exact text shown: to the model for a steer or a block, to the
            user for a stop; for a judgment, its verdict (`"progress"` or
            `"no progress"`) and the judge's reason.
        reason: For a steer or a block, the detector that fired: `'repeat'` (the
            streak), `'cycle'`, `'interleaved'`, `'returned'` (also the backstop's
            blocks), `'unknown_tool'`, `'same_error'` or `'repeated_text'` (a reply that
            kept repeating its own text); for a stop, the setting that stopped the
            request (`StopReason`); `None` for judgments and errors.
        call_id: The tool-call id of the call the event is about, when known.
        cost: What loops cost the request so far (see `LoopCost`); for a judgment,
            the judge's own call and its tokens; for an error, nothing.

    Examples:
        >>> from loop_guard import Call, LoopGuard, Result
        >>> events = []
        >>> session = LoopGuard(on_event=events.append, warn_threshold=2).session("thread-1")
        >>> for _ in range(2):
        ...     call = Call.of("ls", {"path": "/"})
        ...     _ = session.check_call(call)
        ...     session.record_result(call, Result.of("empty"))
        >>> events[0].kind, events[0].tool, events[0].streak
        ('steer', 'ls', 2)
    """

    kind: EventKind
    conversation: str
    tool: str
    args: Any
    streak: int
    blocks: int
    message: str
    reason: Reason | StopReason | None = None
    call_id: str | None = None
    cost: LoopCost = NO_COST

    @classmethod
    def of(cls, conversation: str, decision: Block | Steer | Stop | Judged) -> GuardEvent:
        """The event for one of the engine's decisions."""
        kind: EventKind
        if isinstance(decision, Judged):
            verdict = "progress" if decision.progress else "no progress"
            return cls(
                kind="judge",
                conversation=conversation,
                tool=decision.call.tool,
                args=None,
                streak=decision.at,
                blocks=0,
                message=f"{verdict}: {decision.reason}" if decision.reason else verdict,
                call_id=decision.call.id,
                cost=LoopCost(model_calls=1, tokens=decision.tokens),
            )
        match decision:
            case Steer():
                kind, blocks = "steer", 0
            case Block():
                kind, blocks = "block", decision.blocks
            case Stop():
                kind, blocks = "stop", decision.blocks
        return cls(
            kind=kind,
            conversation=conversation,
            tool=decision.call.tool,
            args=decision.call.args,
            streak=decision.streak,
            blocks=blocks,
            message=decision.message,
            reason=decision.reason,
            call_id=decision.call.id,
            cost=decision.cost,
        )


EventSink = Callable[[GuardEvent], object]
"""A receiver of events: `on_event`, or a sink an adapter subscribes."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardStats:
    """Counters a guard keeps since it was created (see `LoopGuard.stats`).

    Attributes:
        calls: Tool calls the guard decided on.
        steers: Steer messages issued.
        blocks: Calls blocked.
        stops: Requests stopped (by `abort_threshold`, or by `use_terminate`).
        errors: Events the guard failed on and let through unguarded.
        judgments: Times the judge model was asked (`LoopGuardMiddleware(judge=...)`).
        judge_tokens: What the judge's calls cost, in tokens (when they report usage).
        cost: What loops cost, summed over every request (see `LoopCost`).
        by_tool: The same counters per tool name (errors under `""`), the cost's as
            `model_calls`, `tool_runs`, `tokens`, `tool_runs_saved` and so on.

    Examples:
        >>> from loop_guard import Call, LoopGuard, Proceed, Result
        >>> guard = LoopGuard(warn_threshold=1, block_threshold=2)
        >>> session = guard.session("t")
        >>> for _ in range(2):
        ...     call = Call.of("ls", {})
        ...     if isinstance(session.check_call(call), Proceed):
        ...         session.record_result(call, Result.of("same"))
        >>> stats = guard.stats
        >>> stats.calls, stats.steers, stats.blocks, stats.by_tool["ls"]["blocks"]
        (2, 1, 1, 1)
        >>> stats.cost.model_calls, stats.cost.tool_runs, stats.cost.tool_runs_saved
        (2, 1, 1)
    """

    calls: int = 0
    steers: int = 0
    blocks: int = 0
    stops: int = 0
    errors: int = 0
    judgments: int = 0
    judge_tokens: int = 0
    cost: LoopCost = NO_COST
    by_tool: Mapping[str, Mapping[str, int]]

    @property
    def warnings(self) -> int:
        """Deprecated: `steers`."""
        _retired("GuardStats.warnings", "GuardStats.steers")
        return self.steers

    @property
    def aborts(self) -> int:
        """Deprecated: `stops`, which counts every stop."""
        _retired("GuardStats.aborts", "GuardStats.stops")
        return self.stops

    @property
    def terminations(self) -> int:
        """Deprecated: 0, as `stops` counts these stops too."""
        _retired("GuardStats.terminations", "GuardStats.stops, which counts them")
        return 0


def _retired(name: str, instead: str) -> None:
    warnings.warn(f"{name} is deprecated: read {instead}", DeprecationWarning, stacklevel=3)


_EVENT_COUNTERS = (
    "calls",
    "steers",
    "blocks",
    "stops",
    "errors",
    "judgments",
    "judge_tokens",
)
_COST_COUNTERS = tuple(field.name for field in fields(LoopCost))
_COUNTERS = (*_EVENT_COUNTERS, *_COST_COUNTERS)
_COUNTER_OF_KIND = {
    "steer": "steers",
    "block": "blocks",
    "stop": "stops",
    "error": "errors",
    "judge": "judgments",
}


@final
class Events:
    """Counts a guard's decisions and publishes the events of its steers, blocks and
    stops: logged, then sent to `on_event` and every subscribed sink. A failing
    receiver is logged, never passed on to the agent.

    Examples:
        >>> from loop_guard import Call, Steer
        >>> events = Events(on_event=lambda event: print(event.kind, event.tool), limit=10)
        >>> events.publish("t", [Steer(call=Call.of("ls", {}), streak=2, message="Stop.")])
        steer ls
        >>> events.stats.steers
        1
    """

    __slots__ = ("_counts", "_lock", "_published", "_sinks", "limit", "on_event")

    def __init__(self, *, on_event: EventSink | None, limit: int) -> None:
        self.on_event = on_event
        self.limit = limit  # conversations whose published decisions are remembered
        self._lock = threading.Lock()
        self._sinks: tuple[EventSink, ...] = ()
        self._counts: Counter[tuple[str, str]] = Counter()  # (tool, counter) -> n
        # Per conversation: the turn last published and what it published (`publish_once`).
        self._published: OrderedDict[str, tuple[object, set[object]]] = OrderedDict()

    @property
    def stats(self) -> GuardStats:
        """A snapshot of the counters."""
        with self._lock:
            counts = dict(self._counts)
        by_tool: dict[str, dict[str, int]] = {}
        totals: Counter[str] = Counter()
        for (tool, counter), n in counts.items():
            by_tool.setdefault(tool, dict.fromkeys(_COUNTERS, 0))[counter] = n
            totals[counter] += n
        cost = LoopCost(*(totals[name] for name in _COST_COUNTERS))
        events = {name: totals[name] for name in _EVENT_COUNTERS}
        return GuardStats(by_tool=by_tool, cost=cost, **events)

    def subscribe(self, sink: EventSink) -> None:
        """Also send every event to `sink` (idempotent)."""
        with self._lock:
            if sink not in self._sinks:
                self._sinks = (*self._sinks, sink)

    def unsubscribe(self, sink: EventSink) -> None:
        """Stop sending events to `sink` (a sink not subscribed is ignored)."""
        with self._lock:
            self._sinks = tuple(kept for kept in self._sinks if kept != sink)

    def publish(self, conversation: str, decisions: Iterable[Decision]) -> None:
        """Count `decisions` and publish the events of their steers, blocks and stops."""
        with self._lock:
            events = self._tally(conversation, decisions)
        self._send_all(events)

    def publish_once(self, conversation: str, turn: object, decisions: Iterable[Decision]) -> None:
        """`publish` `decisions`, except what this conversation's `turn` published already.

        For adapters whose hooks other middleware may run again with the same input
        (a model call retried, or handed to a fallback model): the decisions they reach
        again are published, and counted, once (see How the guard decides: reset and scope).
        `turn` names the point of the request the decisions were reached at (its request
        and counted steps).
        """
        fresh = []
        with self._lock:
            published_turn, published = self._published.pop(conversation, (None, set()))
            if published_turn != turn:
                published = set()
            for decision in decisions:
                key = _once_key(decision)
                if key not in published:
                    published.add(key)
                    fresh.append(decision)
            self._published[conversation] = (turn, published)
            while len(self._published) > self.limit:
                self._published.popitem(last=False)
            events = self._tally(conversation, fresh)
        self._send_all(events)

    def forget(self, conversation: str) -> None:
        """Forget what a finished conversation published."""
        with self._lock:
            self._published.pop(conversation, None)

    def fault(self, conversation: str | None, error: BaseException) -> None:
        """Count and publish an `error` event for a fault of the guard, logged as one
        ERROR with the traceback."""
        event = GuardEvent(
            kind="error",
            conversation=conversation or "",
            tool="",
            args=None,
            streak=0,
            blocks=0,
            message=f"{type(error).__name__}: {error}",
        )
        with self._lock:
            self._counts["", "errors"] += 1
        self._send(event, logging.ERROR, error)

    def _tally(self, conversation: str, decisions: Iterable[Decision]) -> list[GuardEvent]:
        """Count each decision (under `_lock`); the events of its steers, blocks and
        stops, to be sent (`_send_all`) once the lock is released."""
        events = []
        for decision in decisions:
            if isinstance(decision, Proceed):  # the common case: counted, nothing to tell
                self._counts[decision.call.tool, "calls"] += 1
                continue
            if isinstance(decision, Charge):
                tool, cost = decision.call.tool, decision.cost
                for name in _COST_COUNTERS:
                    if value := getattr(cost, name):
                        self._counts[tool, name] += value
                continue
            if isinstance(decision, Judged):
                self._counts[decision.call.tool, "judge_tokens"] += decision.tokens
            elif isinstance(decision, Block) and decision.call.tool != REPLY:
                self._counts[decision.call.tool, "calls"] += 1  # a blocked call
            event = GuardEvent.of(conversation, decision)
            self._counts[event.tool, _COUNTER_OF_KIND[event.kind]] += 1
            events.append(event)
        return events

    def _send_all(self, events: Iterable[GuardEvent]) -> None:
        for event in events:
            # Steers, blocks and judgments are routine (INFO); a stop deserves a WARNING.
            level = logging.INFO if event.kind in ("steer", "block", "judge") else logging.WARNING
            self._send(event, level)

    def _send(self, event: GuardEvent, level: int, error: BaseException | None = None) -> None:
        logger.log(
            level,
            "loop guard %s: tool=%s streak=%d blocks=%d conversation=%s%s",
            event.kind,
            event.tool,
            event.streak,
            event.blocks,
            event.conversation,
            "; the guard failed and let this event through unguarded" if error else "",
            exc_info=error,
            extra={"loop_guard_event": event},
        )
        receivers = self._sinks if self.on_event is None else (self.on_event, *self._sinks)
        for receiver in receivers:
            try:
                receiver(event)
            except Exception:
                logger.exception("loop guard event receiver %r failed", receiver)


def _once_key(decision: Decision) -> object:
    """What makes a decision the same decision when a turn is run again: a block, a
    steer or a stop by what it says (a retried model may give its calls new ids); a call
    let through by its id."""
    match decision:
        case Proceed():
            return ("proceed", decision.call.key)
        case Block():
            return ("block", decision.call.tool, decision.blocks, decision.message)
        case Steer():
            return ("steer", decision.call.tool, decision.message)
        case Stop():
            return ("stop", decision.reason, decision.message)
        case Charge():
            return ("charge", decision.call.key, decision.cost)
        case Judged():
            return ("judge", decision.at)
