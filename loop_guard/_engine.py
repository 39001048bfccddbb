"""The decision engine: the only code that changes a streak, a block count or a steer.

Pure and framework-free: every transition takes a `RequestState` and returns a new one
with the decisions it implies. Adapters keep the state wherever suits them (the
`LoopGuard` registry, or a checkpointed field of the agent state) and act on the
decisions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, final

from loop_guard import _messages
from loop_guard._config import LoopGuardConfig
from loop_guard._values import Block, Call, Decision, Proceed, Result, Steer, Stop, StopKind

# Outcomes of a batch entry besides a result fingerprint. No outcome yet: not checked.
_ALLOWED = "allowed"  # checked and let through; no result yet
_BLOCKED = "blocked"  # refused by a block (counted toward abort)
_NOT_RUN = "not_run"  # refused because the request had stopped (not counted)
_IGNORED = "ignored"  # a result the guard does not see (ignored tool or error)
_UNANSWERED = (None, _ALLOWED)


class _Entry(NamedTuple):
    """A call of the open batch and what became of it so far (a tuple: made often)."""

    call: Call
    outcome: str | None = None  # None, one of the outcomes above, or a result fingerprint


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """A counted (call, result) pair: the unit a streak is made of (SPEC §0, §2)."""

    tool: str
    args: str
    result: str


@final
@dataclass(slots=True, kw_only=True)
class RequestState:
    """Everything the guard remembers about one request of one conversation.

    Treated as immutable: the engine never changes a state, every transition returns a
    new one (not `frozen=True` only because frozen construction doubles the cost of a
    step). `to_dict`/`from_dict` give a JSON-safe form for checkpointing.
    """

    request_id: str | None = None
    last: Step | None = None
    streak: int = 0
    warned: bool = False
    blocks: int = 0
    steer_pending: bool = False
    stopped: StopKind | None = None
    stop_tool: str = ""
    batch: tuple[_Entry, ...] = ()
    batch_explicit: bool = False
    settled: tuple[_Entry, ...] = ()  # the last settled batch: late siblings ask it

    @property
    def awaiting(self) -> tuple[Call, ...]:
        """Calls of the open batch still waiting for a result (and not refused)."""
        return tuple(entry.call for entry in self.batch if entry.outcome in _UNANSWERED)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe snapshot (call args are not kept, only their fingerprints)."""
        return {
            "request_id": self.request_id,
            "last": None if self.last is None else dataclasses.asdict(self.last),
            "streak": self.streak,
            "warned": self.warned,
            "blocks": self.blocks,
            "steer_pending": self.steer_pending,
            "stopped": self.stopped,
            "stop_tool": self.stop_tool,
            "batch": _entries_to_json(self.batch),
            "batch_explicit": self.batch_explicit,
            "settled": _entries_to_json(self.settled),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RequestState:
        """Rebuild a state from `to_dict` output; `None` or `{}` gives a fresh state."""
        if not data:
            return cls()
        last = data.get("last")
        return cls(
            request_id=data.get("request_id"),
            last=None if last is None else Step(**last),
            streak=int(data.get("streak", 0)),
            warned=bool(data.get("warned", False)),
            blocks=int(data.get("blocks", 0)),
            steer_pending=bool(data.get("steer_pending", False)),
            stopped=data.get("stopped"),
            stop_tool=str(data.get("stop_tool", "")),
            batch=_entries_from_json(data.get("batch", ())),
            batch_explicit=bool(data.get("batch_explicit", False)),
            settled=_entries_from_json(data.get("settled", ())),
        )


Transition = tuple[RequestState, tuple[Decision, ...]]
"""A new state and the decisions newly reached on the way to it, in order."""

Verdict = tuple[RequestState, Proceed | Block | Stop, tuple[Decision, ...]]
"""A new state, the verdict for one call, and the decisions newly reached."""


@final
class Engine:
    """SPEC §2-§4 as pure transitions over a `RequestState`, for one configuration.

    Example:
        >>> engine = Engine(LoopGuardConfig())
        >>> state = RequestState()
        >>> result = Result.of("same")
        >>> for n in range(1, 5):
        ...     call = Call.of("read", {"path": "a"})  # a new call each time
        ...     state, verdict, _ = engine.check_call(state, call)
        ...     state, decisions = engine.record_result(state, call, result)
        ...     print(n, type(verdict).__name__, [type(d).__name__ for d in decisions])
        1 Proceed []
        2 Proceed []
        3 Proceed ['Steer']
        4 Proceed []
        >>> type(engine.check_call(state, Call.of("read", {"path": "a"}))[1]).__name__
        'Block'
    """

    __slots__ = ("config",)

    def __init__(self, config: LoopGuardConfig) -> None:
        self.config = config

    def open_batch(self, state: RequestState, calls: Sequence[Call]) -> Transition:
        """Declare the calls of one model response, in the model's order (SPEC §4).

        Settles a batch still open from before. Calls already seen are skipped, so the
        same response may be declared by several adapters.
        """
        if not self.config.enabled or state.stopped is not None:
            return state, ()
        fresh = [c for c in calls if _find(state, c.id) is None and _settled(state, c.id) is None]
        if not fresh:
            return state, ()
        state, decisions = self._settle(state)
        entries = tuple(_Entry(call=c) for c in fresh)
        return _evolve(state, batch=entries, batch_explicit=True), decisions

    def check_call(self, state: RequestState, call: Call) -> Verdict:
        """Decide, before it runs, whether `call` may run (SPEC §3.2).

        Returns the new state, the verdict for this call, and the decisions reached on
        the way: a steer from settling the previous batch, this call's `Proceed` or
        `Block` when newly decided, the stop it caused. Checking a call again returns
        the verdict it already had. A verdict of `Stop` means the request had ended
        before this call's batch: nothing may run and the adapter must end the run. A
        call of the stopping batch that has not run gets a `Block` saying so; it is not
        counted as a block.
        """
        config = self.config
        if not config.enabled:
            return state, Proceed(call=call), ()
        settled = _settled(state, call.id)
        if settled is not None:  # a sibling asking after its batch was settled
            if settled.outcome in (_BLOCKED, _NOT_RUN):
                return state, self._block(state, call, _block_text(state, call)), ()
            return state, Proceed(call=call), ()
        entry = _find(state, call.id)
        if state.stopped is not None:
            if entry is None:
                return state, self._stop(state, call), ()
            if entry.outcome in (*_UNANSWERED, _NOT_RUN):
                state = _set_outcome(state, call, _NOT_RUN)
                return state, self._block(state, call, _messages.not_run_text()), ()
        if entry is not None and entry.outcome is not None:  # decided before
            if entry.outcome == _BLOCKED:
                return state, self._block(state, call, _block_text(state, call)), ()
            return state, Proceed(call=call), ()
        state, decisions = self._join(state, call)
        repeat = call.tool not in config.ignore_tools and self._repeats_last(state, call)
        if not repeat or state.streak < config.block_threshold - 1:
            proceed = Proceed(call=call)
            return _set_outcome(state, call, _ALLOWED), proceed, (*decisions, proceed)
        state = _evolve(state, blocks=state.blocks + 1)
        state = _set_outcome(state, call, _BLOCKED)
        block = self._block(state, call, _block_text(state, call))
        if state.blocks >= config.abort_threshold:
            state = _stopped(state, "abort", call.tool)
            return state, block, (*decisions, block, self._stop(state, call))
        if _complete(state):
            state, settling = self._settle(state)
            return state, block, (*decisions, block, *settling)
        return state, block, (*decisions, block)

    def check_batch(
        self, state: RequestState, calls: Sequence[Call]
    ) -> tuple[RequestState, list[Proceed | Block | Stop], tuple[Decision, ...]]:
        """Declare one model response and check all its calls at once, in its order.

        What the middleware does after the model, and what a wrapped tool does when it
        can see the response: every sibling is decided before any of them runs, so a
        stop also refuses the siblings that come before the stopping call.
        """
        state, decisions = self.open_batch(state, calls)
        verdicts: list[Proceed | Block | Stop] = []
        for call in calls:
            state, verdict, checked = self.check_call(state, call)
            verdicts.append(verdict)
            decisions = (*decisions, *checked)
        if state.stopped is not None:  # siblings allowed before the stop never run
            for index, call in enumerate(calls):
                state, verdicts[index], _ = self.check_call(state, call)
        return state, verdicts, decisions

    def record_result(self, state: RequestState, call: Call, result: Result) -> Transition:
        """Record what a call returned; settles the batch once every call is answered.

        Recording the same call twice has no effect, so adapters may overlap.
        """
        config = self.config
        if not config.enabled or _settled(state, call.id) is not None:
            return state, ()
        entry = _find(state, call.id)
        if entry is not None and entry.outcome not in _UNANSWERED:
            return state, ()
        state, decisions = self._join(state, call)
        ignored = call.tool in config.ignore_tools or (config.ignore_errors and result.is_error)
        state = _set_outcome(state, call, _IGNORED if ignored else result.fingerprint)
        if not _complete(state):
            return state, decisions
        state, settled = self._settle(state)
        return state, (*decisions, *settled)

    def settle(self, state: RequestState) -> Transition:
        """Close the open batch now, counting only the calls that have results."""
        if not self.config.enabled:
            return state, ()
        return self._settle(state)

    def take_steer(self, state: RequestState) -> tuple[RequestState, Steer | None]:
        """Claim the pending steer for delivery; later claims get `None` (once per streak)."""
        if not state.steer_pending or state.last is None:
            return state, None
        call = Call(tool=state.last.tool, fingerprint=state.last.args)
        steer = Steer(
            call=call, message=_messages.steer_text(call.tool, state.streak), streak=state.streak
        )
        return _evolve(state, steer_pending=False), steer

    def stop_of(self, state: RequestState) -> Stop | None:
        """The `Stop` that ended this request, if it has ended."""
        if state.stopped is None:
            return None
        return self._stop(state, Call(tool=state.stop_tool, fingerprint=""))

    def _join(self, state: RequestState, call: Call) -> Transition:
        """Add a call that no response declared: it joins an open undeclared batch, or
        starts a new one (a serial call) after settling the previous batch."""
        if _find(state, call.id) is not None:
            return state, ()
        decisions: tuple[Decision, ...] = ()
        if state.batch_explicit or _complete(state):
            state, decisions = self._settle(state)
        return _evolve(state, batch=(*state.batch, _Entry(call=call))), decisions

    def _block(self, state: RequestState, call: Call, message: str) -> Block:
        return Block(call=call, message=message, streak=state.streak, blocks=state.blocks)

    def _repeats_last(self, state: RequestState, call: Call) -> bool:
        last = state.last
        return last is not None and last.tool == call.tool and last.args == call.fingerprint

    def _settle(self, state: RequestState) -> Transition:
        """Compare the batch's last call (model order) with the last step (SPEC §4)."""
        if not state.batch:
            return state, ()
        config = self.config
        entries = state.batch
        # Late siblings only need ids and outcomes: the args are not kept alive.
        settled = tuple(
            _Entry(Call(tool=e.call.tool, fingerprint=e.call.fingerprint, id=e.call.id), e.outcome)
            if e.call.args is not None
            else e
            for e in entries
        )
        state = _evolve(state, batch=(), batch_explicit=False, settled=settled)
        if state.stopped is not None:  # the request is over: nothing more to count
            return state, ()
        if config.use_terminate and all(e.outcome == _BLOCKED for e in entries):
            state = _stopped(state, "terminate", entries[-1].call.tool)
            return state, (self._stop(state, entries[-1].call),)
        # The batch's last call in the model's order is compared; ignored calls and calls
        # without a result are invisible. A blocked last call changes nothing: a block
        # never resets the streak (SPEC §3.2), even beside calls that ran.
        visible = [e for e in entries if e.outcome not in (*_UNANSWERED, _IGNORED, _NOT_RUN)]
        if not visible or visible[-1].outcome == _BLOCKED:
            return state, ()
        entry = visible[-1]
        step = Step(tool=entry.call.tool, args=entry.call.fingerprint, result=str(entry.outcome))
        if step == state.last:
            state = _evolve(state, streak=state.streak + 1)
        else:
            state = _evolve(state, last=step, streak=1, warned=False)
        if state.streak < config.warn_threshold or state.warned:
            return state, ()
        state = _evolve(state, warned=True, steer_pending=True)
        steer = Steer(
            call=entry.call,
            message=_messages.steer_text(step.tool, state.streak),
            streak=state.streak,
        )
        return state, (steer,)

    def _stop(self, state: RequestState, call: Call) -> Stop:
        kind = state.stopped or "abort"
        message = (
            _messages.abort_text(state.stop_tool, state.blocks)
            if kind == "abort"
            else _messages.terminate_text(state.stop_tool)
        )
        return Stop(kind=kind, call=call, message=message, streak=state.streak, blocks=state.blocks)


def _find(state: RequestState, call_id: str) -> _Entry | None:
    for entry in state.batch:
        if entry.call.id == call_id:
            return entry
    return None


def _complete(state: RequestState) -> bool:
    return all(entry.outcome not in _UNANSWERED for entry in state.batch)


def _evolve(state: RequestState, **changes: Any) -> RequestState:
    """A new state with some fields changed (`dataclasses.replace`, spelled out: it runs
    several times per step, and the generic version costs more than the rest)."""
    clone = RequestState(
        request_id=state.request_id,
        last=state.last,
        streak=state.streak,
        warned=state.warned,
        blocks=state.blocks,
        steer_pending=state.steer_pending,
        stopped=state.stopped,
        stop_tool=state.stop_tool,
        batch=state.batch,
        batch_explicit=state.batch_explicit,
        settled=state.settled,
    )
    for name, value in changes.items():
        setattr(clone, name, value)
    return clone


def _settled(state: RequestState, call_id: str) -> _Entry | None:
    for entry in state.settled:
        if entry.call.id == call_id:
            return entry
    return None


def _entries_to_json(entries: tuple[_Entry, ...]) -> list[list[str | None]]:
    return [[e.call.id, e.call.tool, e.call.fingerprint, e.outcome] for e in entries]


def _entries_from_json(rows: Any) -> tuple[_Entry, ...]:
    return tuple(
        _Entry(call=Call(id=call_id, tool=tool, fingerprint=fp), outcome=outcome)
        for call_id, tool, fp, outcome in rows
    )


def _block_text(state: RequestState, call: Call) -> str:
    return _messages.block_text(call.tool, state.streak)


def _set_outcome(state: RequestState, call: Call, outcome: str) -> RequestState:
    # The recorded call replaces the declared one: it carries the real args.
    batch = tuple(
        _Entry(call=call if call.args is not None else e.call, outcome=outcome)
        if e.call.id == call.id
        else e
        for e in state.batch
    )
    return _evolve(state, batch=batch)


def _stopped(state: RequestState, kind: StopKind, tool: str) -> RequestState:
    # A stop drops any steer still queued: the model will not be called again.
    return _evolve(state, stopped=kind, stop_tool=tool, steer_pending=False)
