"""The decision engine: the only code that changes a streak, a block count or a steer.

Pure and framework-free: every transition takes a `RequestState` and returns a new one
with the decisions it implies. Adapters keep the state wherever suits them (the
`LoopGuard` registry, or a checkpointed field of the agent state) and act on the
decisions.

Glossary (one word per concept, in code and docs):

- *call*: one tool call of a model response, keyed by its response and position (`Call.key`);
  *batch*: the calls of one response; *settle*: close a batch once its calls are answered.
  Where a call stands: *declared* (its response was seen: `declared`), *checked* (it has
  its verdict: `checked`, `Session.verdict_of`), *awaiting* its result (`awaits_result`),
  *answered* (it has its outcome).
- *result*: what a call returned, as a fingerprint; *outcome*: what became of a batch entry
  (its result, an `Answer`, or an `Outcome`: `ALLOWED`, `BLOCKED`, `NOT_RUN`, `IGNORED`);
  *variant*: the result as returned when its fresh values were masked (a *near-repeat*
  differs only there); a result read *unmasked* is kept as returned (`EXACT`) while its
  call is new to the request, and masked with its earlier runs once the call recurs.
- *step*: a counted (tool, args, result); *streak*: identical steps in a row; *lap*: one
  round of a cycle; *turn*: one request, from a user message on.
- *steer*: the message that tells the model to change course, *pending* until delivered;
  *block*: a call not run, answered with the reason; *stop*: the end of a request, once
  `abort_threshold` calls were blocked (or, with `use_terminate`, every call of a batch);
  *backstop*: the block of a steered call's Nth run however spread out.
- *change*: a successful call of a tool that changes state, not one re-applied; *weak*
  evidence: a shell's exit status, an error read off the result's text ("Error: ..."),
  or errors alike only once their quoted args are masked.

Theory of operation. The state is one request of one conversation: the open batch (the
calls of one model response and what became of each), the last settled batch, and what
the counted steps built up: the streak of identical steps, the recent steps and the
runs that make cycles, the calls the model was steered away from, the tools found
missing or failing whatever their args.

The transitions follow a batch. `open_batch` declares a response's calls; `check_call`
decides one call before it runs (the block detectors); `record_result` answers it;
the last answer settles the batch, whose last call in the model's order is the counted
step (`_count`), and the steer detectors then look at it. A call no response declared
joins an undeclared batch, or starts one once the last is settled (a serial call). A
block never resets the streak; enough blocks stop the request, and a stopped request
runs nothing more.

The detectors live in `_detectors`, one record per kind of loop (`DETECTORS`), their
checks in the order they are tried: the steers `streak`, `returned`, `cycle`,
`interleaved` (and `steer_broken` for the tools a batch showed broken), each handed what
it sees of a counted step (`SteerSight`); the blocks `streak_block`, `cycle_block`,
`backstop`, each handed what it sees of a call about to run (`Sight`). One decision
per step: the first to fire wins, the most specific evidence first, so a loop is
reported once, by the detector that names it best; each detector records what keeps it
from firing twice for the same loop.

A new request (`start_request`) starts afresh but for two things, kept while
interleaved repeats are detected: the changes made (edits, writes: a check repeated
after one asks a new question) and the distinct steps each of the last few user turns
counted (a call met in several turns that bring nothing new is a repeat).

A transition that changes anything copies the state it was given once (`clone`); the
private helpers and the detectors change that copy in place, so a step builds one new
state, not one per field it touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import cast, final

from loop_guard import _messages
from loop_guard._config import LoopGuardConfig
from loop_guard._detectors import (
    BLOCKS,
    STEERS,
    Cycle,
    Sight,
    SteerSight,
    side_by_side,
    steer_broken,
    window,
)
from loop_guard._messages import CONTEXT, JUDGE, REPLY
from loop_guard._state import (
    ALLOWED,
    BLOCKED,
    EXACT,
    IGNORED,
    NOT_RUN,
    SAME_ERROR_ARGS,
    UNKNOWN_ARGS,
    Answer,
    Entry,
    Failing,
    Outcome,
    RequestState,
    Steered,
    Step,
    clone,
    position,
)
from loop_guard._values import (
    NO_COST,
    Block,
    Call,
    Charge,
    Decision,
    Judged,
    LoopCost,
    Proceed,
    Result,
    Steer,
    Stop,
    StopReason,
    make_call,
)

_FAILING_KEPT = 32  # tools whose errors are followed per request, for same-error detection
_SAME_ERROR_VARIANTS = 3  # different argument sets among a broken tool's identical errors
_CHANGES_KEPT = 8  # changes remembered, to tell a new change from one re-applied
TURNS_KEPT = 4  # earlier user turns whose steps are remembered, for repeats across turns
JUDGED_STEPS = 6
"""Recent steps the judge needs before it is asked (the engine must remember as many)."""


Transition = tuple[RequestState, tuple[Decision, ...]]
"""A new state and the decisions newly reached on the way to it, in order."""

Verdict = tuple[RequestState, Proceed | Block | Stop, tuple[Decision, ...]]
"""A new state, the verdict for one call, and the decisions newly reached."""

Earlier = Callable[[Call], Iterable[Result]]
"""Where an adapter finds what earlier runs of a call returned: the results of the calls
with its tool and args that it can still see (a history, a cache), read as it reads a
live result. Any order; the engine takes the one it needs by fingerprint, so a result
that is gone (a history trimmed) only leaves its run unmasked."""


@final
class Engine:
    """The guard's rules as pure transitions over a `RequestState`, for one configuration.

    See How the guard decides: the streak, graded intervention, batches, and beyond the
    Pi extension.

    Examples:
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
        3 Proceed ['Charge', 'Steer']
        4 Proceed ['Charge']
        >>> type(engine.check_call(state, Call.of("read", {"path": "a"}))[1]).__name__
        'Block'
    """

    __slots__ = (
        "_changing",
        "_follows_beside",
        "_follows_changes",
        "_no_runs",
        "_periods",
        "_warns",
        "config",
        "hints",
        "memory",
    )

    config: LoopGuardConfig
    memory: int
    hints: Mapping[str, bool]
    """Counted steps remembered: enough for the interleaved window and the longest cycle."""

    def __init__(self, config: LoopGuardConfig) -> None:
        self.config = config
        self._periods = range(2, config.max_cycle_period + 1) if config.detect_cycles else range(0)
        self._no_runs = (0,) * len(self._periods)
        self.memory = max(
            config.repeat_window if config.detect_interleaved else 1,
            config.max_cycle_period if config.detect_cycles else 1,
        )
        # Changes matter to the detectors that look past other calls.
        self._follows_changes = config.detect_interleaved or config.escalate_ignored
        # Calls repeated side by side in every batch: steered, then blocked by the backstop.
        self._follows_beside = config.detect_interleaved and config.escalate_ignored
        self.hints: Mapping[str, bool] = {}  # per tool: changes state, by its annotations
        # Per tool: whether it changes state, decided on its first successful call (its
        # name's words are parsed once, not on every step); `learn` starts it afresh.
        self._changing: dict[str, bool] = {}
        # The steer threshold of each tool with a policy (the others have the guard's).
        self._warns = {tool: config.thresholds(tool).warn for tool in config.tools}

    def learn(self, hints: Mapping[str, bool]) -> None:
        """Add what tools say of themselves: whether each changes state (MCP annotations)."""
        self.hints = {**self.hints, **hints}
        self._changing = {}

    def start_request(
        self, previous: RequestState | None, request_id: str | None, question: str = ""
    ) -> RequestState:
        """A fresh state for a new request of a conversation (see How the guard decides: reset).

        Everything resets except what the detectors beyond Pi look back on: the steps
        each earlier turn counted (repeats across user turns) and the changes made.
        `question` fingerprints the user message that began the request ("" when
        unknown): the same message as the previous request's brings nothing new.
        """
        if not self.config.detect_interleaved:
            return RequestState(request_id=request_id)
        if previous is None:
            return RequestState(request_id=request_id, question=question)
        turns = previous.turns
        steps = _turn_steps(previous)
        if steps:  # a turn that ran no tool says nothing about repeats
            turns = (*turns, steps)[-TURNS_KEPT:]
        return RequestState(
            request_id=request_id,
            changes=previous.changes,
            turns=turns,
            question=question,
            asked_again=bool(question) and question == previous.question,
        )

    def open_batch(self, state: RequestState, calls: Sequence[Call], tokens: int = 0) -> Transition:
        """Declare the calls of one model response, in the model's order.

        See How the guard decides: batches.

        Settles a batch still open from before. Calls already seen are skipped, so the
        same response may be declared by several adapters. `tokens` is what the response
        cost (its `usage_metadata`), charged if it turns out to be part of a loop.
        """
        if not self.config.enabled or state.stopped is not None:
            return state, ()
        fresh = [call for call in calls if not self.declared(state, call.key)]
        if not fresh:
            return state, ()
        state = clone(state)
        decisions = self._settle(state)
        state.batch = tuple(map(Entry, fresh))
        state.batch_explicit = True
        state.batch_tokens = tokens
        return state, decisions

    def check_call(self, state: RequestState, call: Call) -> Verdict:
        """Decide, before it runs, whether `call` may run.

        See How the guard decides: block, and beyond the Pi extension.

        Returns the new state, the verdict for this call, and the decisions reached on
        the way: a steer from settling the previous batch, this call's `Proceed` or
        `Block` when newly decided, the stop it caused. Checking a call again returns
        the verdict it already had. A verdict of `Stop` means the request had ended
        before this call's batch: nothing may run and the adapter must end the run. A
        call of the stopping batch that has not run gets a `Block` saying so; it is not
        counted as a block.
        """
        return self._check_call(state, call, state)

    def check_batch(
        self, state: RequestState, calls: Sequence[Call], tokens: int = 0
    ) -> tuple[RequestState, list[Proceed | Block | Stop], tuple[Decision, ...]]:
        """Declare one model response and check all its calls at once, in its order.

        What the middleware does after the model, and what a wrapped tool does when it
        can see the response: every sibling is decided before any of them runs, so a
        stop also blocks the siblings that come before the stopping call.
        """
        given = state
        state, decisions = self.open_batch(state, calls, tokens)
        verdicts: list[Proceed | Block | Stop] = []
        for call in calls:
            state, verdict, checked = self._check_call(state, call, given)
            verdicts.append(verdict)
            decisions = (*decisions, *checked)
        if state.stopped is not None:  # siblings allowed before the stop never run
            for index, call in enumerate(calls):
                state, verdicts[index], charged = self._check_call(state, call, given)
                decisions = (*decisions, *charged)
            # The stop tells what the request cost, its blocked siblings included.
            decisions = tuple(
                replace(d, cost=state.cost) if isinstance(d, Stop) else d for d in decisions
            )
        return state, verdicts, decisions

    def record_result(
        self, state: RequestState, call: Call, result: Result, earlier: Earlier | None = None
    ) -> Transition:
        """Record what a call returned; settles the batch once every call is answered.

        Recording the same call twice has no effect, so adapters may overlap.

        A result read unmasked (`Result.masked` set) is kept as returned while its call is
        new to the request: nothing it could repeat is in sight. When the call recurs,
        the result is masked, and so is the earlier run's, found among `earlier`'s, so
        that the two compare as near-repeats (see How the guard decides: fresh values).
        """
        config = self.config
        index = self._awaiting_index(state, call.key)
        if index is None:
            return state, ()
        state = clone(state)
        decisions = self._admit(state) if index < 0 else ()
        if result.available_tools is not None and config.detect_unknown_tools:
            # The tool does not exist: from now on its calls are one call, whatever the args.
            if call.tool not in state.unknown:
                state.unknown = (*state.unknown, call.tool)
            state.available = result.available_tools
            call = Call(
                tool=call.tool, fingerprint=UNKNOWN_ARGS, args=call.args, id=call.id, key=call.key
            )
        elif call.tool in state.unknown:  # it exists after all (tools can be added)
            state.unknown = tuple(t for t in state.unknown if t != call.tool)
        outcome: Outcome | Answer
        if config.ignores(call.tool, is_error=result.is_error):
            outcome = IGNORED
        elif result.masked is None:
            outcome = Answer.of(result)
        else:
            outcome = _masked_if_recurring(state, call, result, earlier)
        _answer(state, index, call, outcome)
        if not _complete(state.batch):
            return state, decisions
        return state, (*decisions, *self._settle(state))

    def settle(self, state: RequestState) -> Transition:
        """Close the open batch now, counting only the calls that have results."""
        if not self.config.enabled or not state.batch:
            return state, ()
        state = clone(state)
        return state, self._settle(state)

    def resume(self, state: RequestState, call: Call, *, afresh: bool = False) -> Transition:
        """Let a stopped request go on, as a person decided (`exit_behavior="ask"`).

        `call`, not run because of the stop, may run after all: its tool run is no longer one
        saved, and is spent with its response when it settles. The request may stop
        again only once it reaches as many more blocks as `abort_threshold`, doubled for
        each earlier answer: a person who keeps letting it go on is asked less and less
        often. With `afresh`, the loop's evidence is set aside too (the streak, the
        cycles, the steered calls), so the guard steers, blocks and stops it again from
        the start: the limits are raised for this request.
        """
        if state.stopped is None:
            return state, ()
        state = clone(state)
        state.stopped, state.stop_tool = None, ""
        gap = self.config.abort_threshold * 2**state.resumed
        state.resumed, state.rearm = state.resumed + 1, state.blocks + gap
        if afresh:
            state.last, state.streak, state.warned, state.near = None, 0, False, False
            state.steered, state.runs, state.cycle_warned, state.steer = (), (), False, None
        entry = _latest_entry(state, call.key)
        if entry is None or entry.outcome not in (BLOCKED, NOT_RUN):
            return state, ()
        index = position(state.batch, call.key)
        if index < 0:  # a batch settled by its stop (`use_terminate`): the call opens one again
            state.settled = tuple(e for e in state.settled if e.call.key != call.key)
            state.batch, state.batch_explicit, index = (Entry(call),), True, 0
        _answer(state, index, call, ALLOWED)
        # The stop charged the response and saved the run: the run's settling charges
        # the response, its run and its tokens again, as for any loop step.
        undo = LoopCost(model_calls=-1, tokens=-state.batch_tokens, tool_runs_saved=-1)
        return state, (_charge(state, call, undo),)

    def repeated_text(
        self, state: RequestState, reply_id: str, repeats: int, tokens: int = 0
    ) -> Transition:
        """The reply `reply_id` was cut where it began repeating its own text, `repeats`
        times when it was cut (see Repeated text); `tokens` is what it cost. Telling
        the same reply again changes nothing.

        Steered like a tool loop: the first such reply of a request steers the model
        (a `Steer` due before its next call), each later one is a `Block` of the
        reply's rest, its message due the same way, and the blocks count toward the
        stop with the tools' own. The reply is charged as a loop's (`LoopCost`).
        """
        config = self.config
        if (
            not config.enabled
            or not config.detect_repeated_text
            or state.stopped is not None
            or reply_id in state.text_loops
        ):
            return state, ()
        state = clone(state)
        state.text_loops = (*state.text_loops, reply_id)
        call = make_call(REPLY, "", None, reply_id, f"{REPLY}#{reply_id}")
        spent = _charge(state, call, LoopCost(model_calls=1, tokens=tokens))
        replies = len(state.text_loops)
        if replies == 1:
            message = _messages.repeated_text_steer_text(repeats)
            steer = Steer(
                call=call, message=message, streak=repeats, reason="repeated_text", cost=state.cost
            )
            state.steer = steer
            return state, (spent, steer)
        state.blocks += 1
        message = _messages.repeated_text_block_text(replies)
        block = Block(
            call=call,
            message=message,
            streak=repeats,
            blocks=state.blocks,
            reason="repeated_text",
            cost=state.cost,
        )
        if state.blocks >= config.abort_threshold and state.blocks >= state.rearm:
            _stop_request(state, "abort_threshold", REPLY)
            return state, (spent, block, self._stop(state, call))
        # Its message reaches the model as a steer's does; its event is the block's.
        state.steer = Steer(call=call, message=message, streak=repeats, reason="repeated_text")
        return state, (spent, block)

    def judge_due(self, state: RequestState, every: int) -> bool:
        """Whether the judge is to be asked about the request now: `every` counted steps
        since it was last asked (or since the request began), and the recent steps
        brought little that is new: at most half of them returned a result not returned
        by another (calls that differ, answered alike: a search rephrased, an edit
        undone and redone). The rules judge identical calls; the judge, what they miss.
        """
        if not self.config.enabled or state.stopped is not None:
            return False
        if state.counted - state.judged_at < every:
            return False
        recent = state.recent
        if len(recent) < JUDGED_STEPS:
            return False
        # A result kept as returned (`EXACT`) is its masked one when nothing in it is fresh.
        return 2 * len({s.result.removeprefix(EXACT) for s in recent}) <= len(recent)

    def judged(
        self, state: RequestState, *, progress: bool, tokens: int = 0, reason: str = ""
    ) -> Transition:
        """The judge's verdict on the request (asked when `judge_due`): a `Judged`
        decision, and a `Steer` when it found no progress and no steer is due already.
        A verdict never blocks: the rules' backstops do."""
        if not self.config.enabled or state.stopped is not None:
            return state, ()
        state = clone(state)
        state.judged_at = state.counted
        call = make_call(JUDGE, "", None, f"{JUDGE}@{state.counted}", f"{JUDGE}@{state.counted}")
        judged = Judged(
            call=call, progress=progress, tokens=tokens, at=state.counted, reason=reason
        )
        if progress or state.steer is not None:
            return state, (judged,)
        calls = len(state.recent)
        message = _messages.judge_steer_text(calls)
        steer = Steer(call=call, message=message, streak=calls, reason="judge", cost=state.cost)
        state.steer = steer
        return state, (judged, steer)

    def kept_out(self, state: RequestState, chars: int, tokens: int = 0) -> Transition:
        """Compacting a model call's input kept `chars` characters (about `tokens`
        tokens) out of the model's context: charged to the request (`LoopCost`), under
        `CONTEXT`. Nothing kept out changes nothing."""
        if not self.config.enabled or chars <= 0:
            return state, ()
        state = clone(state)
        # Keyed by what the request kept out before: each call's charge is its own, the
        # same call run again (a retried turn) is the same charge.
        key = f"{CONTEXT}@{state.cost.chars_kept_out}"
        call = make_call(CONTEXT, "", None, key, key)
        kept = LoopCost(chars_kept_out=chars, tokens_kept_out=tokens)
        return state, (_charge(state, call, kept),)

    def asked_about(self, state: RequestState) -> str | None:
        """The key of the call a person is asked about when the request stopped: the
        last call its stopping batch blocked."""
        if state.stopped is None:
            return None
        for entries in (state.batch, state.settled):
            for entry in reversed(entries):
                if entry.outcome is BLOCKED:
                    return entry.call.key
            if entries:
                return None
        return None

    def checked(self, state: RequestState, keys: Sequence[str]) -> bool:
        """Whether every one of these calls (by `Call.key`) was checked already in this
        batch or the last."""
        for key in keys:
            entry = _latest_entry(state, key)
            if entry is None or entry.outcome is None:
                return False
        return True

    def awaits_result(self, state: RequestState, key: str) -> bool:
        """Whether recording a result for the call with this `Call.key` would count:
        it is not in the latest batches, or it is there still waiting for a result."""
        return self._awaiting_index(state, key) is not None

    def _awaiting_index(self, state: RequestState, key: str) -> int | None:
        """Where the call with this `Call.key` waits for its result in the open batch (-1:
        it is not in the latest batches); `None` when a result for it would not count."""
        if not self.config.enabled or position(state.settled, key) >= 0:
            return None
        index = position(state.batch, key)
        if index >= 0 and not state.batch[index].unanswered:
            return None
        return index

    def declared(self, state: RequestState, key: str) -> bool:
        """Whether the call with this `Call.key` belongs to the open batch or the last
        settled one: the state has seen its response."""
        return _latest_entry(state, key) is not None

    def take_steer(self, state: RequestState) -> tuple[RequestState, Steer | None]:
        """Take the pending steer for delivery; later takers get `None` (once per streak)."""
        steer = state.steer
        if steer is None:
            return state, None
        state = clone(state)
        state.steer = None
        return state, steer

    def stop_of(self, state: RequestState) -> Stop | None:
        """The `Stop` that ended this request, if it has ended."""
        if state.stopped is None:
            return None
        return self._stop(state, Call(tool=state.stop_tool, fingerprint=""))

    def _check_call(self, state: RequestState, call: Call, given: RequestState) -> Verdict:
        """`check_call`, changing `state` in place unless it is `given` (the caller's):
        a batch checked call by call makes one copy, not one per call."""
        config = self.config
        if not config.enabled:
            return state, Proceed(call=call), ()
        settled = position(state.settled, call.key)
        if settled >= 0:  # a sibling asking after its batch was settled
            block = state.settled[settled].block
            return state, Proceed(call=call) if block is None else block, ()
        index = position(state.batch, call.key)
        entry = None if index < 0 else state.batch[index]
        if state.stopped is not None:
            if entry is None:
                return state, self._stop(state, call), ()
            if entry.unanswered or entry.outcome is NOT_RUN:
                not_run = Block(
                    call=call,
                    message=_messages.not_run_text(),
                    streak=state.streak,
                    blocks=state.blocks,
                )
                if state is given:
                    state = clone(state)
                # Blocked once: a sibling asking again is no new saving.
                charged = (_charge(state, call, _PREVENTED),) if entry.unanswered else ()
                _answer(state, index, call, NOT_RUN, not_run)
                return state, not_run, charged
        if entry is not None and entry.outcome is not None:  # decided before
            return state, Proceed(call=call) if entry.block is None else entry.block, ()
        if state is given:
            state = clone(state)
        decisions = self._admit(state) if index < 0 else ()
        block = None if config.ignores(call.tool) else self._block_of(state, call)
        if block is None:
            proceed = Proceed(call=call)
            _answer(state, index, call, ALLOWED)
            return state, proceed, (*decisions, proceed)
        state.blocks = block.blocks
        _keep_blocked(state, self._identity(state, call), call)
        saved = _charge(state, call, _PREVENTED)
        block = replace(block, cost=state.cost)
        _answer(state, index, call, BLOCKED, block)
        if state.blocks >= config.abort_threshold and state.blocks >= state.rearm:
            _stop_request(state, "abort_threshold", call.tool)
            # The stopping response is never settled: its model call is charged now.
            spent = _pay(state, call, _response(state), intervened=True, repeat=True)
            return state, block, (*decisions, saved, block, *spent, self._stop(state, call))
        if _complete(state.batch):
            return state, block, (*decisions, saved, block, *self._settle(state))
        return state, block, (*decisions, saved, block)

    def _follow_errors(self, state: RequestState, ran: Sequence[Entry]) -> tuple[str, ...]:
        """Follow the errors the tools of a settled batch returned, in the model's order
        (see How the guard decides: same error, whatever the arguments); returns the tools found
        broken by this batch.

        A tool whose last `same_error_threshold` calls returned the identical error, for
        varied args, fails whatever its input: its calls are then one call, whatever
        their args, for as long as that error lasts (see `_identity`).
        """
        config = self.config
        failing = {record.tool: record for record in state.failing}
        steered = state.steered
        for entry in ran:
            tool, args = entry.call.tool, entry.call.fingerprint
            answer = entry.outcome
            if (
                not isinstance(answer, Answer)
                or args == UNKNOWN_ARGS
                or not config.detects_same_error(tool)
            ):
                continue
            outcome = answer.result
            record = failing.get(tool)
            weak = bool(answer.variant) or answer.reported or config.is_shell(tool)
            if not answer.is_error:  # it answered: judged by its args again
                if record is not None:
                    del failing[tool]
                    steered = tuple(e for e in steered if e.step[:2] != (tool, SAME_ERROR_ARGS))
            elif record is None or record.error != outcome:
                failing[tool] = Failing(tool, outcome, (args,), 1, weak)
            else:
                varied = len(record.args) >= _SAME_ERROR_VARIANTS or args in record.args
                failing[tool] = record._replace(
                    args=record.args if varied else (*record.args, args),
                    calls=record.calls + 1,
                    weak=record.weak or weak,
                )
        records = tuple(failing.values())[-_FAILING_KEPT:]
        if records == state.failing and steered is state.steered:
            return ()
        was_broken = {r.tool for r in state.failing if self._broken(r)}
        broken = tuple(r.tool for r in records if self._broken(r) and r.tool not in was_broken)
        state.failing, state.steered = records, steered
        return broken

    def _follow_changes(self, state: RequestState, ran: Sequence[Entry]) -> bool:
        """Note the calls of a settled batch that changed something and were not the
        same change re-applied; whether there was one.

        After a change, earlier runs of a check no longer count against its next run:
        the interleaved detector looks only from the batch on, and the backstop and the
        escalation of steered calls start again (a broken or missing tool's do not). The
        change itself stays in sight: the same change re-applied (a rejected edit
        submitted again, answered alike) is a repeat, not a new change.
        """
        changing = self._changing
        found = False
        for entry in ran:
            answer = entry.outcome
            # An error first: a made-up tool is never cached.
            if not isinstance(answer, Answer) or answer.is_error:
                continue
            tool = entry.call.tool
            changes = changing.get(tool)
            if changes is None:
                changes = self.config.changes_state(tool, self.hints.get(tool))
                changing[tool] = changes
            if not changes:
                continue
            step = self._step(state, entry.call, answer)
            if step in state.changes:
                continue
            state.changes = (*state.changes, step)[-_CHANGES_KEPT:]
            found = True
        if found:
            state.since_change, state.turns = 0, ()
            if state.steered:
                # A change made again and answered alike changed nothing: it stays steered,
                # as a missing or broken tool does.
                state.steered = tuple(
                    entry
                    for entry in state.steered
                    if entry.step.args in (SAME_ERROR_ARGS, UNKNOWN_ARGS)
                    or entry.step in state.changes
                )
        return found

    def _broken(self, record: Failing) -> bool:
        """Whether a tool's run of identical errors shows it failing whatever its args."""
        return (
            record.calls >= self.config.same_error_threshold
            and len(record.args) >= _SAME_ERROR_VARIANTS
        )

    def _identity(self, state: RequestState, call: Call, outcome: str | None = None) -> str:
        """The args fingerprint a call is judged by: one for all calls of a tool that
        does not exist, or that fails whatever its args (with that error, when the
        call's `outcome` is known), else its own."""
        if not state.failing and not state.unknown:
            return call.fingerprint
        if call.tool in state.unknown:
            return UNKNOWN_ARGS
        for record in state.failing:
            if record.tool == call.tool:
                same = outcome is None or outcome == record.error
                folded = same and not record.weak and self._broken(record)
                return SAME_ERROR_ARGS if folded else call.fingerprint
        return call.fingerprint

    def _admit(self, state: RequestState) -> tuple[Decision, ...]:
        """Make room for a call that is not in the batch (no response declared it): it
        joins an open undeclared batch, or starts a new one (a serial call) once the
        previous batch is settled. `_answer` then adds it to the batch."""
        if state.batch and (state.batch_explicit or _complete(state.batch)):
            return self._settle(state)
        return ()

    def _block_of(self, state: RequestState, call: Call) -> Block | None:
        """The block for a call about to run: the first of `BLOCKS` that fires; `None`
        lets it run."""
        args = self._identity(state, call)
        sight = Sight(self.config, state, call, args, self._cycle(state))
        for check in BLOCKS:
            block = check(sight)
            if block is not None:
                return block
        return None

    def _settle(self, state: RequestState) -> tuple[Decision, ...]:
        """Close the open batch of `state` (a private copy, changed in place): compare its
        last call in the model's order with the last step (see How the guard decides: batches)."""
        entries = state.batch
        if not entries:
            return ()
        config = self.config
        # Late siblings only need ids and outcomes: the args are not kept alive.
        state.settled = tuple([_without_args(entry) for entry in entries])
        state.batch, state.batch_explicit = (), False
        if state.stopped is not None:  # the request is over: nothing more to count
            return ()
        if (
            config.use_terminate
            and all(e.outcome is BLOCKED for e in entries)
            and state.blocks >= state.rearm
        ):
            _stop_request(state, "use_terminate", entries[-1].call.tool)
            last_call = entries[-1].call
            paid = _pay(state, last_call, _response(state, ()), intervened=True, repeat=True)
            return (*paid, self._stop(state, last_call))
        # The batch's last call in the model's order is compared; ignored calls and calls
        # without a result are invisible. A blocked last call changes nothing: a block
        # never resets the streak (see How the guard decides: block), even beside calls that ran.
        ran: list[Entry] = []
        counts_step = errors = changes = blocked = False
        changing = self._changing
        for entry in entries:
            outcome = entry.outcome
            if outcome is BLOCKED:
                counts_step = False
                blocked = True
            elif isinstance(outcome, Answer):
                counts_step = True
                ran.append(entry)
                errors = errors or outcome.is_error
                # A tool known not to change state needs no following.
                changes = changes or changing.get(entry.call.tool) is not False
        broken: tuple[str, ...] = ()
        # Only when some tool is failing: a healthy step costs one look at its outcome.
        if config.detect_same_error and (state.failing or errors):
            broken = self._follow_errors(state, ran)
        changed = changes and self._follows_changes and self._follow_changes(state, ran)
        siblings = ran[:-1] if counts_step else ran
        if siblings and config.escalate_ignored and state.steered:
            # Each run of a call the model was steered away from counts toward its
            # backstop, wherever it stands in its batch.
            for sibling in siblings:
                state.steered = _counted(state.steered, self._step_of(state, sibling))
        steer = None
        repeat = False
        if counts_step:
            last = ran[-1]
            answer = cast(Answer, last.outcome)  # `ran` holds answered entries only
            step = self._step(state, last.call, answer)
            returned = self._count(state, step, answer.variant)
            steer = self._steer(state, step, ran[-1].call, returned)
            repeat = (
                state.streak > 1
                or returned
                or (state.runs is not self._no_runs and any(state.runs))
                or (bool(state.steered) and any(entry.step == step for entry in state.steered))
            )
        if (siblings or state.beside) and self._follows_beside:
            counted = step if counts_step else None
            reached = self._follow_beside(state, entries, siblings, counted, changed)
            steer = side_by_side(config, state, reached, steer)
        if broken:
            steer = steer_broken(config, state, broken, ran, steer)
        intervened = blocked or steer is not None
        spent: tuple[Decision, ...] = ()
        if intervened or repeat or state.looping or state.unpaid is not NO_COST:
            response = _response(state, ran) if intervened or repeat else NO_COST
            spent = _pay(state, entries[-1].call, response, intervened=intervened, repeat=repeat)
        state.batch_tokens = 0
        if steer is None:
            return spent
        steer = state.steer = replace(steer, cost=state.cost)
        return (*spent, steer)

    def _follow_beside(
        self,
        state: RequestState,
        entries: Sequence[Entry],
        siblings: Sequence[Entry],
        counted: Step | None,
        changed: bool,
    ) -> list[tuple[Step, Call, int]]:
        """Count the batches in a row each call beside the counted one came back with the
        same result in (`state.beside`); the calls whose count reaches their steer
        threshold now, with it. A change in the batch is progress: every count starts again. A
        blocked call keeps its count, as a block never resets a streak."""
        if changed:
            state.beside = ()
            return []
        previous = dict(state.beside)
        beside: dict[Step, int] = {}
        calls: dict[Step, Call] = {}
        for entry in siblings:
            step = self._step_of(state, entry)
            # A missing or broken tool's calls are one call whatever their args: its own
            # detectors judge them.
            if step.args in (SAME_ERROR_ARGS, UNKNOWN_ARGS):
                continue
            if step != counted and step not in beside:
                beside[step] = previous.get(step, 0) + 1
                calls[step] = entry.call
        for entry in entries:
            if entry.outcome is BLOCKED:
                args = self._identity(state, entry.call)
                for step, batches in previous.items():
                    if step.tool == entry.call.tool and step.args == args:
                        beside.setdefault(step, batches)
        state.beside = tuple(beside.items())
        config = self.config
        return [
            (step, call, beside[step])
            for step, call in calls.items()
            if beside[step] == config.thresholds(step.tool).warn
        ]

    def _step(self, state: RequestState, call: Call, answer: Answer) -> Step:
        """The step a call that ran makes, as the detectors compare it."""
        return Step(call.tool, self._identity(state, call, answer.result), answer.result)

    def _step_of(self, state: RequestState, entry: Entry) -> Step:
        """The step of an answered entry."""
        return self._step(state, entry.call, cast(Answer, entry.outcome))

    def _count(self, state: RequestState, step: Step, variant: str) -> bool:
        """Advance the streak, the cycle runs and the recent steps by one counted step
        (whose result as returned is `variant`, when it was masked).

        Returns whether the step is a return to a call the model had been steered away
        from (its streak then resumes; see How the guard decides: returns after a steer).
        """
        returned = False
        escalate = self.config.escalate_ignored
        if step == state.last:
            state.streak += 1
            state.near = state.near or variant != state.variant
        else:
            state.last, state.streak, state.warned, state.near = step, 1, False, False
            steered = None
            for entry in state.steered:
                if entry.step == step:
                    steered = entry
                    break
            if escalate and steered is not None and steered.level:
                state.streak, state.warned = steered.level + 1, True
                returned = True
            elif steered is None and step.args == SAME_ERROR_ARGS:
                # The failing calls that showed the tool broken were one call: its
                # streak starts where a steer is due.
                state.streak = self.config.thresholds(step.tool).warn
        state.variant = variant
        if escalate and state.steered:
            state.steered = _counted(state.steered, step)
        recent = state.recent
        periods = self._periods
        # A run goes on while the step is the one a period back: when it is none of
        # them (the common case), every run is 0.
        if periods and step in recent[-periods[-1] : -1]:
            counted = state.counted
            runs = state.runs
            if len(runs) != len(periods):  # new request, or another max_cycle_period
                runs = self._no_runs
            state.runs = tuple(
                [
                    run + 1 if counted >= period and recent[-period] == step else 0
                    for period, run in zip(periods, runs, strict=True)
                ]
            )
        elif periods:
            state.runs = self._no_runs
        state.recent = (*recent, step)[-self.memory :]
        state.counted += 1
        if state.since_change >= 0:
            state.since_change += 1
        return returned

    def _steer(self, state: RequestState, step: Step, call: Call, returning: bool) -> Steer | None:
        """The steer a newly counted step calls for, if any: the first of `STEERS` that
        fires; each keeps its own record so it fires once."""
        config = self.config
        found = self._cycle(state)
        if state.cycle_warned and found is None:  # the cycle broke: a new one steers again
            state.cycle_warned = False
        warn = self._warns.get(step.tool, config.warn_threshold)
        sight = SteerSight(config, state, call, step.args, found, step, warn, returning)
        for check in STEERS:
            steer = check(sight)
            if steer is not None:
                state.steer = steer
                return steer
        return None

    def _cycle(self, state: RequestState) -> Cycle | None:
        """The cycle the last steps go round, as (one lap of steps, laps), if any.

        The shortest period whose lap has repeated at least once wins; a lap of one
        repeated step is a streak, not a cycle. A lap counts as gone round once its
        first three steps (all of a shorter lap) came round again: a long lap is as
        plain a loop by then as a short one, and counting it whole would let a cycle of
        six calls run 17 before its steer.
        """
        if state.runs == self._no_runs:  # no step is the one a period back: the common case
            return None
        recent = state.recent
        if not recent or recent.count(recent[-1]) == len(recent):  # a streak: laps of one step
            return None
        for period, run in zip(self._periods, state.runs, strict=False):
            if run >= period:
                steps = recent[-period:]
                if len(set(steps)) > 1:
                    return steps, (run + 2 * period - min(period, 3)) // period
        return None

    def _stop(self, state: RequestState, call: Call) -> Stop:
        reason = state.stopped or "abort_threshold"
        if state.stop_tool == REPLY:
            message = _messages.repeated_text_stop_text(len(state.text_loops))
        elif reason == "abort_threshold":
            message = _messages.stop_text(state.stop_tool, state.blocks)
        else:
            message = _messages.batch_stop_text(state.stop_tool)
        return Stop(
            call=call,
            message=message,
            streak=state.streak,
            blocks=state.blocks,
            reason=reason,
            cost=state.cost,
        )


def _complete(batch: tuple[Entry, ...]) -> bool:
    """Whether every call of the batch has its outcome: a result, or a block."""
    for entry in batch:
        outcome = entry.outcome
        if outcome is None or outcome is ALLOWED:
            return False
    return True


def _masked_if_recurring(
    state: RequestState, call: Call, result: Result, earlier: Earlier | None
) -> Answer:
    """The answer of a successful call whose result was read unmasked (`Result.masked`):
    as returned (`EXACT`) while the call is new to the request; masked once it recurs,
    and then its earlier unmasked runs in `state` (a private copy) are masked too, by
    their results as `earlier` finds them (or as this one, when returned alike)."""
    held = _results_held(state, call)
    if not held:
        return Answer(EXACT + result.fingerprint)
    masked = cast("Callable[[], Result]", result.masked)()
    unmasked = {found for found in held if found[:1] == EXACT}
    if unmasked:
        found = {EXACT + result.fingerprint: masked}
        if unmasked - found.keys() and earlier is not None:
            for run in earlier(call):
                exact = EXACT + run.fingerprint
                if exact in unmasked and exact not in found:
                    found[exact] = run if run.masked is None else run.masked()
                    if unmasked <= found.keys():
                        break
        for exact in unmasked & found.keys():
            _remask(state, call, exact, Answer.of(found[exact]))
    return Answer.of(masked)


def _results_held(state: RequestState, call: Call) -> set[str]:
    """The results the state holds for steps of this call's tool and args: wherever a
    detector compares a step with an earlier one, and the answered calls of the open
    batch."""
    tool, args = call.tool, call.fingerprint
    held = {
        entry.outcome.result
        for entry in state.batch
        if isinstance(entry.outcome, Answer)
        and entry.call.tool == tool
        and entry.call.fingerprint == args
    }
    for steps in (
        state.recent,
        [entry.step for entry in state.steered],
        state.changes,
        [step for step, _ in state.beside],
        *state.turns,
    ):
        held.update(step.result for step in steps if step.args == args and step.tool == tool)
    last = state.last
    if last is not None and last.args == args and last.tool == tool:
        held.add(last.result)
    return held


def _remask(state: RequestState, call: Call, exact: str, answer: Answer) -> None:
    """Put `answer`, a masked result, for the result `exact` (kept as returned) of this
    call's steps and answers in `state` (a private copy)."""
    tool, args = call.tool, call.fingerprint
    before, after = Step(tool, args, exact), Step(tool, args, answer.result)

    def remasked(steps: tuple[Step, ...]) -> tuple[Step, ...]:
        return (
            tuple(after if step == before else step for step in steps) if before in steps else steps
        )

    if state.last == before:
        state.last, state.variant = after, answer.variant
    state.recent = remasked(state.recent)
    state.changes = remasked(state.changes)
    if state.beside:
        state.beside = tuple(
            (after if step == before else step, batches) for step, batches in state.beside
        )
    state.turns = tuple(map(remasked, state.turns))
    state.steered = tuple(
        entry._replace(step=after) if entry.step == before else entry for entry in state.steered
    )
    state.batch = tuple(
        Entry(entry.call, answer, entry.block)
        if entry.outcome == Answer(exact)
        and entry.call.tool == tool
        and entry.call.fingerprint == args
        else entry
        for entry in state.batch
    )


def _latest_entry(state: RequestState, key: str) -> Entry | None:
    """The entry of the call with this `Call.key` in the open batch, else in the last
    settled one."""
    for entries in (state.batch, state.settled):
        index = position(entries, key)
        if index >= 0:
            return entries[index]
    return None


def _keep_blocked(state: RequestState, args: str, call: Call) -> None:
    """Once blocked, a call stays blocked when the model comes back to it after other
    calls (a send must not get through once): its backstop drops to its next run.
    Progress forgets it (`_counted`), as does a change."""
    state.steered = tuple(
        entry._replace(limit=entry.seen + 1)
        if entry.step.tool == call.tool and entry.step.args == args
        else entry
        for entry in state.steered
    )


def _turn_steps(state: RequestState) -> tuple[Step, ...]:
    """The distinct steps a finished request counted since its last new change."""
    return tuple(dict.fromkeys(window(state, len(state.recent))))


def _counted(steered: tuple[Steered, ...], step: Step) -> tuple[Steered, ...]:
    """`steered` after one more counted step: the same step counts toward its backstop;
    the same call with another result is progress, and its steer is forgotten."""
    kept = []
    for entry in steered:
        if entry.step == step:
            entry = entry._replace(seen=entry.seen + 1)
        elif entry.step.tool == step.tool and entry.step.args == step.args:
            continue
        kept.append(entry)
    return tuple(kept)


def _answer(
    state: RequestState,
    index: int,
    call: Call,
    outcome: Outcome | Answer,
    block: Block | None = None,
) -> None:
    """Set `call`'s outcome in the batch, at `index`; a call not in it (-1) joins it at
    the end."""
    batch = state.batch
    if index < 0:
        state.batch = (*batch, Entry(call, outcome, block))
    else:
        # The recorded call replaces the declared one: it carries the real args.
        kept = call if call.args is not None else batch[index].call
        state.batch = (*batch[:index], Entry(kept, outcome, block), *batch[index + 1 :])


def _without_args(entry: Entry) -> Entry:
    call = entry.call
    if call.args is None:
        return entry
    return Entry(
        make_call(call.tool, call.fingerprint, None, call.id, call.key), entry.outcome, entry.block
    )


_PREVENTED = LoopCost(tool_runs_saved=1)


def _charge(state: RequestState, call: Call, cost: LoopCost) -> Charge:
    """Add `cost` to what the request's loops cost."""
    state.cost = state.cost + cost
    return Charge(call=call, cost=cost)


def _response(state: RequestState, ran: Sequence[Entry] | None = None) -> LoopCost:
    """What the open batch's response cost: one model call, its tokens and the tool runs
    of `ran` (by default, the calls of the batch that have a result)."""
    if ran is None:
        ran = [entry for entry in state.batch if isinstance(entry.outcome, Answer)]
    return LoopCost(model_calls=1, tool_runs=len(ran), tokens=state.batch_tokens)


def _pay(
    state: RequestState, call: Call, response: LoopCost, *, intervened: bool, repeat: bool
) -> tuple[Charge, ...]:
    """Charge a settled response as `LoopCost` defines it: with the unpaid run of
    repeats before it when the guard steps in; as it comes in a loop stepped into; kept
    unpaid in a run of repeats the guard has not stepped into; a step that is no repeat
    ends the loop."""
    if intervened or (repeat and state.looping):
        spent = state.unpaid + response
        state.unpaid, state.looping = NO_COST, True
        return (_charge(state, call, spent),)
    if repeat:
        state.unpaid = state.unpaid + response
    else:
        state.unpaid, state.looping = NO_COST, False
    return ()


def _stop_request(state: RequestState, reason: StopReason, tool: str) -> None:
    # A stop drops any steer still queued: the model will not be called again.
    state.stopped, state.stop_tool, state.steer = reason, tool, None
