"""The Pi extension's behaviour suite, ported to the engine directly.

See How the guard decides: the streak, graded intervention, batches, reset and scope.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from loop_guard import Block, Call, GuardEvent, LoopGuard, LoopGuardConfig, Proceed, Result, Stop
from loop_guard.testing import GuardDriver

THREAD = "thread-1"


class Driver(GuardDriver):
    """`GuardDriver` with Pi's own semantics by default (`LoopGuardConfig.pi()`): the
    detectors beyond it have their own suite, `test_detectors.py`."""

    def __init__(self, config: LoopGuardConfig | None = None, **overrides: Any) -> None:
        config = LoopGuardConfig.pi() if config is None else config
        super().__init__(LoopGuard(config, **overrides), thread=THREAD, request="request-1")


def test_warning_fires_at_the_third_identical_step_once_per_streak() -> None:
    """The steer is due when the streak reaches 3 and is not repeated at 4."""
    d = Driver()
    for n in range(1, 5):
        d.step("read", {"path": "a"}, "same")
        assert d.kinds() == ([] if n < 3 else ["steer"])
    assert d.events[0].streak == 3
    assert d.events[0].message.startswith("LOOP GUARD")
    assert "`read`" in d.events[0].message


def test_pending_steer_is_claimed_exactly_once() -> None:
    """The steer message is handed out to the first adapter that asks, then never again."""
    d = Driver()
    for _ in range(3):
        d.step("read", {"path": "a"}, "same")
    steer = d.session.take_steer()
    assert steer is not None
    assert steer.streak == 3
    assert d.session.take_steer() is None


def test_four_identical_calls_run_and_the_fifth_is_blocked() -> None:
    """Block timing: with the defaults the 4th identical call runs and the 5th is blocked."""
    d = Driver()
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(5)]
    assert verdicts == ["Proceed"] * 4 + ["Block"]
    block = next(e for e in d.events if e.kind == "block")
    assert block.streak == 4
    assert block.blocks == 1
    assert "was not run" in block.message


def test_retrying_a_blocked_call_is_blocked_again_without_resetting() -> None:
    """A blocked call does not reset the streak; changing args does."""
    d = Driver(abort_threshold=10)
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(7)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 3
    assert d.step("read", {"path": "b"}, "same") == "Proceed"
    assert d.step("read", {"path": "a"}, "same") == "Proceed"


def test_polling_with_changing_results_is_never_warned_or_blocked() -> None:
    """Same args, different result each time: legitimate polling."""
    d = Driver()
    verdicts = [d.step("status", {"job": 1}, f"progress {n}%") for n in range(50)]
    assert set(verdicts) == {"Proceed"}
    assert d.events == []


def test_polling_that_stalls_counts_from_the_first_unchanged_result() -> None:
    """A changed result resets the streak to 1; identical results after it count again."""
    d = Driver()
    for result in ["10%", "20%", "20%", "20%"]:
        d.step("status", {"job": 1}, result)
    assert d.kinds() == ["steer"]
    assert d.events[0].streak == 3


def test_different_args_reset_the_streak_even_with_equal_results() -> None:
    """Calls with different args never count toward each other."""
    d = Driver()
    for n in range(20):
        assert d.step("read", {"path": f"file{n % 2}"}, "same content") == "Proceed"
    assert d.events == []


def test_abort_after_three_blocks_in_one_request() -> None:
    """The third block ends the request; every later call is refused with the stop."""
    d = Driver()
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(7)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 3
    assert d.kinds() == ["steer", "block", "block", "block", "stop"]
    stop = d.session.stop
    assert stop is not None
    assert stop.reason == "abort_threshold"
    assert stop.blocks == 3
    assert d.step("other", {}, "x") == "Stop"


def test_a_stop_drops_a_queued_steer() -> None:
    """Once the request has ended, no steer is delivered any more."""
    d = Driver(warn_threshold=4, block_threshold=5, abort_threshold=1)
    for _ in range(4):
        d.step("read", {"path": "a"}, "same")
    assert d.step("read", {"path": "a"}, "same") == "Block"
    assert d.session.stop is not None
    assert d.session.take_steer() is None


def test_everything_resets_at_a_new_request() -> None:
    """Streak, blocks and the stop are per request (see How the guard decides: reset and scope)."""
    d = Driver()
    for _ in range(7):
        d.step("read", {"path": "a"}, "same")
    assert d.session.stop is not None
    d.session.start_request("request-2")
    d.events.clear()
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(5)]
    assert verdicts == ["Proceed"] * 4 + ["Block"]
    assert d.kinds() == ["steer", "block"]


def test_announcing_the_current_request_again_does_not_reset() -> None:
    """`start_request` is idempotent: several adapters may announce the same request."""
    d = Driver()
    for _ in range(4):
        d.step("read", {"path": "a"}, "same")
    d.session.start_request("request-1")
    assert d.step("read", {"path": "a"}, "same") == "Block"


def test_ignore_errors_makes_error_results_invisible() -> None:
    """With ignore_errors, error retries neither count nor reset a streak."""
    d = Driver(ignore_errors=True)
    for _ in range(10):
        assert d.step("read", {"path": "a"}, "File not found", error=True) == "Proceed"
    assert d.events == []
    d.step("read", {"path": "b"}, "ok")
    d.step("read", {"path": "b"}, "ok")
    d.step("read", {"path": "x"}, "boom", error=True)  # invisible
    d.step("read", {"path": "b"}, "ok")
    assert d.kinds() == ["steer"]


def test_error_results_count_by_default() -> None:
    """Without ignore_errors a repeated identical failure is a loop like any other."""
    d = Driver()
    verdicts = [d.step("read", {"path": "a"}, "not found", error=True) for _ in range(5)]
    assert verdicts[-1] == "Block"


def test_error_flag_is_part_of_the_result() -> None:
    """The same text, once as an error and once not, is a different result."""
    d = Driver()
    d.step("read", {"path": "a"}, "x")
    d.step("read", {"path": "a"}, "x", error=True)
    d.step("read", {"path": "a"}, "x")
    assert d.events == []


def test_ignored_tools_are_never_counted_blocked_or_resetting() -> None:
    """Ignored tools are invisible: they do not even break another tool's streak."""
    d = Driver(ignore_tools={"todo"})
    for _ in range(10):
        assert d.step("todo", {"x": 1}, "same") == "Proceed"
    d.step("read", {"path": "a"}, "same")
    d.step("todo", {"x": 1}, "same")
    d.step("read", {"path": "a"}, "same")
    d.step("todo", {"x": 1}, "same")
    d.step("read", {"path": "a"}, "same")
    assert d.kinds() == ["steer"]


def test_siblings_in_one_batch_do_not_count_against_each_other() -> None:
    """Five identical calls in one response are one step (see How the guard decides: batches)."""
    d = Driver()
    assert d.batch([("read", {"path": "a"}, "same")] * 5) == ["Proceed"] * 5
    assert d.events == []
    assert d.batch([("read", {"path": "a"}, "same")] * 5) == ["Proceed"] * 5
    assert d.events == []


def test_only_the_last_call_of_a_batch_in_model_order_is_compared() -> None:
    """The batch's last call (model order, not completion order) becomes the last step."""
    d = Driver()
    d.step("read", {"path": "a"}, "A")
    d.step("read", {"path": "a"}, "A")
    # The last call of this batch is the repeat: streak 3.
    d.batch([("ls", {}, "files"), ("read", {"path": "a"}, "A")])
    assert d.kinds() == ["steer"]
    # Now the repeat comes first and ls last: the streak resets to ls.
    d.batch([("read", {"path": "a"}, "A"), ("ls", {}, "files")])
    assert d.step("read", {"path": "a"}, "A") == "Proceed"


def test_results_arriving_out_of_order_settle_by_model_order() -> None:
    """Completion order does not matter: the model's order picks the compared call."""
    guard = LoopGuard()
    session = guard.session(THREAD)
    session.start_request("r")
    events: list[str] = []
    guard.on_event = lambda e: events.append(e.kind)
    for n in range(3):
        a = Call.of("read", {"path": "a"}, id=f"a{n}")
        b = Call.of("ls", {}, id=f"b{n}")
        session.open_batch([b, a])
        for call in (b, a):
            assert isinstance(session.check_call(call), Proceed)
        session.record_result(a, Result.of("A"))  # finishes first
        session.record_result(b, Result.of("files"))
    assert events == ["steer"]


def test_each_sibling_is_checked_against_the_last_counted_step() -> None:
    """Identical siblings are all blocked once the streak has reached the block point."""
    d = Driver(abort_threshold=10)
    for _ in range(4):
        d.step("read", {"path": "a"}, "same")
    verdicts = d.batch([("read", {"path": "a"}, "same")] * 3 + [("ls", {}, "x")])
    assert verdicts == ["Block", "Block", "Block", "Proceed"]


def test_racing_identical_calls_cannot_both_slip_past_a_block() -> None:
    """Decisions are atomic: 16 threads checking the blocked call all get a block."""
    guard = LoopGuard(abort_threshold=100)
    session = guard.session(THREAD)
    session.start_request("r")
    for _ in range(4):
        call = Call.of("read", {"path": "a"})
        session.check_call(call)
        session.record_result(call, Result.of("same"))
    barrier = threading.Barrier(16)
    verdicts: list[object] = []

    def race() -> None:
        call = Call.of("read", {"path": "a"})
        barrier.wait()
        verdicts.append(session.check_call(call))

    threads = [threading.Thread(target=race) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(verdicts) == 16
    assert all(isinstance(v, Block) for v in verdicts)
    assert max(v.blocks for v in verdicts if isinstance(v, Block)) == 16


def test_use_terminate_ends_the_request_on_a_fully_blocked_batch() -> None:
    """With use_terminate, the first block of a serial call ends the request."""
    d = Driver(use_terminate=True)
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(5)]
    assert verdicts[-1] == "Block"
    stop = d.session.stop
    assert stop is not None
    assert stop.reason == "use_terminate"
    assert d.kinds() == ["steer", "block", "stop"]


def test_use_terminate_lets_a_mixed_batch_continue() -> None:
    """Pi's rule: a batch with a blocked call and a call that ran does not terminate."""
    d = Driver(use_terminate=True)
    for _ in range(4):
        d.step("read", {"path": "a"}, "same")
    assert d.batch([("read", {"path": "a"}, "same"), ("ls", {}, "x")]) == ["Block", "Proceed"]
    assert d.session.stop is None
    assert d.batch([("read", {"path": "b"}, "same")] * 2) == ["Proceed", "Proceed"]


def test_calls_after_an_abort_in_the_same_batch_are_answered_not_run() -> None:
    """Siblings checked after the stopping block are refused with a not-run message."""
    d = Driver(abort_threshold=1)
    for _ in range(4):
        d.step("read", {"path": "a"}, "same")
    calls = [Call.of("read", {"path": "a"}, id="r"), Call.of("ls", {}, id="l")]
    d.session.open_batch(calls)
    verdicts = [d.session.check_call(call) for call in calls]
    assert [type(v).__name__ for v in verdicts] == ["Block", "Block"]
    assert isinstance(verdicts[1], Block)
    assert "not run" in verdicts[1].message
    assert verdicts[1].blocks == 1  # not counted as a block
    assert d.kinds() == ["steer", "block", "stop"]


def test_disabled_guard_never_intervenes() -> None:
    """enabled=False: every call proceeds and nothing is emitted."""
    d = Driver(enabled=False)
    assert {d.step("read", {"path": "a"}, "same") for _ in range(20)} == {"Proceed"}
    assert d.events == []


def test_conversations_are_isolated() -> None:
    """Two conversations on one guard never see each other's streaks."""
    guard = LoopGuard()
    for n in range(4):
        for thread in ("t1", "t2"):
            call = Call.of("read", {"path": "a"})
            assert isinstance(guard.session(thread).check_call(call), Proceed), (n, thread)
            guard.session(thread).record_result(call, Result.of(f"{thread}-same"))
    assert isinstance(guard.session("t1").check_call(Call.of("read", {"path": "a"})), Block)
    assert isinstance(guard.session("t3").check_call(Call.of("read", {"path": "a"})), Proceed)


def test_recording_a_result_twice_counts_once() -> None:
    """Overlapping adapters (handler + wrapper) never double-count a step."""
    guard = LoopGuard()
    session = guard.session(THREAD)
    for _ in range(4):
        call = Call.of("read", {"path": "a"})
        session.check_call(call)
        for _ in range(3):
            session.record_result(call, Result.of("same"))
        session.open_batch([call])  # re-declaring a settled call is a no-op too
    assert isinstance(session.check_call(Call.of("read", {"path": "a"})), Block)


@pytest.mark.memory
def test_conversations_beyond_the_limit_are_forgotten() -> None:
    """Memory stays bounded: the least recently used conversation is evicted."""
    guard = LoopGuard(max_conversations=2)
    for thread in ("t1", "t2", "t3"):
        guard.session(thread).start_request("r")
    assert list(guard._conversations.states) == ["t2", "t3"]
    guard.session("t2").end_request()
    assert list(guard._conversations.states) == ["t3"]


def test_a_failing_on_event_callback_never_reaches_the_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception from on_event is logged and swallowed."""

    def broken(event: GuardEvent) -> None:
        raise RuntimeError("callback bug")

    guard = LoopGuard(on_event=broken, warn_threshold=1, block_threshold=2)
    call = Call.of("x", {})
    guard.session(THREAD).check_call(call)
    guard.session(THREAD).record_result(call, Result.of("r"))
    assert "event receiver" in caplog.text
    assert "callback bug" in caplog.text


def test_every_event_is_logged_on_the_loop_guard_logger(caplog: pytest.LogCaptureFixture) -> None:
    """Warn, block and abort each produce a record carrying the event."""
    caplog.set_level("INFO", logger="loop_guard")
    d = Driver()
    for _ in range(7):
        d.step("read", {"path": "a"}, "same")
    kinds = [r.loop_guard_event.kind for r in caplog.records if hasattr(r, "loop_guard_event")]
    assert kinds == d.kinds()


@pytest.mark.parametrize(
    ("warn", "block", "abort"),
    [(1, 2, 1), (2, 3, 2), (3, 5, 3), (4, 8, 5)],
)
def test_thresholds_are_respected(warn: int, block: int, abort: int) -> None:
    """The steer comes at `warn`, the first block at call `block`, the stop at `abort` blocks."""
    d = Driver(warn_threshold=warn, block_threshold=block, abort_threshold=abort)
    verdicts = [d.step("read", {"path": "a"}, "same") for _ in range(block + abort + 2)]
    assert verdicts[: block - 1] == ["Proceed"] * (block - 1)
    assert verdicts[block - 1 : block - 1 + abort] == ["Block"] * abort
    assert set(verdicts[block - 1 + abort :]) == {"Stop"}
    assert d.events[0].kind == "steer"
    assert d.events[0].streak == warn
    stop = d.session.stop
    assert isinstance(stop, Stop)
    assert stop.blocks == abort


def test_a_snapshot_keeps_its_cycle_runs_when_cycles_are_not_detected() -> None:
    """A guard without cycle detection leaves the cycle runs of a snapshot alone (one
    written while it was on), so turning it back on finds them as they were."""
    guard = LoopGuard(detect_cycles=False)
    session = guard.session("c", {"request_id": "r", "runs": [1, 0, 0], "counted": 3})
    call = Call.of("read", {}, key="k1")
    session.check_call(call)
    session.record_result(call, Result.of("x"))
    assert session.snapshot()["runs"] == [1, 0, 0]


@pytest.mark.memory
def test_the_deprecated_guard_methods_warn_and_still_work() -> None:
    """Each old way in names the session method to call instead, and does what it did."""
    guard = LoopGuard(warn_threshold=2, block_threshold=3)
    call = Call.of("ls", {}, id="c")
    steps: list[tuple[str, Any]] = [
        ("start_request", lambda: guard.start_request("t", "r")),
        ("open_batch", lambda: guard.open_batch("t", [call])),
        ("check_call", lambda: guard.check_call("t", call)),
        ("record_result", lambda: guard.record_result("t", call, Result.of("x"))),
        ("settle", lambda: guard.settle("t")),
        ("check_batch", lambda: guard.check_batch("t", [Call.of("ls", {}, id="d")])),
        ("take_steer", lambda: guard.take_steer("t")),
        ("stop_of", lambda: guard.stop_of("t")),
    ]
    for name, step in steps:
        with pytest.warns(DeprecationWarning, match=rf"LoopGuard\.{name} .*guard\.session\("):
            step()
    session = guard.session("t")
    assert session.state.request_id == "r"
    assert session.state.counted == 1  # the one settled batch
    with pytest.warns(DeprecationWarning, match=r"LoopGuard\.end_request"):
        guard.end_request("t")
    assert "t" not in guard._conversations.states
    with pytest.warns(DeprecationWarning, match=r"LoopGuard\.detached .*\{\} for no snapshot"):
        detached = guard.detached("t", None)
    detached.start_request("r2")
    assert detached.snapshot()["request_id"] == "r2"
    assert "t" not in guard._conversations.states  # the caller keeps that state
