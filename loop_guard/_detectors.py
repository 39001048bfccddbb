"""The detectors: each looks at a request's state for one kind of loop.

`DETECTORS` is the table of them, one `Detector` per kind of loop: the `Reason` its
steers and blocks give, the `LoopGuardConfig` setting that turns off what it does beyond
the Pi extension, and its checks. The engine's lists of checks (`STEERS`, `BLOCKS`), the
report's loop shapes (`SHAPES`) and the Pi preset (`PI_OFF`) are read off it, and a test
holds each kind to its message, its setting and its documentation.

A block check looks at a call about to run (`Sight`), a steer check at a newly counted
step (`SteerSight`). Each returns its decision, or `None` when the loop it knows
is not there; the engine tries them in the table's order, and the first that fires wins.
A check that fires records on the state (a private copy the engine hands it) what keeps
it from firing again for the same loop.

Steers, in order:

1. `streak`: the same step again, past the tool's steer threshold (a repeat, or the
   calls to a missing or broken tool, which are one call whatever their args).
2. `returned`: a return to a call the model was steered away from.
3. `cycle`: the last steps going round a lap of two or more calls.
4. `interleaved`: the same step among others, within the request or across turns.

The most specific evidence comes first: a streak is a cycle of one step and an
interleaved repeat with nothing between, and a step going round a cycle is the cycle's
to judge even before it has gone round often enough to steer.

Blocks, in order: `streak_block` (the streak past its block threshold),
`cycle_block` (a call going on with a cycle past its block threshold), then `backstop`
(a steered call returned to once too often, whichever check steered it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, final

from loop_guard import _messages
from loop_guard._config import LoopGuardConfig, Thresholds
from loop_guard._state import (
    ERROR,
    SAME_ERROR_ARGS,
    UNKNOWN_ARGS,
    Entry,
    RequestState,
    Steered,
    Step,
)
from loop_guard._values import Block, Call, Reason, Steer

_STEERED_KEPT = 32  # steered steps remembered per request, for ignored-steering escalation

Cycle = tuple[tuple[Step, ...], int]
"""A cycle the last steps go round: one lap of steps, and the laps gone round."""


# What a check sees is read-only (`Final`: mypy holds every field to it), not `frozen`: one
# is made for every call and every step, and a frozen dataclass takes four times the machine
# instructions to make (12k against 3k, counted by valgrind).


@dataclass(slots=True)
class Sight:
    """What a check sees: for a block check, a call about to run."""

    config: Final[LoopGuardConfig]
    state: Final[RequestState]  # a private copy: a check that fires records on it
    call: Final[Call]
    args: Final[str]  # the args fingerprint the call is judged by
    cycle: Final[Cycle | None]  # the cycle the last steps go round


@final
@dataclass(slots=True)
class SteerSight(Sight):
    """What a steer check sees: the step its call made, newly counted."""

    step: Final[Step]
    warn: Final[int]  # the tool's steer threshold
    returning: Final[bool]  # whether the step returns to a call the model was steered away from


SteerCheck = Callable[[SteerSight], Steer | None]
BlockCheck = Callable[[Sight], Block | None]


def streak(sight: SteerSight) -> Steer | None:
    """The same step repeated up to the tool's steer threshold, once per streak."""
    state, warn = sight.state, sight.warn
    # The plain threshold first: most steps are below it, and need no patience.
    if state.warned or state.streak < warn or state.streak < warn + patience(sight.config, state):
        return None
    step, call = sight.step, sight.call
    if step.args == UNKNOWN_ARGS:
        text = _messages.unknown_tool_steer_text(step.tool, state.available, state.streak)
        steer = Steer(call=call, message=text, streak=state.streak, reason="unknown_tool")
    elif step.args == SAME_ERROR_ARGS:
        text = _messages.same_error_steer_text(step.tool)
        steer = Steer(call=call, message=text, streak=state.streak, reason="same_error")
    else:
        text = _messages.repeat_steer_text(step.tool, state.streak, near=state.near)
        steer = Steer(call=call, message=text, streak=state.streak)
    seen = state.streak
    if step.args == SAME_ERROR_ARGS:  # its runs: the failing calls, whatever args
        seen = next((r.calls for r in state.failing if r.tool == step.tool), seen)
    state.steered = _remember(state.steered, step, state.streak, again=False, seen=seen)
    state.warned = True
    return steer


def returned(sight: SteerSight) -> Steer | None:
    """A return to a call the model was steered away from, steered once more."""
    if not sight.returning:
        return None
    state, step = sight.state, sight.step
    if any(e.step == step and e.again for e in state.steered):
        return None
    if step.args == SAME_ERROR_ARGS:
        text = _messages.same_error_returned_steer_text(step.tool)
        reason: Reason = "same_error"
    else:
        text, reason = _messages.returned_steer_text(step.tool, state.streak), "returned"
    state.steered = _remember(state.steered, step, state.streak, again=True)
    return Steer(call=sight.call, message=text, streak=state.streak, reason=reason)


def cycle(sight: SteerSight) -> Steer | None:
    """A cycle gone round its steer threshold of laps, once until it breaks."""
    found = sight.cycle
    if found is None or sight.state.cycle_warned:
        return None
    config, state = sight.config, sight.state
    steps, laps = found
    warn_laps, block_laps = cycle_thresholds(config, steps)
    if laps < warn_laps:
        return None
    for lap_step in steps:  # level 0: its cycle escalates it, not a return
        # The cycle's most lenient tool decides its backstop too.
        limit = max(config.backstop(lap_step.tool), block_laps)
        state.steered = _remember(state.steered, lap_step, 0, again=True, seen=laps, limit=limit)
    state.cycle_warned = True
    text = _messages.cycle_steer_text([s.tool for s in steps], laps)
    return Steer(call=sight.call, message=text, streak=laps, reason="cycle")


def interleaved(sight: SteerSight) -> Steer | None:
    """The same step among other steps, or in each of the last user turns, once."""
    # Within the request, only when other steps came between the occurrences (a plain
    # run of repeats is the streak's to judge); each of the last user turns that made
    # the same call counts once, whatever came between. Never while a poll in the
    # window shows progress; cycles escalate on their own.
    config = sight.config
    if sight.cycle is not None or not config.detect_interleaved:
        return None
    state, step, warn = sight.state, sight.step, sight.warn
    if not state.turns and state.recent.count(step) < warn:  # the common case: no window
        return None
    # A change made again and answered alike changed nothing: the changes made since its
    # first run make no new question of it (they do of a check).
    recent = window(state, config.repeat_window, whole=step in state.changes)
    count = recent.count(step)
    # Earlier turns count only when this one brings nothing new: the user's message
    # again, the call already recurring in this turn, or the same failure retried (a
    # new question may well need the same lookup once; it never needs the same error).
    again = bool(state.turns) and (state.asked_again or count > 1 or step.result.startswith(ERROR))
    turns = _turns_with(state.turns, step) + 1 if again else 0
    within = count >= warn and count > _trailing_run(recent)
    if (
        not (within or turns >= warn)
        or any(entry.step == step for entry in state.steered)
        or _progressing(recent)
    ):
        return None
    text = (
        _messages.interleaved_steer_text(step.tool, count, config.repeat_window)
        if within
        else _messages.across_turns_steer_text(step.tool, turns)
    )
    # Level 0: a return does not resume a streak; the backstop bounds it, counting the
    # runs of this request.
    state.steered = _remember(state.steered, step, 0, again=True, seen=count)
    return Steer(call=sight.call, message=text, streak=max(count, turns), reason="interleaved")


def side_by_side(
    config: LoopGuardConfig,
    state: RequestState,
    reached: Sequence[tuple[Step, Call, int]],
    counted: Steer | None,
) -> Steer | None:
    """Calls beside the counted one that came back with the same result in as many
    batches in a row as their steer threshold (`reached`, in the model's order, each with
    those batches): each is a loop of its own, blocked from its block threshold by the
    backstop (Pi mode keeps to the counted call). One steer names them all, with the
    counted call when its own streak steers in the same batch (`counted`); else
    `counted` stands."""
    if not reached:
        return counted
    for step, _, batches in reached:
        limit = config.thresholds(step.tool).block
        state.steered = _remember(
            state.steered, step, batches, again=False, seen=batches, limit=limit
        )
    tools = tuple(step.tool for step, _, _ in reached)
    if counted is not None:
        if counted.reason != "repeat":
            return counted  # a more specific loop of the counted call: it names that
        tools = (*tools, counted.call.tool)
    batches = max(batches for _, _, batches in reached)
    call = reached[-1][1] if counted is None else counted.call
    text = _messages.side_by_side_steer_text(tools, batches)
    return Steer(call=call, message=text, streak=batches)


def streak_block(sight: Sight) -> Block | None:
    """A call that would repeat the last step once too often (see How the guard decides: block)."""
    config, state, call, args = sight.config, sight.state, sight.call, sight.args
    last = state.last
    if (
        last is None
        or last.tool != call.tool
        or last.args != args
        or state.streak < config.thresholds(call.tool).block + patience(config, state) - 1
    ):
        return None
    if args == UNKNOWN_ARGS:
        text = _messages.unknown_tool_block_text(call.tool, state.available, state.streak + 1)
        return _block(state, call, text, "unknown_tool")
    if args == SAME_ERROR_ARGS:
        return _block(state, call, _messages.same_error_block_text(call.tool), "same_error")
    text = _messages.repeat_block_text(call.tool, state.streak, near=state.near)
    return _block(state, call, text, "repeat")


def cycle_block(sight: Sight) -> Block | None:
    """A call going on with a cycle past its block threshold of laps."""
    # Any call of the lap goes on with the cycle (skipping the blocked one does too); a
    # step outside it breaks the cycle, and the runs with it.
    if sight.cycle is None:
        return None
    call, args = sight.call, sight.args
    steps, laps = sight.cycle
    if laps >= cycle_thresholds(sight.config, steps).block - 1 and any(
        step.tool == call.tool and step.args == args for step in steps
    ):
        text = _messages.cycle_block_text(call.tool, [step.tool for step in steps], laps)
        return _block(sight.state, call, text, "cycle", streak=laps)
    return None


def backstop(sight: Sight) -> Block | None:
    """A call the model was steered away from, returned to once too often."""
    config = sight.config
    if not config.escalate_ignored:
        return None
    state, call, args = sight.state, sight.call, sight.args
    for entry in state.steered:
        step = entry.step
        if (
            step.tool == call.tool
            and step.args == args
            and entry.seen >= (entry.limit or config.backstop(call.tool)) - 1
        ):
            if args == SAME_ERROR_ARGS:
                text = _messages.same_error_block_text(call.tool)
                return _block(state, call, text, "same_error", streak=entry.seen)
            text = _messages.backstop_block_text(call.tool, entry.seen + 1)
            return _block(state, call, text, "returned", streak=entry.seen)
    return None


@final
@dataclass(frozen=True, slots=True)
class Detector:
    """One kind of loop the guard knows, and what finds it."""

    reason: Reason
    """The reason its steers and blocks give (`GuardEvent.reason`); its steer's text is
    `_messages.<reason>_steer_text`."""
    beyond_pi: str
    """The `LoopGuardConfig` setting, on by default, that turns off what it does beyond the
    Pi extension: all of it, but for the streak, the Pi extension's own rule, whose
    near-repeats it turns off. `""` for the judge, an option of the middleware, off unless
    given."""
    steer: SteerCheck | None = None
    """Its check of a newly counted step, if it has one of its own."""
    block: BlockCheck | None = None
    """Its check of a call about to run, if it has one of its own."""
    scanned: bool = True
    """Whether the offline scan finds it: a loop shape of the fleet report."""


DETECTORS: tuple[Detector, ...] = (
    # A repeat: also calls repeated beside the counted one (`side_by_side`).
    Detector("repeat", "fresh_results", streak, streak_block),
    Detector("returned", "escalate_ignored", returned),
    Detector("cycle", "detect_cycles", cycle, cycle_block),
    Detector("interleaved", "detect_interleaved", interleaved),
    # The checks above find these once a tool's calls are one call whatever the args;
    # `steer_broken` steers a tool a batch showed broken.
    Detector("unknown_tool", "detect_unknown_tools"),
    Detector("same_error", "detect_same_error"),
    # The engine's own transitions find these: `repeated_text` and `judged`.
    Detector("repeated_text", "detect_repeated_text"),
    Detector("judge", "", scanned=False),
)
"""The kinds of loop, in the order their checks are tried: the first that fires wins."""

STEERS: tuple[SteerCheck, ...] = tuple(d.steer for d in DETECTORS if d.steer is not None)
"""The steer checks, in the order they are tried."""

BLOCKS: tuple[BlockCheck, ...] = (
    *(d.block for d in DETECTORS if d.block is not None),
    backstop,  # `returned`'s, last: it blocks what any check steered
)
"""The block checks, in the order they are tried."""

SHAPES: tuple[Reason, ...] = tuple(d.reason for d in DETECTORS if d.scanned)
"""The loop shapes the fleet report counts."""

PI_OFF: Mapping[str, bool] = MappingProxyType(
    {d.beyond_pi: False for d in DETECTORS if d.beyond_pi}
)
"""The settings that make `LoopGuardConfig.pi()`: every detector beyond the Pi extension off."""


def steer_broken(
    config: LoopGuardConfig,
    state: RequestState,
    broken: tuple[str, ...],
    ran: Sequence[Entry],
    steer: Steer | None,
) -> Steer | None:
    """Steer away from tools a batch showed broken whose calls were not its counted step.

    The counted one was steered by its streak. Each is remembered as steered, so
    returning to it escalates and its backstop holds. A tool shown broken by weak
    evidence (`Failing.weak`) is steered here, once, and not remembered: it is never
    blocked. Returns the batch's steer.
    """
    steered = state.steered
    for record in state.failing:
        folded = Step(record.tool, SAME_ERROR_ARGS, record.error)
        if record.tool not in broken or any(e.step == folded for e in steered):
            continue
        warn = config.thresholds(record.tool).warn
        if not record.weak:  # weak evidence is steered once, never blocked
            steered = _remember(steered, folded, warn, again=False, seen=record.calls)
        if steer is None:  # one steer per batch: a later return is steered again
            call = next(e.call for e in reversed(ran) if e.call.tool == record.tool)
            text = _messages.same_error_steer_text(record.tool, record.weak)
            steer = Steer(call=call, message=text, streak=warn, reason="same_error")
    state.steered = steered
    if steer is not None and state.steer is None:
        state.steer = steer
    return steer


def patience(config: LoopGuardConfig, state: RequestState) -> int:
    """How much later than exact repeats the streak is steered and blocked: near-repeats
    are weaker evidence (what made them differ may have been news)."""
    return config.near_repeat_patience if state.near else 0


def cycle_thresholds(config: LoopGuardConfig, steps: tuple[Step, ...]) -> Thresholds:
    """The steer and block laps of a cycle: its most lenient tool's thresholds."""
    # A tool declared tolerant (a poll) keeps the cycle it is part of from being
    # stopped early.
    thresholds = [config.thresholds(step.tool) for step in steps]
    return Thresholds(max(t.warn for t in thresholds), max(t.block for t in thresholds))


def window(state: RequestState, size: int, *, whole: bool = False) -> tuple[Step, ...]:
    """The last `size` steps counted in this request since its last new change (or, with
    `whole`, whatever changes came between)."""
    limit = size if size < state.counted else state.counted  # not `min`: on every step
    if not whole and 0 <= state.since_change < limit:
        limit = state.since_change
    return state.recent[len(state.recent) - limit :] if limit else ()


def _block(
    state: RequestState,
    call: Call,
    message: str,
    reason: Reason,
    *,
    streak: int | None = None,
) -> Block:
    """A block, counted among the request's blocks; its `streak` is the cycle's laps
    for a cycle, the identical calls of the request for a backstop."""
    streak = state.streak if streak is None else streak
    return Block(call=call, message=message, streak=streak, blocks=state.blocks + 1, reason=reason)


def _turns_with(turns: tuple[tuple[Step, ...], ...], step: Step) -> int:
    """How many of the remembered earlier turns counted `step`."""
    return sum(step in turn for turn in turns)


def _trailing_run(steps: tuple[Step, ...]) -> int:
    """How many of the last steps are the same step as the very last."""
    run = 0
    for step in reversed(steps):
        if step != steps[-1]:
            break
        run += 1
    return run


def _progressing(steps: tuple[Step, ...]) -> bool:
    """Whether some call among these steps returned a changed result (a poll moving on)."""
    results: dict[tuple[str, str], str] = {}
    for step in steps:
        if results.setdefault((step.tool, step.args), step.result) != step.result:
            return True
    return False


def _remember(
    steered: tuple[Steered, ...],
    step: Step,
    level: int,
    *,
    again: bool,
    seen: int = 0,
    limit: int = 0,
) -> tuple[Steered, ...]:
    """`steered` with `step` steered at `level`; its run count and the most lenient
    backstop limit are kept (the latest few steps are kept)."""
    previous = next((entry for entry in steered if entry.step == step), None)
    if previous is not None:
        seen, limit = max(seen, previous.seen), max(limit, previous.limit)
    kept = tuple(entry for entry in steered if entry.step != step)
    return (*kept, Steered(step, level, again, seen, limit))[-_STEERED_KEPT:]
