"""`LoopGuard`: the engine plus per-conversation state, events and logging."""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, final

from loop_guard._config import LoopGuardConfig, annotation_hint, resolve_config
from loop_guard._engine import Engine
from loop_guard._siblings import SharedRuns
from loop_guard._state import RequestState
from loop_guard._values import Block, Call, Decision, Proceed, Reason, Result, Steer, Stop

logger = logging.getLogger("loop_guard")

_T = TypeVar("_T")

_SNAPSHOTS_KEPT = 256  # the latest snapshot of as many conversations, at least
_CATCH_UP_TRIES = 4  # other threads' transitions interleaved with a catch-up, at most

EventKind = Literal["warn", "block", "abort", "terminate", "error"]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardEvent:
    """A warning, block or stop, as passed to `on_event` and logged on `loop_guard`.

    Attributes:
        kind: `'warn'`, `'block'`, `'abort'`, `'terminate'`, or `'error'` when the
            guard itself failed on an event (the agent went on unguarded for it).
        conversation: The conversation key: the thread id, followed by the graph's
            namespace in a subgraph or subagent (`"t|worker:<task id>"`); outside a
            thread, `"run:<top-level run id>"` or `"request:<request id>"`.
        tool: The repeated tool.
        args: The repeated call's args (`None` when not known, e.g. after a restore).
        streak: Identical steps in a row when the event happened (for a cycle: its
            laps; for an interleaved repeat: its occurrences in the window).
        blocks: Calls blocked so far in this request.
        message: The exact text shown: to the model for warn and block, to the user
            for abort and terminate.
        reason: For warn and block, the detector that fired: `'repeat'` (the
            streak), `'cycle'`, `'interleaved'`, `'returned'` (also the backstop's
            blocks), `'unknown_tool'` or `'same_error'`; `None` for stops and errors.

    Example:
        >>> events = []
        >>> guard = LoopGuard(on_event=events.append, warn_threshold=2)
        >>> for _ in range(2):
        ...     call = Call.of("ls", {"path": "/"})
        ...     _ = guard.check_call("thread-1", call)
        ...     guard.record_result("thread-1", call, Result.of("empty"))
        >>> events[0].kind, events[0].tool, events[0].streak
        ('warn', 'ls', 2)
    """

    kind: EventKind
    conversation: str
    tool: str
    args: Any
    streak: int
    blocks: int
    message: str
    reason: Reason | None = None

    @classmethod
    def of(cls, conversation: str, decision: Block | Steer | Stop) -> GuardEvent:
        """The event for one of the engine's decisions."""
        kind: EventKind
        reason: Reason | None = None
        match decision:
            case Steer():
                kind, blocks, reason = "warn", 0, decision.reason
            case Block():
                kind, blocks, reason = "block", decision.blocks, decision.reason
            case Stop():
                kind, blocks = decision.kind, decision.blocks
        return cls(
            kind=kind,
            conversation=conversation,
            tool=decision.call.tool,
            args=decision.call.args,
            streak=decision.streak,
            blocks=blocks,
            message=decision.message,
            reason=reason,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardStats:
    """Counters a guard keeps since it was created (see `LoopGuard.stats`).

    Attributes:
        calls: Tool calls the guard decided on.
        warnings: Steer messages issued.
        blocks: Calls refused.
        aborts: Requests ended by the abort threshold.
        terminations: Requests ended by `use_terminate`.
        errors: Events the guard failed on and let through unguarded.
        by_tool: The same counters per tool name (errors under `""`).

    Example:
        >>> guard = LoopGuard(warn_threshold=1, block_threshold=2)
        >>> for _ in range(2):
        ...     call = Call.of("ls", {})
        ...     if isinstance(guard.check_call("t", call), Proceed):
        ...         guard.record_result("t", call, Result.of("same"))
        >>> stats = guard.stats
        >>> stats.calls, stats.warnings, stats.blocks, stats.by_tool["ls"]["blocks"]
        (2, 1, 1, 1)
    """

    calls: int = 0
    warnings: int = 0
    blocks: int = 0
    aborts: int = 0
    terminations: int = 0
    errors: int = 0
    by_tool: Mapping[str, Mapping[str, int]]


_COUNTERS = ("calls", "warnings", "blocks", "aborts", "terminations", "errors")
_COUNTER_OF_KIND = {
    "warn": "warnings",
    "block": "blocks",
    "abort": "aborts",
    "terminate": "terminations",
    "error": "errors",
}


@final
class LoopGuard:
    """Stop an agent that repeats the same tool call and gets the same result.

    One instance serves any number of concurrent conversations; each conversation's
    state is kept under its key and reset at every new request (SPEC §5). The adapters
    (`LoopGuardCallbackHandler`, `guard_tools`, `LoopGuardNode`) are thin layers over
    the methods below; call them directly to guard a custom agent loop.

    Args:
        config: Settings; when `None`, read from the `LOOP_GUARD_*` variables.
        on_event: Called with a `GuardEvent` for every warning, block and stop. An
            exception it raises is logged, never passed on to the agent.
        max_conversations: Conversations kept at once; the least recently used one is
            forgotten beyond this, so a long-lived server stays bounded.
        **overrides: Any `LoopGuardConfig` field; wins over `config` and the environment.

    Raises:
        ValueError: If an explicit argument is invalid (SPEC §6).

    Example:
        >>> guard = LoopGuard(block_threshold=4)
        >>> guard.start_request("thread-1", "request-1")
        >>> for n in range(1, 5):
        ...     call = Call.of("read", {"path": "notes.md"}, id=f"call_{n}")
        ...     verdict = guard.check_call("thread-1", call)
        ...     if isinstance(verdict, Proceed):
        ...         guard.record_result("thread-1", call, Result.of("File not found"))
        ...     print(n, type(verdict).__name__)
        1 Proceed
        2 Proceed
        3 Proceed
        4 Block
    """

    def __init__(
        self,
        config: LoopGuardConfig | None = None,
        *,
        on_event: Callable[[GuardEvent], object] | None = None,
        max_conversations: int = 10_000,
        **overrides: Any,
    ) -> None:
        """Create a guard; see the class docstring for the arguments."""
        limit: object = max_conversations  # checked at run time: callers may be untyped
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            msg = f"max_conversations must be an integer >= 1, got {limit!r}"
            raise ValueError(msg)
        handler: object = on_event
        if handler is not None and not callable(handler):
            msg = f"on_event must be callable, got {handler!r}"
            raise ValueError(msg)
        self.engine = Engine(resolve_config(config, overrides))
        self.on_event = on_event
        self.max_conversations = max_conversations
        self._states: OrderedDict[str, RequestState] = OrderedDict()
        self._lock = threading.Lock()
        self._sinks: tuple[Callable[[GuardEvent], object], ...] = ()
        self._counts: Counter[tuple[str, str]] = Counter()  # (tool, counter) -> n
        self.siblings = SharedRuns()  # identical siblings share one run (`dedupe_siblings`)
        self._node_served: set[str] = set()  # conversations a `LoopGuardNode` steers
        # Per conversation: the turn last published and what it published (`emit_once`).
        self._published: OrderedDict[str, tuple[object, set[object]]] = OrderedDict()
        # Snapshots written lately, by id, with the states they were written from.
        self._snapshots: OrderedDict[int, tuple[Mapping[str, Any], RequestState]] = OrderedDict()
        self.node_attached = False  # set by `LoopGuardNode`: a graph node steers for it
        self.tool_names: frozenset[str] | None = None  # see `add_tools`

    def add_tools(self, tools: Iterable[object]) -> None:
        """Make these tools known: names, or tool objects (`guard_tools` and the
        middleware pass theirs).

        A call to a tool not known is one to a missing tool only when the tool node
        answered it so; while no tools are known, none is (the faces that read results
        from a history cannot tell otherwise). A tool object's MCP annotations
        (`readOnlyHint`, `destructiveHint` in its `metadata`, as
        `langchain-mcp-adapters` sets them) say whether it changes state.

        Example:
            >>> guard = LoopGuard()
            >>> guard.add_tools(["read_file", "write_file"])
            >>> sorted(guard.tool_names or ())
            ['read_file', 'write_file']
        """
        names: list[str] = []
        hints: dict[str, bool] = {}
        for tool in tools:
            name = tool if isinstance(tool, str) else getattr(tool, "name", None)
            if not isinstance(name, str) or not name:
                continue
            names.append(name)
            hint = annotation_hint(getattr(tool, "metadata", None))
            if hint is not None:
                hints[name] = hint
        with self._lock:
            self.tool_names = frozenset((*(self.tool_names or ()), *names))
            if hints:
                self.engine.learn(hints)

    @property
    def config(self) -> LoopGuardConfig:
        """The settings in force."""
        return self.engine.config

    @property
    def stats(self) -> GuardStats:
        """A snapshot of the counters: calls decided, warnings, blocks and stops."""
        with self._lock:
            counts = dict(self._counts)
        by_tool: dict[str, dict[str, int]] = {}
        totals: Counter[str] = Counter()
        for (tool, counter), n in counts.items():
            by_tool.setdefault(tool, dict.fromkeys(_COUNTERS, 0))[counter] = n
            totals[counter] += n
        return GuardStats(by_tool=by_tool, **{name: totals[name] for name in _COUNTERS})

    def subscribe(self, sink: Callable[[GuardEvent], object]) -> None:
        """Also send every event to `sink` (idempotent); adapters use it for tracing."""
        with self._lock:
            if sink not in self._sinks:
                self._sinks = (*self._sinks, sink)

    def session(self, conversation: str) -> Session:
        """The transitions of one conversation whose state this guard keeps."""
        return Session(self, conversation)

    def detached(self, conversation: str, snapshot: Mapping[str, Any] | None) -> Session:
        """The transitions of a conversation whose state the caller keeps, as a snapshot
        (`RequestState.to_dict`), e.g. in a checkpoint.

        Its decisions are published when the caller says (`Session.publish`), once even
        when the caller runs the same transitions again on the same snapshot (a retried
        model call); then read the new `snapshot()`.
        """
        return Session(self, conversation, self._restored(snapshot))

    def _refuses_any(self, snapshot: Mapping[str, Any] | None) -> bool:
        """Whether a call of the latest responses in a snapshot was refused (blocked,
        or not run): what a tool node asks before every call, answered without a
        conversation's session."""
        state = self._restored(snapshot)
        return any(entry.block is not None for entry in (*state.batch, *state.settled))

    def _restored(self, snapshot: Mapping[str, Any] | None) -> RequestState:
        """The state of a snapshot; one this guard wrote is not parsed again."""
        known = self._snapshots.get(id(snapshot))  # atomic; an entry is never changed
        if known is not None and known[0] is snapshot:
            return known[1]
        return RequestState.from_dict(snapshot)

    def _snapshot(self, state: RequestState) -> dict[str, Any]:
        """`state`'s snapshot, remembered with it, so that reading it back costs nothing
        while the caller hands the same snapshot back (the next hook of the agent)."""
        snapshot = state.to_dict()
        with self._lock:
            self._snapshots[id(snapshot)] = (snapshot, state)  # held: its id stays its own
            if len(self._snapshots) > _SNAPSHOTS_KEPT:
                self._snapshots.popitem(last=False)
        return snapshot

    def start_request(self, conversation: str, request_id: str) -> None:
        """Begin a request, unless `request_id` is the conversation's current request.

        Idempotent, so several adapters may announce the same request. Everything
        resets but the conversation's recent steps (SPEC §5).
        """
        self.session(conversation).start_request(request_id)

    def end_request(self, conversation: str) -> None:
        """Forget a conversation whose request has finished (frees its memory)."""
        with self._lock:
            self._states.pop(conversation, None)
            self._node_served.discard(conversation)
            self._published.pop(conversation, None)

    def open_batch(self, conversation: str, calls: Sequence[Call]) -> None:
        """Declare the calls of one model response, in the model's order (SPEC §4)."""
        self.session(conversation).open_batch(calls)

    def check_call(self, conversation: str, call: Call) -> Proceed | Block | Stop:
        """Decide whether `call` may run; atomic, so racing identical calls cannot slip by."""
        return self.session(conversation).check_call(call)

    def check_batch(self, conversation: str, calls: Sequence[Call]) -> list[Proceed | Block | Stop]:
        """Declare a model response and decide all its calls at once, in its order.

        Checking calls already decided returns their verdicts again, so every sibling
        may ask for the whole batch.
        """
        return self.session(conversation).check_batch(calls)

    def record_result(self, conversation: str, call: Call, result: Result) -> None:
        """Record a call's result; recording the same call twice has no effect."""
        self.session(conversation).record_result(call, result)

    def settle(self, conversation: str) -> None:
        """Close the open batch now, counting the calls that have results."""
        self.session(conversation).settle()

    def take_steer(self, conversation: str) -> Steer | None:
        """Claim the pending steer message for delivery; once per streak."""
        return self.session(conversation).take_steer()

    def stop_of(self, conversation: str) -> Stop | None:
        """The `Stop` that ended the conversation's current request, if any."""
        return self.session(conversation).stop

    def _tally(self, conversation: str, decisions: Iterable[Decision]) -> list[GuardEvent]:
        """Count each decision (under `_lock`); the events of its warnings, blocks and
        stops, to be published (`_publish_all`) once the lock is released."""
        events = []
        for decision in decisions:
            if isinstance(decision, Proceed):  # the common case: counted, nothing to tell
                self._counts[decision.call.tool, "calls"] += 1
                continue
            if isinstance(decision, Block):
                self._counts[decision.call.tool, "calls"] += 1
            event = GuardEvent.of(conversation, decision)
            self._counts[event.tool, _COUNTER_OF_KIND[event.kind]] += 1
            events.append(event)
        return events

    def _publish_all(self, events: Iterable[GuardEvent]) -> None:
        """Log and publish each event to `on_event` and every subscribed sink; a failing
        receiver is logged, never passed on to the agent."""
        for event in events:
            # Steers and blocks are routine (INFO); a stopped request deserves a WARNING.
            level = logging.INFO if event.kind in ("warn", "block") else logging.WARNING
            self._publish(event, level)

    def _emit_once(self, conversation: str, turn: object, decisions: Iterable[Decision]) -> None:
        """Count and publish `decisions`, except what this conversation's `turn` published already.

        For adapters whose hooks other middleware may run again with the same input
        (a model call retried, or handed to a fallback model): the decisions they reach
        again are published, and counted, once (SPEC §5). `turn` names the point of the
        request the decisions were reached at (its request and counted steps).
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
            while len(self._published) > self.max_conversations:
                self._published.popitem(last=False)
            events = self._tally(conversation, fresh)
        self._publish_all(events)

    def report_fault(self, conversation: str | None, error: BaseException) -> None:
        """The guard failed on an event: the agent goes on unguarded for that event.

        Logs one ERROR (with the traceback) and publishes an `error` event; the next
        events are judged normally. Adapters call it instead of letting a fault of the
        guard reach the agent.
        """
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
        self._publish(event, logging.ERROR, error)

    def _publish(self, event: GuardEvent, level: int, error: BaseException | None = None) -> None:
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

    def _state(self, conversation: str) -> RequestState:
        return self._states.get(conversation) or _FRESH

    def _store(self, conversation: str, state: RequestState) -> None:
        self._states[conversation] = state
        self._states.move_to_end(conversation)
        while len(self._states) > self.max_conversations:
            forgotten, _ = self._states.popitem(last=False)
            self._node_served.discard(forgotten)


@final
class Session:
    """One conversation's transitions, as its adapters make them.

    Each method runs one engine transition atomically, keeps the new state and
    publishes the decisions it reached (counted in `stats`, logged, sent to `on_event`),
    so an adapter only acts on what a method returns. Made by `LoopGuard.session` (the
    guard keeps the state) or `LoopGuard.detached` (the caller keeps it as a snapshot).

    Example:
        >>> guard = LoopGuard(warn_threshold=2)
        >>> session = guard.session("thread-1")
        >>> for n in range(2):
        ...     call = Call.of("ls", {}, id=f"call_{n}")
        ...     _ = session.check_call(call)
        ...     session.record_result(call, Result.of("empty"))
        >>> session.take_steer().streak, guard.stats.warnings
        (2, 1)
    """

    __slots__ = ("_decisions", "_detached", "_engine", "_guard", "_state", "conversation")

    def __init__(
        self, guard: LoopGuard, conversation: str, state: RequestState | None = None
    ) -> None:
        self._guard = guard
        self._engine = guard.engine
        self.conversation = conversation
        self._detached = state is not None
        self._state = _FRESH if state is None else state  # unused when the guard keeps it
        self._decisions: list[Decision] = []  # a detached session's, published on close

    def publish(self) -> None:
        """Publish a detached session's decisions so far, once per point of its request
        (its request and the steps counted in it)."""
        if self._decisions:
            turn = (self._state.request_id, self._state.counted)
            decisions, self._decisions = self._decisions, []
            self._guard._emit_once(self.conversation, turn, decisions)

    def snapshot(self) -> dict[str, Any]:
        """The state as a JSON-safe snapshot (`RequestState.to_dict`)."""
        return self._guard._snapshot(self.state)

    @property
    def state(self) -> RequestState:
        """The conversation's current request state."""
        if self._detached:
            return self._state
        # No lock: reading a dict entry is atomic, and a stored state is never changed.
        return self._guard._state(self.conversation)

    @property
    def stop(self) -> Stop | None:
        """The `Stop` that ended the current request, if it has ended."""
        return self._engine.stop_of(self.state)

    @property
    def awaiting(self) -> tuple[Call, ...]:
        """The calls of the open batch still waiting for a result (and not refused)."""
        return self.state.awaiting

    @property
    def steer_due(self) -> bool:
        """Whether a steer message is due before the model's next call."""
        return self.state.steer_pending

    @property
    def latest_calls(self) -> tuple[Call, ...]:
        """The calls of the open batch, then of the last settled one."""
        return self.state.latest

    def decided(self, keys: Sequence[str]) -> bool:
        """Whether every one of these calls (by `Call.key`) has its verdict already."""
        return self._engine.decided(self.state, keys)

    def needs_result(self, call: Call) -> bool:
        """Whether `call` still waits for its result: not recorded, nor refused, yet.

        Lets an adapter skip reading a result another one recorded already.
        """
        return self._engine.needs_result(self.state, call.key)

    @property
    def served_by_node(self) -> bool:
        """Whether a graph node delivers this conversation's steers (`serve_by_node`)."""
        return self.conversation in self._guard._node_served

    def serve_by_node(self) -> None:
        """A graph node delivers this conversation's steers as messages of their own."""
        with self._guard._lock:
            if self.conversation in self._guard._states:
                self._guard._node_served.add(self.conversation)

    def verdict_of(self, call: Call) -> Proceed | Block | Stop | None:
        """The verdict `call` already had, or `None` when it was not decided yet."""
        state = self.state
        if not self._engine.decided(state, [call.key]):
            return None
        return self._engine.check_call(state, call)[1]

    def start_request(self, request_id: str) -> None:
        """Begin a request, unless `request_id` is the current one (SPEC §5)."""

        def start(state: RequestState) -> tuple[RequestState, None, tuple[Decision, ...]]:
            if state.request_id == request_id:
                return state, None, ()
            return self._engine.start_request(state, request_id), None, ()

        self._run(start)

    def open_batch(self, calls: Sequence[Call]) -> None:
        """Declare the calls of one model response, in the model's order (SPEC §4)."""
        self._run(lambda state: _no_value(self._engine.open_batch(state, calls)))

    def check_call(self, call: Call) -> Proceed | Block | Stop:
        """Decide whether `call` may run; atomic, so racing identical calls cannot slip by."""
        return self._run(lambda state: self._engine.check_call(state, call))

    def check_batch(self, calls: Sequence[Call]) -> list[Proceed | Block | Stop]:
        """Declare a model response and decide all its calls at once, in its order."""
        return self._run(lambda state: self._engine.check_batch(state, calls))

    def record_result(self, call: Call, result: Result) -> None:
        """Record a call's result; recording the same call twice has no effect."""
        self._run(lambda state: _no_value(self._engine.record_result(state, call, result)))

    def settle(self) -> None:
        """Close the open batch now, counting the calls that have results."""
        self._run(lambda state: _no_value(self._engine.settle(state)))

    def take_steer(self) -> Steer | None:
        """Claim the pending steer message for delivery; once per streak."""
        return self._run(lambda state: (*self._engine.take_steer(state), ()))

    def finish(
        self, results: Sequence[tuple[Call, Result]] = (), *, settle: bool = True
    ) -> Stop | Steer | None:
        """Record the last batch's `results`, close the batch, counting the calls that
        have results (unless `settle` is false: the batch's response is not in sight),
        and say what comes next: the `Stop` that ended the request, else the due steer,
        claimed for delivery (once per streak), else `None`. One transition."""

        def conclude(
            state: RequestState,
        ) -> tuple[RequestState, Stop | Steer | None, Sequence[Decision]]:
            engine = self._engine
            decisions: list[Decision] = []
            for call, result in results:
                state, recorded = engine.record_result(state, call, result)
                decisions.extend(recorded)
            if settle:
                state, settled = engine.settle(state)
                decisions.extend(settled)
            stop = engine.stop_of(state)
            if stop is not None:
                return state, stop, decisions
            state, steer = engine.take_steer(state)
            return state, steer, decisions

        return self._run(conclude)

    def catch_up(self, update: Callable[[RequestState | None], RequestState | None]) -> None:
        """Bring the state up to date with what happened elsewhere (another process).

        `update` gets the state held (`None` when none is) and returns the state the
        conversation's history shows, or `None` when the held one is current. It runs
        outside the lock (it may replay a long history); its answer is kept only if no
        other thread changed the state meanwhile, else it is asked again.
        """
        guard = self._guard
        for _ in range(_CATCH_UP_TRIES):
            with guard._lock:
                held = self._state if self._detached else guard._states.get(self.conversation)
            fresh = update(held)
            if fresh is None:
                return
            with guard._lock:
                if self._detached:
                    self._state = fresh
                    return
                if guard._states.get(self.conversation) is held:
                    guard._store(self.conversation, fresh)
                    return

    def _run(
        self, step: Callable[[RequestState], tuple[RequestState, _T, Sequence[Decision]]]
    ) -> _T:
        """Run one transition atomically, keep its state and publish its decisions."""
        guard = self._guard
        if self._detached:
            with guard._lock:
                self._state, value, decisions = step(self._state)
            self._decisions.extend(decisions)
            return value
        with guard._lock:
            state, value, decisions = step(guard._state(self.conversation))
            guard._store(self.conversation, state)
            events = guard._tally(self.conversation, decisions) if decisions else ()
        if events:
            guard._publish_all(events)
        return value


_FRESH = RequestState()  # the state of a conversation the guard holds nothing for


def _no_value(
    transition: tuple[RequestState, Sequence[Decision]],
) -> tuple[RequestState, None, Sequence[Decision]]:
    state, decisions = transition
    return state, None, decisions


def _once_key(decision: Decision) -> object:
    """What makes a decision the same decision when a turn is run again: a refusal, a
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
            return ("stop", decision.kind, decision.message)
