"""What loops cost, by `LoopCost`'s definition: charged from a loop's first repeat once the
guard steps in, as it comes after that, never for repeats the guard leaves alone."""

from __future__ import annotations

from typing import Any

from loop_guard import Call, LoopCost, LoopGuard
from loop_guard._state import RequestState
from loop_guard.testing import GuardDriver


def step(driver: GuardDriver, tool: str, args: Any, result: str, tokens: int = 0) -> str:
    """One model response (it cost `tokens`) with one call, run unless blocked."""
    return driver.batch([(tool, args, result)], tokens=tokens, together=True)[0]


def test_repeats_the_guard_never_steps_into_cost_nothing() -> None:
    """A check re-run once with the same answer, then other work: healthy, uncharged."""
    driver = GuardDriver(LoopGuard())
    guard, session = driver.guard, driver.session
    for path in ["a", "a", "b", "c", "d", "d", "e"]:
        step(driver, "read", {"p": path}, f"text of {path}", tokens=50)
    assert guard.stats.steers == 0
    assert guard.stats.cost == LoopCost()
    assert session.state.cost == LoopCost()


def test_a_polled_result_that_changes_costs_nothing() -> None:
    driver = GuardDriver(LoopGuard())
    guard = driver.guard
    for n in range(12):
        step(driver, "job_status", {"job": "7"}, f"{n * 10}% done", tokens=20)
    assert guard.stats.cost == LoopCost()


def test_a_streak_is_charged_from_its_first_repeat_at_the_steer() -> None:
    """Steered at the 3rd identical step: its 2nd and 3rd are charged then, with their
    tokens; the 1st call was not a repeat."""
    events: list[Any] = []
    driver = GuardDriver(LoopGuard(on_event=events.append, warn_threshold=3))
    guard = driver.guard
    for tokens in (10, 20, 30):
        step(driver, "read", {"p": "a"}, "same", tokens)
    assert [e.kind for e in events] == ["steer"]
    assert events[0].cost == LoopCost(model_calls=2, tool_runs=2, tokens=50)
    step(driver, "read", {"p": "a"}, "same", 40)  # a repeat after the steer: as it comes
    assert guard.stats.cost == LoopCost(model_calls=3, tool_runs=3, tokens=90)


def test_a_loop_ends_with_the_first_step_that_is_no_repeat() -> None:
    driver = GuardDriver(LoopGuard(warn_threshold=3))
    guard, session = driver.guard, driver.session
    for _ in range(3):
        step(driver, "read", {"p": "a"}, "same", 10)
    charged = guard.stats.cost
    step(driver, "read", {"p": "b"}, "other", 10)  # the model changed course
    step(driver, "read", {"p": "b"}, "other", 10)  # a new run of repeats, unpaid
    assert guard.stats.cost == charged == LoopCost(model_calls=2, tool_runs=2, tokens=20)
    assert session.state.unpaid == LoopCost(model_calls=1, tool_runs=1, tokens=10)


def test_blocked_calls_are_saved_and_their_responses_spent() -> None:
    """Default thresholds: steer at 3, block from 5, abort at the 3rd block."""
    events: list[Any] = []
    driver = GuardDriver(LoopGuard(on_event=events.append))
    guard = driver.guard
    verdicts = [step(driver, "read", {"p": "a"}, "same", 100) for _ in range(7)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 3
    costs = [(e.kind, e.cost) for e in events]
    assert costs == [
        ("steer", LoopCost(2, 2, 200)),
        ("block", LoopCost(3, 3, 300, tool_runs_saved=1)),
        ("block", LoopCost(4, 3, 400, tool_runs_saved=2)),
        ("block", LoopCost(5, 3, 500, tool_runs_saved=3)),
        ("stop", LoopCost(6, 3, 600, tool_runs_saved=3)),
    ]
    assert guard.stats.cost == events[-1].cost
    assert guard.stats.by_tool["read"]["tool_runs_saved"] == 3


def test_siblings_of_a_stopped_batch_are_saved() -> None:
    """The stopping response's other calls never run: each is a tool run saved."""
    driver = GuardDriver(LoopGuard(warn_threshold=1, block_threshold=2, abort_threshold=1))
    guard, session = driver.guard, driver.session
    step(driver, "read", {"p": "a"}, "same")
    loop, other = Call.of("read", {"p": "a"}), Call.of("ls", {})
    verdicts = session.check_batch([other, loop], 7)
    assert [type(v).__name__ for v in verdicts] == ["Block", "Block"]
    assert session.stop is not None
    # The first run was charged at its steer (warn_threshold 1): a loop of one step.
    assert guard.stats.cost == LoopCost(model_calls=2, tool_runs=1, tokens=7, tool_runs_saved=2)


def test_a_cycle_is_charged_from_its_second_lap() -> None:
    events: list[Any] = []
    driver = GuardDriver(LoopGuard(on_event=events.append))
    laps = 0
    while not events:
        step(driver, "read", {"p": "a"}, "A", 1)
        step(driver, "read", {"p": "b"}, "B", 1)
        laps += 1
    assert events[0].reason == "cycle"
    # Every step after the first lap repeats the step one lap back.
    assert events[0].cost.model_calls == 2 * laps - 2
    assert events[0].cost.tokens == 2 * laps - 2


def test_the_cost_outlives_a_snapshot() -> None:
    driver = GuardDriver(LoopGuard(warn_threshold=3))
    session = driver.session
    for _ in range(4):
        step(driver, "read", {"p": "a"}, "same", 5)
    step(driver, "read", {"p": "b"}, "new", 5)
    step(driver, "read", {"p": "b"}, "new", 5)
    state = session.state
    restored = RequestState.from_dict(state.to_dict())
    assert (restored.cost, restored.unpaid, restored.looping, restored.batch_tokens) == (
        state.cost,
        state.unpaid,
        state.looping,
        state.batch_tokens,
    )
    assert restored.cost == LoopCost(3, 3, 15)
    assert RequestState.from_dict(RequestState().to_dict()).cost == LoopCost()


def test_a_new_request_starts_at_no_cost_and_the_stats_keep_the_total() -> None:
    driver = GuardDriver(LoopGuard(warn_threshold=2))
    guard, session = driver.guard, driver.session
    for request in ("r1", "r2"):
        session.start_request(request)
        for _ in range(2):
            step(driver, "read", {"p": request}, "same", 1)
        assert session.state.cost == LoopCost(1, 1, 1)
    assert guard.stats.cost == LoopCost(2, 2, 2)


def test_what_compaction_kept_out_is_charged_to_the_request_and_its_events() -> None:
    """Kept out of two model calls' contexts: the request's cost, the stats (under
    `(context)`), and the cost a later steer carries; nothing kept out is no charge."""
    events: list[Any] = []
    driver = GuardDriver(LoopGuard(on_event=events.append, warn_threshold=2))
    guard, session = driver.guard, driver.session
    session.kept_out(4_000, tokens=1_000)
    session.kept_out(0)
    session.kept_out(4_000, tokens=1_000)
    for _ in range(2):
        step(driver, "read", {"p": "a"}, "same")
    kept = LoopCost(chars_kept_out=8_000, tokens_kept_out=2_000)
    assert session.state.cost == kept + LoopCost(model_calls=1, tool_runs=1)
    assert events[-1].kind == "steer"
    assert (events[-1].cost.chars_kept_out, events[-1].cost.tokens_kept_out) == (8_000, 2_000)
    assert guard.stats.by_tool["(context)"]["chars_kept_out"] == 8_000
    assert guard.stats.cost.tokens_kept_out == 2_000
    session.start_request("r2")
    assert session.state.cost == LoopCost()


def test_what_compaction_kept_out_outlives_a_snapshot_older_snapshots_still_load() -> None:
    session = LoopGuard().session("t")
    session.kept_out(4_000, tokens=1_000)
    snapshot = session.state.to_dict()
    assert RequestState.from_dict(snapshot).cost == LoopCost(
        chars_kept_out=4_000, tokens_kept_out=1_000
    )
    # A snapshot of an earlier version: six counts.
    older = {**snapshot, "cost": [3, 3, 15, 1, 0, 0]}
    assert RequestState.from_dict(older).cost == LoopCost(3, 3, 15, 1)
    # A cost with nothing kept out is written as earlier versions read it.
    plain = RequestState(cost=LoopCost(3, 3, 15, 1, 2, 20)).to_dict()
    assert plain["cost"] == [3, 3, 15, 1, 2, 20]
