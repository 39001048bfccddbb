"""`LoopGuard`: the engine plus per-conversation state; `Session`: one conversation's
transitions. The guard's events and counters: `_events.py`."""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, final

from typing_extensions import Unpack

from loop_guard._config import LoopGuardConfig, LoopGuardOptions, annotation_hint, resolve_config
from loop_guard._engine import JUDGED_STEPS, Earlier, Engine
from loop_guard._events import Events, EventSink, GuardStats
from loop_guard._siblings import SharedRuns
from loop_guard._state import SCHEMA_VERSION, RequestState, migrate
from loop_guard._values import Block, Call, Decision, Proceed, Result, Steer, Stop

_T = TypeVar("_T")

_SNAPSHOTS_KEPT = 256  # the latest snapshot of as many conversations, at least
_CATCH_UP_TRIES = 4  # other threads' transitions interleaved with a catch-up, at most


@final
class LoopGuard:
    """Stop an agent that repeats the same tool call and gets the same result.

    One instance serves any number of concurrent conversations; each conversation's
    state is kept under its key and reset at every new request (see How the guard
    decides: reset and scope). A conversation's transitions are its `session`'s: the adapters
    (`LoopGuardMiddleware`, `LoopGuardCallbackHandler`, `guard_tools`, `LoopGuardNode`)
    are thin layers over them; call them directly to guard a custom agent loop.

    Args:
        config: Settings; when `None`, read from the `LOOP_GUARD_*` variables.
        on_event: Called with a `GuardEvent` for every steer, block and stop. An
            exception it raises is logged, never passed on to the agent.
        max_conversations: Conversations kept at once; the least recently used one is
            forgotten beyond this, so a long-lived server stays bounded.
        **options: Any setting (`LoopGuardOptions`: `warn_threshold`, `block_threshold`,
            `abort_threshold`, `ignore_tools`, `tools`, ...); one given wins over `config`
            and the environment, one not given keeps coming from them.

    Raises:
        ValueError: If an explicit argument is invalid (see How the guard decides: configuration).

    Examples:
        >>> guard = LoopGuard(block_threshold=4)
        >>> session = guard.session("thread-1")
        >>> session.start_request("request-1")
        >>> for n in range(1, 5):
        ...     call = Call.of("read", {"path": "notes.md"}, id=f"call_{n}")
        ...     verdict = session.check_call(call)
        ...     if isinstance(verdict, Proceed):
        ...         session.record_result(call, Result.of("File not found"))
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
        on_event: EventSink | None = None,
        max_conversations: int = 10_000,
        **options: Unpack[LoopGuardOptions],
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
        self._engine = Engine(resolve_config(config, options))
        self._events = Events(on_event=on_event, limit=max_conversations)
        self._conversations = _Conversations(max_conversations)
        self._snapshots = _Snapshots()
        self.siblings = SharedRuns()  # identical siblings share one run (`dedupe_siblings`)
        self._node_attached = False
        self.tool_names: frozenset[str] | None = None  # see `add_tools`

    @property
    def on_event(self) -> EventSink | None:
        """The callable given as `on_event`; may be replaced."""
        return self._events.on_event

    @on_event.setter
    def on_event(self, on_event: EventSink | None) -> None:
        self._events.on_event = on_event

    @property
    def max_conversations(self) -> int:
        """The bound given as `max_conversations`; may be changed."""
        return self._conversations.limit

    @max_conversations.setter
    def max_conversations(self, limit: int) -> None:
        self._conversations.limit = self._events.limit = limit

    def add_tools(self, tools: Iterable[object]) -> None:
        """Make these tools known: names, or tool objects (`guard_tools` and the
        middleware pass theirs).

        A call to a tool not known is one to a missing tool only when the tool node
        answered it so; while no tools are known, none is (the faces that read results
        from a history cannot tell otherwise). A tool object's MCP annotations
        (`readOnlyHint`, `destructiveHint` in its `metadata`, as
        `langchain-mcp-adapters` sets them) say whether it changes state.

        Examples:
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
        with self._conversations.lock:  # the engine learns between transitions
            self.tool_names = frozenset((*(self.tool_names or ()), *names))
            if hints:
                self._engine.learn(hints)

    @property
    def config(self) -> LoopGuardConfig:
        """The settings in force."""
        return self._engine.config

    @property
    def engine(self) -> Engine:
        """Deprecated: the engine is private; use the guard's own methods."""
        warnings.warn(
            "LoopGuard.engine is private and will be removed; use the guard's own methods",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._engine

    @property
    def stats(self) -> GuardStats:
        """A snapshot of the counters: calls decided, steers, blocks and stops."""
        return self._events.stats

    def subscribe(self, sink: EventSink) -> None:
        """Also send every event to `sink` (idempotent); adapters use it for tracing."""
        self._events.subscribe(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        """Stop sending events to `sink`, subscribed before with `subscribe`."""
        self._events.unsubscribe(sink)

    def attach_node(self) -> None:
        """Say that a graph node (`LoopGuardNode`) delivers this guard's steers, so that
        the guarded tools leave them to it (`node_attached`)."""
        self._node_attached = True

    @property
    def node_attached(self) -> bool:
        """Whether a graph node delivers this guard's steers (`attach_node`)."""
        return self._node_attached

    def session(
        self,
        conversation: str,
        snapshot: Mapping[str, Any] | None = None,
        *,
        call_keys: Callable[[], Mapping[str, str]] | None = None,
    ) -> Session:
        """The transitions of one conversation: the one way to decide its calls.

        Without `snapshot` the guard keeps the conversation's state (bounded by
        `max_conversations`). With one, the caller keeps it, e.g. in a checkpoint:
        pass the `Session.snapshot()` it saved last, or `{}` when it has none yet, and
        save the new `snapshot()` after the transitions. Its decisions are published
        when the caller says (`Session.publish`), once even when the caller runs the
        same transitions again on the same snapshot (a retried model call).

        A snapshot an earlier version wrote is brought to the current shape
        (`Session.migrated` says so). Such a snapshot may name the calls of its latest
        responses by their tool-call ids: `call_keys`, asked only then, maps those ids to
        their keys now (`Call.key`), read from the history.

        Examples:
            >>> guard = LoopGuard()
            >>> kept = guard.session("thread-1", {})  # the caller keeps a fresh state
            >>> kept.start_request("request-1")
            >>> saved = kept.snapshot()
            >>> guard.session("thread-1", saved).state.request_id
            'request-1'
            >>> guard.session("thread-1").state.request_id is None  # the guard holds none
            True
            >>> old = {"request_id": "r", "batch": [["call_1", "ls", "f1", "allowed"]]}
            >>> session = guard.session("t", old, call_keys=lambda: {"call_1": "reply-7#0"})
            >>> session.migrated, session.state.batch[0].call.key
            (True, 'reply-7#0')
        """
        migrated = False
        if snapshot and snapshot.get("v") != SCHEMA_VERSION:
            snapshot = migrate(snapshot, None if call_keys is None else call_keys())
            migrated = True
        return Session(
            conversation,
            None if snapshot is None else self._snapshots.read(snapshot),
            engine=self._engine,
            events=self._events,
            conversations=self._conversations,
            snapshots=self._snapshots,
            migrated=migrated,
        )

    def blocks_any(self, snapshot: Mapping[str, Any]) -> bool:
        """Whether a call of the latest responses of a caller-kept snapshot was blocked
        (or not run, the request stopped): what a tool node asks before each call, asked
        without a conversation's session, so the common answer (`False`) costs no more
        than reading the snapshot.

        Examples:
            >>> LoopGuard().blocks_any({})
            False
        """
        state = self._snapshots.read(snapshot)
        return any(entry.block is not None for entry in (*state.batch, *state.settled))

    def serve_judge(self) -> None:
        """Check that this guard keeps the recent steps a judge reads (`JUDGED_STEPS`).

        Raises:
            ValueError: If its settings keep fewer (`LoopGuardConfig.pi()`, say).
        """
        if self._engine.memory < JUDGED_STEPS:
            msg = (
                f"judge needs the last {JUDGED_STEPS} steps of a request, which the guard "
                f"keeps with detect_interleaved (repeat_window >= {JUDGED_STEPS}) or "
                f"detect_cycles (max_cycle_period >= {JUDGED_STEPS}) on"
            )
            raise ValueError(msg)

    def report_fault(self, conversation: str | None, error: BaseException) -> None:
        """The guard failed on an event: the agent goes on unguarded for that event.

        Logs one ERROR (with the traceback) and publishes an `error` event; the next
        events are judged normally. Adapters call it instead of letting a fault of the
        guard reach the agent.
        """
        self._events.fault(conversation, error)

    # Deprecated: each conversation's transitions are its `session`'s.

    def detached(self, conversation: str, snapshot: Mapping[str, Any] | None) -> Session:
        """Deprecated: `session(conversation, snapshot)`, `{}` for no snapshot yet."""
        _deprecated("detached", "session(conversation, snapshot) ({} for no snapshot yet)")
        return self.session(conversation, {} if snapshot is None else snapshot)

    def start_request(self, conversation: str, request_id: str) -> None:
        """Deprecated: `session(conversation).start_request(request_id)`."""
        _deprecated("start_request", "session(conversation).start_request(request_id)")
        self.session(conversation).start_request(request_id)

    def end_request(self, conversation: str) -> None:
        """Deprecated: `session(conversation).end_request()`."""
        _deprecated("end_request", "session(conversation).end_request()")
        self.session(conversation).end_request()

    def open_batch(self, conversation: str, calls: Sequence[Call]) -> None:
        """Deprecated: `session(conversation).open_batch(calls)`."""
        _deprecated("open_batch", "session(conversation).open_batch(calls)")
        self.session(conversation).open_batch(calls)

    def check_call(self, conversation: str, call: Call) -> Proceed | Block | Stop:
        """Deprecated: `session(conversation).check_call(call)`."""
        _deprecated("check_call", "session(conversation).check_call(call)")
        return self.session(conversation).check_call(call)

    def check_batch(self, conversation: str, calls: Sequence[Call]) -> list[Proceed | Block | Stop]:
        """Deprecated: `session(conversation).check_batch(calls)`."""
        _deprecated("check_batch", "session(conversation).check_batch(calls)")
        return self.session(conversation).check_batch(calls)

    def record_result(self, conversation: str, call: Call, result: Result) -> None:
        """Deprecated: `session(conversation).record_result(call, result)`."""
        _deprecated("record_result", "session(conversation).record_result(call, result)")
        self.session(conversation).record_result(call, result)

    def settle(self, conversation: str) -> None:
        """Deprecated: `session(conversation).settle()`."""
        _deprecated("settle", "session(conversation).settle()")
        self.session(conversation).settle()

    def take_steer(self, conversation: str) -> Steer | None:
        """Deprecated: `session(conversation).take_steer()`."""
        _deprecated("take_steer", "session(conversation).take_steer()")
        return self.session(conversation).take_steer()

    def stop_of(self, conversation: str) -> Stop | None:
        """Deprecated: `session(conversation).stop`."""
        _deprecated("stop_of", "session(conversation).stop")
        return self.session(conversation).stop


@final
class _Conversations:
    """The request state of each conversation a guard keeps, the least recently used
    first and at most `limit`, and the conversations a graph node steers."""

    __slots__ = ("limit", "lock", "node_served", "runs", "states")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lock = threading.Lock()  # held by every transition, caller-kept ones too
        self.states: OrderedDict[str, RequestState] = OrderedDict()
        self.node_served: set[str] = set()  # conversations a `LoopGuardNode` steers
        self.runs = _LastRuns()

    def get(self, conversation: str) -> RequestState:
        """The state held for `conversation`, or a fresh one; no lock: reading a dict
        entry is atomic, and a stored state is never changed."""
        return self.states.get(conversation) or _FRESH

    def store(self, conversation: str, state: RequestState) -> None:
        """Keep `state` as the conversation's latest (under `lock`)."""
        self.states[conversation] = state
        self.states.move_to_end(conversation)
        while len(self.states) > self.limit:
            forgotten, _ = self.states.popitem(last=False)
            self.node_served.discard(forgotten)

    def forget(self, conversation: str) -> None:
        """Drop a finished conversation's state."""
        with self.lock:
            self.states.pop(conversation, None)
            self.node_served.discard(conversation)

    def serve_by_node(self, conversation: str) -> None:
        """A graph node steers `conversation`, while its state is held."""
        with self.lock:
            if conversation in self.states:
                self.node_served.add(conversation)


@final
class _LastRuns:
    """The last result read of each call (conversation, tool and args) in this process,
    the least recently read first and at most `_RUNS_KEPT`: where the faces that see no
    history (the handler, wrapped tools) find what an earlier run returned (`Earlier`,
    `Session.record_result`).
    A result gone from it only leaves that run unmasked (see `Engine.record_result`)."""

    __slots__ = ("_lock", "_results")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: OrderedDict[tuple[str, str, str], Result] = OrderedDict()

    def of(self, conversation: str) -> Earlier:
        """`Earlier` for the calls of `conversation`."""

        def earlier(call: Call) -> Iterable[Result]:
            found = self._results.get((conversation, call.tool, call.fingerprint))
            return () if found is None else (found,)

        return earlier

    def keep(self, conversation: str, call: Call, result: Result) -> None:
        """Keep `result` as the last run of `call` in `conversation`."""
        key = (conversation, call.tool, call.fingerprint)
        with self._lock:
            self._results[key] = result
            self._results.move_to_end(key)
            if len(self._results) > _RUNS_KEPT:
                self._results.popitem(last=False)


# Results kept by `_LastRuns`: each holds its text until masked, so few (a loop's earlier
# run is among the last few read).
_RUNS_KEPT = 128


@final
class _Snapshots:
    """Snapshots written lately, by id, with the states they were written from, so that
    reading one back costs nothing while the caller hands the same snapshot back (the
    next hook of the agent)."""

    __slots__ = ("_lock", "_written")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: OrderedDict[int, tuple[Mapping[str, Any], RequestState]] = OrderedDict()

    def read(self, snapshot: Mapping[str, Any] | None) -> RequestState:
        """The state of a snapshot; one written here is not parsed again."""
        known = self._written.get(id(snapshot))  # atomic; an entry is never changed
        if known is not None and known[0] is snapshot:
            return known[1]
        return RequestState.from_dict(snapshot)

    def write(self, state: RequestState) -> dict[str, Any]:
        """`state`'s snapshot, remembered with it."""
        snapshot = state.to_dict()
        with self._lock:
            self._written[id(snapshot)] = (snapshot, state)  # held: its id stays its own
            if len(self._written) > _SNAPSHOTS_KEPT:
                self._written.popitem(last=False)
        return snapshot


@final
class Session:
    """One conversation's transitions, made by `LoopGuard.session`.

    Each method runs one engine transition atomically, keeps the new state (in the
    guard, or in the session when the caller keeps it as a snapshot) and publishes the
    decisions it reached (counted in `stats`, logged, sent to `on_event`; a caller-kept
    session's on `publish`), so an adapter only acts on what a method returns.

    Examples:
        >>> guard = LoopGuard(warn_threshold=2)
        >>> session = guard.session("thread-1")
        >>> for n in range(2):
        ...     call = Call.of("ls", {}, id=f"call_{n}")
        ...     _ = session.check_call(call)
        ...     session.record_result(call, Result.of("empty"))
        >>> session.take_steer().streak, guard.stats.steers
        (2, 1)
    """

    __slots__ = (
        "_caller_keeps",
        "_conversations",
        "_decisions",
        "_engine",
        "_events",
        "_snapshots",
        "_state",
        "conversation",
        "migrated",
    )

    def __init__(
        self,
        conversation: str,
        state: RequestState | None,
        *,
        engine: Engine,
        events: Events,
        conversations: _Conversations,
        snapshots: _Snapshots,
        migrated: bool = False,
    ) -> None:
        """A guard's collaborators for one conversation; `state` when the caller keeps it;
        `migrated`, whether it was read from an earlier version's snapshot."""
        self._engine = engine
        self._events = events
        self._conversations = conversations
        self._snapshots = snapshots
        self.conversation = conversation
        self.migrated = migrated
        self._caller_keeps = state is not None
        self._state = _FRESH if state is None else state  # unused when the guard keeps it
        self._decisions: list[Decision] = []  # adopted, or a caller-kept session's: until `publish`

    def adopt(self, decisions: Sequence[Decision]) -> None:
        """Take decisions reached for this conversation while its state caught up on a
        history (`catch_up`) as its own, to be published with its next `publish`: those
        no session saw live (results another agent handed over, say)."""
        self._decisions.extend(decisions)

    def publish(self) -> None:
        """Publish the decisions adopted, and a caller-kept session's so far, once per
        point of its request (its request and the steps counted in it)."""
        if self._decisions:
            state = self.state
            turn = (state.request_id, state.counted)
            decisions, self._decisions = self._decisions, []
            self._events.publish_once(self.conversation, turn, decisions)

    def snapshot(self) -> dict[str, Any]:
        """The state as a JSON-safe snapshot (`RequestState.to_dict`)."""
        return self._snapshots.write(self.state)

    @property
    def state(self) -> RequestState:
        """The conversation's current request state."""
        if self._caller_keeps:
            return self._state
        return self._conversations.get(self.conversation)

    @property
    def stop(self) -> Stop | None:
        """The `Stop` that ended the current request, if it has ended."""
        return self._engine.stop_of(self.state)

    @property
    def awaiting(self) -> tuple[Call, ...]:
        """The calls of the open batch still waiting for a result (and not blocked)."""
        return self.state.awaiting

    @property
    def steer_pending(self) -> bool:
        """Whether a steer message is due before the model's next call."""
        return self.state.steer_pending

    @property
    def latest_calls(self) -> tuple[Call, ...]:
        """The calls of the open batch, then of the last settled one."""
        return self.state.latest

    def checked(self, keys: Sequence[str]) -> bool:
        """Whether every one of these calls (by `Call.key`) has its verdict already."""
        return self._engine.checked(self.state, keys)

    def awaits_result(self, call: Call) -> bool:
        """Whether `call` still waits for its result: not recorded, nor blocked, yet.

        Lets an adapter skip reading a result another one recorded already.
        """
        return self._engine.awaits_result(self.state, call.key)

    @property
    def served_by_node(self) -> bool:
        """Whether a graph node delivers this conversation's steers (`serve_by_node`)."""
        return self.conversation in self._conversations.node_served

    def serve_by_node(self) -> None:
        """A graph node delivers this conversation's steers as messages of their own."""
        self._conversations.serve_by_node(self.conversation)

    def verdict_of(self, call: Call) -> Proceed | Block | Stop | None:
        """The verdict `call` already had, or `None` when it was not decided yet."""
        state = self.state
        if not self._engine.checked(state, [call.key]):
            return None
        return self._engine.check_call(state, call)[1]

    def start_request(self, request_id: str, question: str = "") -> None:
        """Begin a request, unless `request_id` is the current one.

        `question` fingerprints the user message that began it (any string that is equal
        for equal messages; "" when unknown): the same message as the previous request's
        brings nothing new, so what earlier turns did counts (repeats across user turns).
        See How the guard decides: reset.
        """

        def start(state: RequestState) -> tuple[RequestState, None, tuple[Decision, ...]]:
            if state.request_id == request_id:
                return state, None, ()
            return self._engine.start_request(state, request_id, question), None, ()

        self._run(start)

    def end_request(self) -> None:
        """Forget the conversation, its request finished: the state the guard keeps and
        its memory of published events (frees their memory)."""
        self._conversations.forget(self.conversation)
        self._events.forget(self.conversation)

    def open_batch(self, calls: Sequence[Call], tokens: int = 0) -> None:
        """Declare the calls of one model response, in the model's order; `tokens` is
        what the response cost (charged if it is part of a loop: `LoopCost`).

        See How the guard decides: batches.
        """
        self._run(lambda state: _no_value(self._engine.open_batch(state, calls, tokens)))

    def check_call(self, call: Call) -> Proceed | Block | Stop:
        """Decide whether `call` may run; atomic, so racing identical calls cannot slip by."""
        return self._run(lambda state: self._engine.check_call(state, call))

    def check_batch(self, calls: Sequence[Call], tokens: int = 0) -> list[Proceed | Block | Stop]:
        """Declare a model response (which cost `tokens`) and decide all its calls at
        once, in its order."""
        return self._run(lambda state: self._engine.check_batch(state, calls, tokens))

    def record_result(self, call: Call, result: Result, earlier: Earlier | None = None) -> None:
        """Record a call's result; recording the same call twice has no effect.

        `earlier` finds what earlier runs of a call returned, for a result read unmasked
        (`Engine.record_result`): an adapter that sees the conversation's history looks
        there. Without it, they are found among the last results recorded without one
        in this process, which this one joins (a small cache, `_LastRuns`).
        """
        runs = None
        if earlier is None:
            runs = self._conversations.runs
            earlier = runs.of(self.conversation)
        self._run(lambda state: _no_value(self._engine.record_result(state, call, result, earlier)))
        if runs is not None and result.masked is not None:  # else it is never looked for
            runs.keep(self.conversation, call, result)

    def settle(self) -> None:
        """Close the open batch now, counting the calls that have results."""
        self._run(lambda state: _no_value(self._engine.settle(state)))

    def repeated_text(self, reply_id: str, repeats: int, tokens: int = 0) -> Steer | Stop | None:
        """Say that the reply `reply_id` (its message id) was cut where it began
        repeating its own text, `repeats` times by then (`TextWatch`); `tokens` is what
        it cost. What comes next: the `Stop` that ended the request, else the message
        due before the model's next call (a `Steer`, claimed for delivery by `finish`
        or `take_steer`, not here), else `None`. Saying it of the same reply again
        changes nothing.

        Examples:
            >>> session = LoopGuard().session("thread-1")
            >>> type(session.repeated_text("reply-1", repeats=40)).__name__
            'Steer'
        """

        def record(
            state: RequestState,
        ) -> tuple[RequestState, Steer | Stop | None, Sequence[Decision]]:
            engine = self._engine
            state, decisions = engine.repeated_text(state, reply_id, repeats, tokens)
            return state, engine.stop_of(state) or state.steer, decisions

        return self._run(record)

    def kept_out(self, chars: int, tokens: int = 0) -> None:
        """Say that compacting a model call's input kept `chars` characters (about
        `tokens` tokens) out of the model's context (`LoopCost.chars_kept_out`).

        Examples:
            >>> guard = LoopGuard()
            >>> guard.session("thread-1").kept_out(4_000, tokens=1_000)
            >>> guard.stats.cost.chars_kept_out, guard.stats.cost.tokens_kept_out
            (4000, 1000)
        """
        self._run(lambda state: _no_value(self._engine.kept_out(state, chars, tokens)))

    def judge_due(self, every: int) -> bool:
        """Whether the judge is to be asked about the request now (`Engine.judge_due`):
        `every` counted steps since it last was, and recent steps that brought little new."""
        return self._engine.judge_due(self.state, every)

    def judged(self, *, progress: bool, tokens: int = 0, reason: str = "") -> Steer | None:
        """Record the judge's verdict (`tokens`: what its call cost; `reason`: its words,
        for logs); the steer it makes due when it found no progress, else `None`. The
        steer is delivered as any other (`finish`, `take_steer`)."""

        def record(state: RequestState) -> tuple[RequestState, Steer | None, Sequence[Decision]]:
            state, decisions = self._engine.judged(
                state, progress=progress, tokens=tokens, reason=reason
            )
            steer = next((d for d in decisions if isinstance(d, Steer)), None)
            return state, steer, decisions

        return self._run(record)

    @property
    def asked_about(self) -> str | None:
        """The `Call.key` of the call a person is asked about once the request stopped."""
        return self._engine.asked_about(self.state)

    def resume(self, call: Call, *, afresh: bool = False) -> None:
        """Let the stopped request go on, `call` run after all (`Engine.resume`)."""
        self._run(lambda state: _no_value(self._engine.resume(state, call, afresh=afresh)))

    def take_steer(self) -> Steer | None:
        """Claim the pending steer message for delivery; once per streak."""
        return self._run(lambda state: (*self._engine.take_steer(state), ()))

    def finish(
        self,
        results: Sequence[tuple[Call, Result]] = (),
        *,
        settle: bool = True,
        claim: bool = True,
        earlier: Earlier | None = None,
    ) -> Stop | Steer | None:
        """Record the last batch's `results` (`earlier`: as for `record_result`), close
        the batch, counting the calls that have results (unless `settle` is false: the
        batch's response is not in sight), and say what comes next: the `Stop` that
        ended the request, else the due steer, claimed for delivery (once per streak;
        left due when `claim` is false), else `None`. One transition."""

        def conclude(
            state: RequestState,
        ) -> tuple[RequestState, Stop | Steer | None, Sequence[Decision]]:
            engine = self._engine
            decisions: list[Decision] = []
            for call, result in results:
                state, recorded = engine.record_result(state, call, result, earlier)
                decisions.extend(recorded)
            if settle:
                state, settled = engine.settle(state)
                decisions.extend(settled)
            stop = engine.stop_of(state)
            if stop is not None:
                return state, stop, decisions
            if not claim:
                return state, state.steer, decisions
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
        conversations = self._conversations
        for _ in range(_CATCH_UP_TRIES):
            with conversations.lock:
                held = (
                    self._state
                    if self._caller_keeps
                    else conversations.states.get(self.conversation)
                )
            fresh = update(held)
            if fresh is None:
                return
            with conversations.lock:
                if self._caller_keeps:
                    self._state = fresh
                    return
                if conversations.states.get(self.conversation) is held:
                    conversations.store(self.conversation, fresh)
                    return

    def _run(
        self, step: Callable[[RequestState], tuple[RequestState, _T, Sequence[Decision]]]
    ) -> _T:
        """Run one transition atomically, keep its state and publish its decisions."""
        conversations = self._conversations
        if self._caller_keeps:
            with conversations.lock:
                self._state, value, decisions = step(self._state)
            self._decisions.extend(decisions)
            return value
        with conversations.lock:
            state, value, decisions = step(conversations.get(self.conversation))
            conversations.store(self.conversation, state)
        if decisions:
            self._events.publish(self.conversation, decisions)
        return value


_FRESH = RequestState()  # the state of a conversation the guard holds nothing for


def _no_value(
    transition: tuple[RequestState, Sequence[Decision]],
) -> tuple[RequestState, None, Sequence[Decision]]:
    state, decisions = transition
    return state, None, decisions


def _deprecated(name: str, instead: str) -> None:
    message = f"LoopGuard.{name} is deprecated: call guard.{instead}"
    warnings.warn(message, DeprecationWarning, stacklevel=3)  # the caller of the method
