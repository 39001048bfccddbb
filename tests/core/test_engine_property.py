"""Random conversations checked against a tiny, obviously-correct model of How the guard decides
(the streak, graded intervention, batches)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loop_guard import Call, LoopGuard, LoopGuardConfig, Proceed, Result
from tests.support import examples

TOOLS = ["read", "ls", "todo"]


@dataclass
class Reference:
    """How the guard decides (the streak, graded intervention, batches), written as plainly
    as possible, independent of the engine."""

    warn: int
    block: int
    abort: int
    ignore_tools: set[str]
    ignore_errors: bool
    use_terminate: bool
    last: tuple[str, int, int, bool] | None = None
    streak: int = 0
    warned: bool = False
    blocks: int = 0
    stopped: str | None = None
    events: list[str] = field(default_factory=list)

    def run_batch(self, batch: list[tuple[str, int, int, bool]]) -> list[str]:
        verdicts = []
        if self.stopped:
            return ["Stop"] * len(batch)
        for tool, args, _, _ in batch:
            if self.stopped:  # answered as not run; not counted, no event
                verdicts.append("Block")
                continue
            repeat = self.last is not None and self.last[:2] == (tool, args)
            if tool not in self.ignore_tools and repeat and self.streak >= self.block - 1:
                self.blocks += 1
                verdicts.append("Block")
                self.events.append("block")
                if self.blocks >= self.abort:
                    self.stopped = "abort_threshold"
                    self.events.append("stop")
            else:
                verdicts.append("Proceed")
        if self.stopped:
            return verdicts
        visible = [
            (call, verdict)
            for call, verdict in zip(batch, verdicts, strict=True)
            if call[0] not in self.ignore_tools
            and not (verdict == "Proceed" and self.ignore_errors and call[3])
        ]
        if self.use_terminate and all(v == "Block" for v in verdicts):
            self.stopped = "use_terminate"
            self.events.append("stop")
        elif visible and visible[-1][1] == "Proceed":
            step = visible[-1][0]
            if step == self.last:
                self.streak += 1
            else:
                self.last, self.streak, self.warned = step, 1, False
            if self.streak >= self.warn and not self.warned:
                self.warned = True
                self.events.append("steer")
        return verdicts


calls = st.tuples(st.sampled_from(TOOLS), st.integers(0, 1), st.integers(0, 1), st.booleans())
conversations = st.lists(
    st.lists(calls, min_size=1, max_size=3) | st.lists(calls, min_size=1, max_size=1),
    min_size=1,
    max_size=40,
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    warn = draw(st.integers(1, 4))
    return {
        "warn_threshold": warn,
        "block_threshold": draw(st.integers(warn + 1, warn + 3)),
        "abort_threshold": draw(st.integers(1, 4)),
        "ignore_tools": draw(st.sets(st.sampled_from(TOOLS), max_size=1)),
        "ignore_errors": draw(st.booleans()),
        "use_terminate": draw(st.booleans()),
    }


@settings(max_examples=examples(600), deadline=None)
@given(configs(), conversations, st.randoms(use_true_random=False), st.booleans())
def test_engine_matches_the_reference_model(
    config: dict[str, Any], batches: list[list[tuple[str, int, int, bool]]], rng: Any, declare: bool
) -> None:
    """Zero divergences in verdicts, events and stop over random conversations."""
    events: list[str] = []
    guard = LoopGuard(LoopGuardConfig.pi(), on_event=lambda e: events.append(e.kind), **config)
    session = guard.session("t")
    session.start_request("r")
    reference = Reference(
        warn=config["warn_threshold"],
        block=config["block_threshold"],
        abort=config["abort_threshold"],
        ignore_tools=set(config["ignore_tools"]),
        ignore_errors=config["ignore_errors"],
        use_terminate=config["use_terminate"],
    )
    for index, batch in enumerate(batches):
        built = [
            Call.of(tool, {"n": args}, id=f"c{index}_{i}")
            for i, (tool, args, _, _) in enumerate(batch)
        ]
        if declare or len(batch) > 1:
            session.open_batch(built)
        verdicts = [session.check_call(call) for call in built]
        ran = [i for i, v in enumerate(verdicts) if isinstance(v, Proceed)]
        rng.shuffle(ran)  # results arrive in any completion order
        for i in ran:
            _, _, result, is_error = batch[i]
            session.record_result(built[i], Result.of(f"r{result}", is_error=is_error))
        expected = reference.run_batch(batch)
        assert [type(v).__name__ for v in verdicts] == expected, (index, batch)
        assert events == reference.events, (index, batch)
    stop = session.stop
    assert (stop.reason if stop else None) == reference.stopped


def _first_event(config: LoopGuardConfig, batches: list[list[tuple[str, int, int, bool]]]) -> int:
    """The index of the first batch with an event (len(batches) when none)."""
    events: list[str] = []
    guard = LoopGuard(config, on_event=lambda e: events.append(e.kind))
    session = guard.session("t")
    session.start_request("r")
    for index, batch in enumerate(batches):
        built = [Call.of(t, {"n": a}, id=f"c{index}_{i}") for i, (t, a, _, _) in enumerate(batch)]
        session.open_batch(built)
        for call, (_, _, result, is_error) in zip(built, batch, strict=True):
            if isinstance(session.check_call(call), Proceed):
                session.record_result(call, Result.of(f"r{result}", is_error=is_error))
        if events:
            return index
    return len(batches)


@settings(max_examples=examples(300), deadline=None)
@given(conversations)
def test_the_detectors_never_intervene_later_than_pi(
    batches: list[list[tuple[str, int, int, bool]]],
) -> None:
    """Every detector only adds interventions: the defaults step in no later than Pi."""
    assert _first_event(LoopGuardConfig(), batches) <= _first_event(LoopGuardConfig.pi(), batches)


@settings(max_examples=examples(300), deadline=None)
@given(conversations)
def test_results_that_always_change_are_never_touched(
    batches: list[list[tuple[str, int, int, bool]]],
) -> None:
    """Polling with progress: when every result is new, no detector steers or blocks."""
    fresh = [[(t, a, index * 10 + i, e) for i, (t, a, _, e) in enumerate(b)] for index, b in
             enumerate(batches)]  # fmt: skip
    assert _first_event(LoopGuardConfig(), fresh) == len(fresh)


@settings(max_examples=examples(300), deadline=None)
@given(conversations)
def test_every_state_is_restored_from_its_snapshot(
    batches: list[list[tuple[str, int, int, bool]]],
) -> None:
    """A snapshot, through JSON and with a fresh state's fields left out, restores exactly
    the state it was written from, after every transition, every detector on."""
    guard = LoopGuard(warn_threshold=2, block_threshold=3, abort_threshold=3)
    session = guard.session("t")
    session.start_request("r")

    def restored() -> object:
        """The state of the session's snapshot, through JSON, read back by the guard."""
        return guard.session("copy", json.loads(json.dumps(session.snapshot()))).state

    for index, batch in enumerate(batches):
        built = [Call.of(t, {"n": a}, id=f"c{index}_{i}") for i, (t, a, _, _) in enumerate(batch)]
        session.open_batch(built)
        assert restored() == session.state
        for call, (_, _, result, is_error) in zip(built, batch, strict=True):
            if isinstance(session.check_call(call), Proceed):
                assert restored() == session.state
                session.record_result(call, Result.of(f"r{result}", is_error=is_error))
            assert restored() == session.state
        session.finish()
        assert restored() == session.state
