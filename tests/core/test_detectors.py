"""The detectors beyond the Pi extension, on the engine directly.

See How the guard decides: beyond the Pi extension.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from loop_guard import (
    Call,
    LoopGuard,
    LoopGuardConfig,
    LoopGuardConfigWarning,
    Proceed,
    Result,
    ToolPolicy,
    _config,
)
from loop_guard._engine import Engine
from loop_guard._langchain import result_of
from loop_guard._state import RequestState
from loop_guard.normalize import normalize_fresh, normalize_volatile
from loop_guard.testing import GuardDriver

THREAD = "t"


class Agent(GuardDriver):
    """Serial calls through one guard (`GuardDriver`), built from a configuration."""

    def __init__(self, config: LoopGuardConfig | None = None, **overrides: Any) -> None:
        super().__init__(LoopGuard(config, **overrides), thread=THREAD)


# Cycles -----------------------------------------------------------------------------


@pytest.mark.parametrize("period", [2, 3, 4, 6])
def test_a_cycle_is_steered_at_three_laps_and_blocked_past_four(period: int) -> None:
    """A lap counts once its first three calls (all of a shorter lap) came round again:
    a lap of 2 or 3 calls is steered when the third lap is complete, a longer one three
    calls into it (a cycle of 6 at call 15, not 18)."""
    agent = Agent()
    verdicts = [agent.step("read", {"n": n % period}, f"r{n % period}") for n in range(6 * period)]
    into_lap = min(period, 3)
    assert agent.stamps[0] == (2 * period + into_lap, "steer", "cycle")
    assert agent.stamps[1] == (3 * period + into_lap + 1, "block", "cycle")
    assert verdicts[: 3 * period + into_lap] == ["Proceed"] * (3 * period + into_lap)
    assert agent.events[0].message.count("`read`") == 1  # "the same N `read` calls"


def test_a_cycle_longer_than_max_cycle_period_is_not_a_cycle() -> None:
    agent = Agent(max_cycle_period=3)
    for n in range(20):
        agent.step("read", {"n": n % 4}, "same")
    assert [kind for _, kind, _ in agent.stamps if kind != "steer"] == []


def test_a_cycle_whose_results_change_is_never_blocked() -> None:
    agent = Agent()
    for n in range(40):
        assert agent.step("poll", {"job": n % 2}, f"{n}% done") == "Proceed"
    assert agent.stamps == []


def test_the_same_red_test_after_each_different_edit_is_never_steered_nor_blocked() -> None:
    """Real edits, the same red test: each run after a new change asks a new question,
    so neither the interleaved detector nor the backstop ever steps in."""
    agent = Agent()
    for n in range(12):
        assert agent.step("edit", {"text": f"v{n}"}, "ok") == "Proceed"
        assert agent.step("pytest", {}, "FAILED test_a") == "Proceed"
    assert agent.stamps == []


def test_the_same_edit_re_applied_is_no_change() -> None:
    """An identical edit with an identical result changes nothing new: the check after
    it is the same question (here a cycle of two, steered and then refused)."""
    agent = Agent()
    verdicts = []
    for _ in range(6):
        verdicts.append(agent.step("edit", {"text": "v1"}, "ok"))
        verdicts.append(agent.step("pytest", {}, "FAILED test_a"))
    assert "Block" in verdicts
    assert ("steer", "cycle") in [(kind, reason) for _, kind, reason in agent.stamps]


def test_a_check_repeated_between_reads_is_steered_but_not_after_a_write() -> None:
    agent = Agent()
    for n in range(3):
        agent.step("read_file", {"path": f"f{n}"}, "text")
        agent.step("pytest", {}, "FAILED test_a")
    assert [(kind, reason) for _, kind, reason in agent.stamps] == [("steer", "interleaved")]
    changed = Agent()
    for n in range(3):
        changed.step("write_file", {"path": f"f{n}"}, "written")
        changed.step("pytest", {}, "FAILED test_a")
    assert changed.stamps == []


def test_a_failed_change_is_no_change() -> None:
    """An edit that failed, by status or by its text, changed nothing."""
    for failure in ("ERROR:\nParameter `old_str` is required", "Error: no match"):
        agent = Agent()
        for n in range(3):
            agent.step("edit", {"text": f"v{n}"}, failure)
            agent.step("pytest", {}, "FAILED test_a")
        assert ("steer", "interleaved") in [(k, r) for _, k, r in agent.stamps], failure


def test_a_tool_policy_or_annotation_decides_what_changes_state() -> None:
    config = LoopGuardConfig(tools={"deploy": ToolPolicy(changes_state=True)})
    agent = Agent(config=config)
    for n in range(3):
        agent.step("deploy", {"version": n}, "deployed")
        agent.step("probe", {}, "HTTP 500")
    assert agent.stamps == []
    annotated = Agent()
    annotated.guard._engine.learn({"apply_fix": False})  # readOnlyHint
    for n in range(3):
        annotated.step("apply_fix", {"n": n}, "ok")
        annotated.step("probe", {}, "HTTP 500")
    assert [(k, r) for _, k, r in annotated.stamps] == [("steer", "interleaved")]


def test_cycles_off_leaves_ping_pong_to_the_streak() -> None:
    agent = Agent(detect_cycles=False, detect_interleaved=False)
    for n in range(20):
        assert agent.step("read", {"n": n % 2}, "same") == "Proceed"
    assert agent.stamps == []


# Interleaved repeats and ignored steering ------------------------------------------------


def test_interleaved_repeat_is_steered_once_and_never_blocked() -> None:
    agent = Agent()
    for n in range(6):
        agent.step("read", {"path": "missing"}, "File not found", error=True)
        agent.step("grep", {"n": n}, f"hit {n}")
    assert agent.stamps == [(5, "steer", "interleaved")]


def test_interleaved_repeats_outside_the_window_are_not_counted() -> None:
    agent = Agent(repeat_window=4)
    for n in range(5):
        agent.step("read", {"path": "missing"}, "File not found", error=True)
        for k in range(3):
            agent.step("grep", {"n": n, "k": k}, "x")
    assert agent.stamps == []


def test_a_returned_call_is_steered_again_then_blocked_on_its_next_repeat() -> None:
    """Kimi P2's shape: three repeats, a diagnostic, then back to the same read."""
    agent = Agent()
    for _ in range(3):
        agent.step("read", {"path": "x"}, "File not found", error=True)
    agent.step("exec", {"cmd": "ls"}, "x.md")
    assert agent.step("read", {"path": "x"}, "File not found", error=True) == "Proceed"
    assert agent.step("read", {"path": "x"}, "File not found", error=True) == "Block"
    assert agent.stamps == [
        (3, "steer", "repeat"),
        (5, "steer", "returned"),
        (6, "block", "repeat"),
    ]
    assert "came back" in agent.events[1].message


def test_a_blocked_call_stays_blocked_when_the_model_comes_back_to_it() -> None:
    """Once blocked, a send never runs again in the request, whatever came between."""
    agent = Agent()
    verdicts = [agent.step("send", {"to": "ops"}, "sent") for _ in range(5)]
    agent.step("read", {"path": "a"}, "text")
    verdicts.append(agent.step("send", {"to": "ops"}, "sent"))
    assert verdicts == ["Proceed"] * 4 + ["Block", "Block"]
    assert agent.stamps[-1] == (7, "block", "returned")


def test_without_escalation_a_returned_call_starts_from_scratch() -> None:
    agent = Agent(escalate_ignored=False)
    for _ in range(3):
        agent.step("read", {"path": "x"}, "nf")
    agent.step("exec", {"cmd": "ls"}, "x.md")
    for _ in range(4):
        assert agent.step("read", {"path": "x"}, "nf") == "Proceed"
    assert [kind for _, kind, _ in agent.stamps] == ["steer", "steer"]


def test_a_new_request_resets_everything_but_the_recent_steps() -> None:
    """A rejected call coming back after the user's reply is still interleaved (tau-bench)."""
    agent = Agent()
    agent.step("book", {"flight": 1}, "Error: not available")
    agent.new_request("r2")
    agent.step("book", {"flight": 1}, "Error: not available")
    agent.step("search", {"q": 1}, "[]")
    agent.new_request("r3")
    agent.step("book", {"flight": 1}, "Error: not available")
    assert agent.stamps == [(4, "steer", "interleaved")]


@pytest.mark.parametrize(
    ("answer", "error"),
    [("Edit rejected: retry", False), ("old_string not found", True), ("a.py updated", False)],
    ids=["rejected", "error", "no-op"],
)
def test_the_same_edit_submitted_again_is_steered_by_its_third_lap(
    answer: str, error: bool
) -> None:
    """An edit answered alike each time (rejected, failed, or applied again) changed
    nothing after its first run: the read between the submissions asks nothing new."""
    agent = Agent()
    for lap in range(3):
        agent.step("Edit", {"file_path": "a.py", "old": "x", "new": "y"}, answer, error=error)
        agent.step("Read", {"file_path": "a.py", "offset": lap}, f"line {lap}")
    assert agent.stamps == [(5, "steer", "interleaved")]


def test_a_lookup_repeated_for_each_new_question_is_not_a_repeat() -> None:
    """Earlier turns count only for a turn that brings nothing new: the same message
    again, or the call already recurring within the turn."""
    new_questions, same_question, recurring = Agent(), Agent(), Agent()
    for turn in range(4):
        new_questions.new_request(f"r{turn}", f"question {turn}")
        new_questions.step("get_balance", {}, "42")
        new_questions.step("pay", {"bill": turn}, "paid")
        same_question.new_request(f"r{turn}", "balance?")
        same_question.step("get_balance", {}, "42")
        recurring.new_request(f"r{turn}", f"question {turn}")
        for bill in range(2):
            recurring.step("get_balance", {}, "42")
            recurring.step("get_bill", {"bill": bill}, "due")
    assert new_questions.stamps == []
    assert same_question.stamps == [(3, "steer", "interleaved"), (4, "steer", "interleaved")]
    assert recurring.stamps[0] == (11, "steer", "interleaved")  # the third turn's second run


def test_a_plain_run_across_a_user_message_starts_a_fresh_streak() -> None:
    """ "Keep checking": the user asked for the repeats, so only the streak judges them."""
    agent = Agent()
    for _ in range(4):
        agent.step("ls", {}, "")
    agent.new_request("r2")
    for _ in range(2):
        agent.step("ls", {}, "")
    assert agent.stamps == [(3, "steer", "repeat")]


# The backstop of every steer ---------------------------------------------------


def read_then_grep(agent: Agent, rounds: int) -> list[str]:
    """A failing read between distinct diagnostics, `rounds` times; the reads' verdicts."""
    verdicts = []
    for n in range(rounds):
        verdicts.append(agent.step("read", {"path": "ROADMAP.md"}, "ENOENT", error=True))
        agent.step("grep", {"q": f"roadmap-{n}"}, f"{n} hits")
    return verdicts


def test_an_interleaved_repeat_the_model_ignores_is_blocked_then_stopped() -> None:
    agent = Agent()
    verdicts = read_then_grep(agent, 20)
    assert verdicts[:9] == ["Proceed"] * 9  # steered at the 3rd read, the 10th is refused
    assert verdicts[9:12] == ["Block"] * 3
    assert agent.stamps == [
        (5, "steer", "interleaved"),
        (19, "block", "returned"),
        (21, "block", "returned"),
        (23, "block", "returned"),
        (23, "stop", "abort_threshold"),
    ]
    assert "10th time" in agent.events[1].message
    assert verdicts.count("Proceed") == 9


def test_the_backstop_threshold_is_configurable() -> None:
    agent = Agent(backstop_threshold=7)
    verdicts = read_then_grep(agent, 10)
    assert verdicts[:6] == ["Proceed"] * 6
    assert verdicts[6] == "Block"


def test_the_backstop_is_never_stricter_than_the_tools_block_threshold() -> None:
    agent = Agent(tools={"read": ToolPolicy(block_threshold=14)})
    verdicts = read_then_grep(agent, 20)
    assert verdicts[:13] == ["Proceed"] * 13
    assert verdicts[13] == "Block"


def test_a_streak_steer_ignored_between_other_calls_meets_the_backstop() -> None:
    """Steered at 3 in a row, then back to it after every diagnostic: the 10th is refused."""
    agent = Agent()
    for _ in range(3):
        agent.step("read", {"path": "x"}, "nf", error=True)
    verdicts: list[str] = []
    for n in range(12):
        agent.step("grep", {"q": n}, f"{n}")
        verdicts.append(agent.step("read", {"path": "x"}, "nf", error=True))
    assert verdicts[:6] == ["Proceed"] * 6
    assert verdicts[6:9] == ["Block"] * 3
    assert [kind for _, kind, _ in agent.stamps][-1] == "stop"


def test_a_steered_call_whose_result_changes_starts_its_count_again() -> None:
    """Progress (another result for the same call) is never held against it: 8 identical
    statuses, a different one, 8 more like the first: 16 of them, none refused."""
    agent = Agent()
    for n in range(17):
        status = "queued" if n == 8 else "running"
        assert agent.step("status", {"job": 1}, status) == "Proceed"
        agent.step("grep", {"q": n}, f"{n}")
    assert [kind for _, kind, _ in agent.stamps if kind != "steer"] == []
    assert [reason for _, _, reason in agent.stamps] == ["interleaved", "interleaved"]


def test_without_escalation_there_is_no_backstop() -> None:
    agent = Agent(escalate_ignored=False)
    assert read_then_grep(agent, 20) == ["Proceed"] * 20


def test_the_backstop_holds_for_siblings_in_one_batch() -> None:
    """The refused call is refused in a batch too, beside a sibling that runs."""
    agent = Agent()
    read_then_grep(agent, 9)
    read = Call.of("read", {"path": "ROADMAP.md"}, id="r")
    grep = Call.of("grep", {"q": "last"}, id="g")
    agent.session.open_batch([read, grep])
    assert type(agent.session.check_call(read)).__name__ == "Block"
    assert type(agent.session.check_call(grep)).__name__ == "Proceed"


def test_runs_of_a_steered_call_beside_other_calls_count_toward_its_backstop() -> None:
    """The steered read, made first in each parallel response beside a new grep, is a
    loop of its own once it came back alike in 3 responses in a row: steered again, its
    runs so far (6) count toward its block threshold, so its 7th run is refused."""
    agent = Agent()
    for _ in range(3):
        agent.step("read", {"path": "ROADMAP.md"}, "ENOENT", error=True)
    verdicts = [
        agent.batch(
            [("read", {"path": "ROADMAP.md"}, "ENOENT"), ("grep", {"q": n}, f"{n}")], errors=[True]
        )[0]
        for n in range(12)
    ]
    assert verdicts[:3] == ["Proceed"] * 3  # 6 reads in all
    assert verdicts[3:6] == ["Block"] * 3
    assert agent.stamps[-1][1] == "stop"


def test_calls_repeated_side_by_side_in_every_batch_are_each_refused_from_their_5th_run() -> None:
    """Two calls in every response, each answered alike every time: each is a loop of its
    own, steered together after 3 responses, each refused from its 5th run; the stop
    comes with the 3rd block. Pi mode keeps to the batch's last call (SPEC §4)."""
    for pi in (False, True):
        agent = Agent(LoopGuardConfig.pi() if pi else None)
        verdicts = [
            agent.batch([("read", {"path": "notes.md"}, "notes"), ("ls", {}, "a b")])
            for _ in range(8)
            if not agent.stamps or agent.stamps[-1][1] != "stop"
        ]
        reads = [verdict[0] for verdict in verdicts]
        assert reads.count("Block") == (0 if pi else len(reads) - 4)
        assert [verdict[1] for verdict in verdicts].count("Proceed") == 4
        steers = [stamp for stamp in agent.stamps if stamp[1] == "steer"]
        assert len(steers) == 1
        if not pi:
            assert "`read`" in agent.events[0].message
            assert "`ls`" in agent.events[0].message
        assert agent.stamps[-1][1] == "stop"


def test_a_cycle_of_a_tolerant_poll_keeps_the_polls_threshold_in_its_backstop() -> None:
    """A poll declared tolerant keeps its cycle from being cut short, backstop included."""
    agent = Agent(tools={"job_status": ToolPolicy(warn_threshold=10, block_threshold=30)})
    laps = 0
    for laps in range(1, 40):  # noqa: B007
        if agent.step("job_status", {"job": 1}, "running") == "Block":
            break
        agent.step("read_log", {"job": 1}, "building...")
    assert laps == 30
    assert next(reason for _, kind, reason in agent.stamps if kind == "block") == "cycle"


def test_the_backstop_counts_only_this_requests_runs() -> None:
    """A rejected booking carried over in the window: the backstop still allows 9 runs of
    this request."""
    agent = Agent()
    for n in range(3):
        agent.step("book", {"flight": 1}, "Error: not available", error=True)
        agent.step("search", {"q": n}, "[]")
    agent.new_request("r2")
    runs = 0
    for n in range(15):
        if agent.step("book", {"flight": 1}, "Error: not available", error=True) == "Block":
            break
        runs += 1
        agent.step("search", {"q": f"r2-{n}"}, "[]")
    assert runs == 9


# Same error, any args --------------------------------------------------------------

BROKEN = "'str' object has no attribute 'get'"


def test_a_tool_failing_the_same_way_for_any_args_is_steered_blocked_and_stopped() -> None:
    agent = Agent()
    queries = ["Machine Learning", "ML", "ML", "C1005", "ML", "Machine Learning", "C1005", "x"]
    verdicts = [agent.step("lookup", {"q": q}, BROKEN, error=True) for q in queries]
    assert verdicts == ["Proceed"] * 5 + ["Block"] * 3
    assert agent.stamps == [
        (4, "steer", "same_error"),
        (6, "block", "same_error"),
        (7, "block", "same_error"),
        (8, "block", "same_error"),
        (8, "stop", "abort_threshold"),
    ]
    assert "although you changed its arguments" in agent.events[0].message
    assert "whatever the arguments" in agent.events[1].message


def test_a_broken_tool_is_blocked_whatever_new_args_it_gets() -> None:
    """One more field per retry: steered at the 4th failure, the 6th call is refused."""
    agent = Agent()
    for n in range(5):
        agent.step("lookup", {"q": "ML", "fields": list(range(n))}, BROKEN, error=True)
    assert agent.step("lookup", {"q": "brand new"}, BROKEN, error=True) == "Block"
    assert agent.step("search", {"q": "ML"}, "found") == "Proceed"  # other tools run
    assert [(n, kind) for n, kind, _ in agent.stamps] == [(4, "steer"), (6, "block")]


def test_three_variants_failing_alike_are_ordinary_debugging() -> None:
    """A build tried three ways, the same error each time (a healthy recorded run)."""
    agent = Agent()
    for command in ("make", "make clean && make", "rm -rf build && make"):
        agent.step("run", {"command": command}, "cd: can't cd to build\nError 2", error=True)
    assert agent.stamps == []


def test_a_broken_tool_between_other_calls_still_meets_the_backstop() -> None:
    agent = Agent()
    verdicts = []
    for n in range(20):
        verdicts.append(agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True))
        agent.step("grep", {"q": n}, f"{n}")
    assert verdicts.index("Block") == 9  # the 10th failing lookup of the request
    assert agent.stamps[0] == (7, "steer", "same_error")
    assert {reason for _, kind, reason in agent.stamps if kind == "block"} == {"same_error"}
    assert agent.stamps[-1][1] == "stop"


def test_a_tool_that_works_again_is_judged_by_its_args_again() -> None:
    agent = Agent()
    for n in range(4):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True)
    agent.step("lookup", {"q": "ok"}, "found it")
    verdicts = [agent.step("lookup", {"q": f"r{n}"}, f"answer {n}") for n in range(10)]
    assert verdicts == ["Proceed"] * 10
    assert [(kind, reason) for _, kind, reason in agent.stamps] == [("steer", "same_error")]


def test_a_broken_tool_first_in_each_response_is_steered_and_bounded() -> None:
    agent = Agent()
    verdicts = [
        agent.batch(
            [("lookup", {"q": f"q{n}"}, BROKEN), ("grep", {"q": n}, f"{n}")], errors=[True]
        )[0]
        for n in range(20)
    ]
    assert agent.stamps[0] == (8, "steer", "same_error")  # the 4th failing lookup
    assert verdicts.index("Block") == 9
    assert agent.stamps[-1][1] == "stop"


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 1, 0]])
def test_a_broken_batch_is_judged_alike_whatever_order_its_results_arrive_in(
    order: list[int],
) -> None:
    agent = Agent()
    agent.batch(
        [("lookup", {"q": f"q{n}"}, BROKEN) for n in range(4)], errors=[True] * 4, order=order
    )
    assert [(e.kind, e.reason) for e in agent.events] == [("steer", "same_error")]


def test_a_tool_that_recovered_meets_its_next_outage_as_new() -> None:
    outages = []
    for before in (True, False):
        agent = Agent()
        if before:
            for n in range(4):
                agent.step("lookup", {"q": f"a{n}"}, BROKEN, error=True)
            for n in range(5):
                agent.step("lookup", {"q": f"b{n}"}, f"answer {n}")
            agent.stamps.clear()
        start = agent.calls
        verdicts = [agent.step("lookup", {"q": f"c{n}"}, BROKEN, error=True) for n in range(6)]
        outages.append((verdicts, [(n - start, k, r) for n, k, r in agent.stamps]))
    assert outages[0] == outages[1]
    assert outages[0][0] == ["Proceed"] * 5 + ["Block"]


def test_a_broken_tool_returned_to_is_told_any_args_will_be_blocked() -> None:
    agent = Agent()
    for n in range(4):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True)
    agent.step("grep", {"q": 1}, "1")
    agent.step("lookup", {"q": "AI"}, BROKEN, error=True)
    assert agent.stamps[-1] == (6, "steer", "same_error")
    assert "with any arguments" in agent.events[-1].message
    assert agent.step("lookup", {"q": "totally different"}, BROKEN, error=True) == "Block"


def test_several_broken_tools_are_followed_at_once() -> None:
    agent = Agent()
    for n in range(4):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True)
        agent.step("fetch", {"id": n}, "404 Not Found", error=True)
    assert [(n, reason) for n, _, reason in agent.stamps] == [(7, "same_error"), (8, "same_error")]


def test_a_per_tool_same_error_switch_from_the_environment() -> None:
    config = LoopGuardConfig.from_env(
        {"LOOP_GUARD_TOOLS": json.dumps({"exec": {"detect_same_error": False}})}
    )
    assert config.enabled
    assert config.detects_same_error("exec") is False
    assert config.detects_same_error("lookup") is True


@pytest.mark.parametrize(
    ("result", "error"),
    [("No results found.", False), ("File not found: {}", True)],
    ids=["same non-error result", "errors naming the input"],
)
def test_different_args_with_equal_non_errors_or_distinct_errors_never_trigger(
    result: str, error: bool
) -> None:
    agent = Agent()
    for n in range(10):
        assert agent.step("search", {"q": f"q{n}"}, result.format(n), error=error) == "Proceed"
    assert agent.stamps == []


def test_a_success_between_failures_means_the_tool_is_not_broken() -> None:
    agent = Agent()
    for n in range(10):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN if n % 2 else f"hit {n}", error=bool(n % 2))
    assert agent.stamps == []


@pytest.mark.parametrize(
    "options",
    [
        {"detect_same_error": False},
        {"tools": {"lookup": ToolPolicy(detect_same_error=False)}},
        {"tools": {"lookup": ToolPolicy(ignore_errors=True)}},
        {"ignore_errors": True},
    ],
    ids=["off", "off for the tool", "tool ignores errors", "errors ignored"],
)
def test_same_error_detection_can_be_turned_off(options: dict[str, Any]) -> None:
    agent = Agent(**options)
    for n in range(10):
        assert agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True) == "Proceed"
    assert [reason for _, _, reason in agent.stamps if reason == "same_error"] == []


def test_the_same_error_threshold_is_configurable() -> None:
    agent = Agent(same_error_threshold=6)
    for n in range(6):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True)
    assert agent.stamps == [(6, "steer", "same_error")]


def test_one_argument_set_failing_is_the_streaks_to_judge() -> None:
    agent = Agent()
    verdicts = [agent.step("lookup", {"q": 1}, BROKEN, error=True) for _ in range(6)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 2
    assert {reason for _, _, reason in agent.stamps} == {"repeat"}


def test_a_broken_tools_streak_follows_its_policy() -> None:
    """Detected at 4 failures, its streak starts at the tool's warn threshold."""
    agent = Agent(tools={"lookup": ToolPolicy(warn_threshold=5, block_threshold=8)})
    verdicts = [agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True) for n in range(8)]
    assert verdicts == ["Proceed"] * 6 + ["Block"] * 2
    assert agent.stamps[0] == (4, "steer", "same_error")


def test_siblings_failing_the_same_way_count_as_argument_sets() -> None:
    """Four lookups in one response, all failing alike: steered after the batch."""
    agent = Agent()
    calls = [Call.of("lookup", {"q": f"q{n}"}, id=f"c{n}") for n in range(4)]
    agent.session.open_batch(calls)
    for call in calls:
        agent.session.check_call(call)
        agent.session.record_result(call, Result.of(BROKEN, is_error=True))
    assert [(e.kind, e.reason) for e in agent.events] == [("steer", "same_error")]


def test_a_new_request_forgets_a_broken_tool() -> None:
    agent = Agent()
    for n in range(5):
        agent.step("lookup", {"q": f"q{n}"}, BROKEN, error=True)
    agent.new_request("r2")
    assert [agent.step("lookup", {"q": f"r{n}"}, BROKEN, error=True) for n in range(3)] == [
        "Proceed"
    ] * 3
    assert len(agent.stamps) == 1


# Unknown tools --------------------------------------------------------------------------


def test_calls_to_an_unknown_tool_count_as_one_call_whatever_the_args() -> None:
    agent = Agent()
    missing = Result.of("Error: exec is not a valid tool", is_error=True, available_tools=("read",))
    verdicts = [agent.step("exec", {"cmd": f"c{n}"}, missing) for n in range(7)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 3
    assert agent.stamps[0] == (3, "steer", "unknown_tool")
    assert "`read`" in agent.events[0].message
    assert [kind for _, kind, _ in agent.stamps] == ["steer", "block", "block", "block", "stop"]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_the_tool_node_error_for_an_unknown_tool_is_recognised() -> None:
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE

    text = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
        requested_tool="exec", available_tools="read, write"
    )
    message = ToolMessage(text, tool_call_id="1", name="exec", status="error")
    tools = ("read", "write")
    assert result_of(message, (), tools).available_tools == ("read", "write")
    success = message.model_copy(update={"status": "success"})
    assert result_of(success, (), tools).available_tools is None


def test_unknown_tool_detection_can_be_turned_off() -> None:
    """Same-error detection still sees a tool failing whatever its args; with both off,
    the calls run."""
    missing = Result.of("Error: no such tool", is_error=True, available_tools=("read",))
    agent = Agent(detect_unknown_tools=False)
    assert [agent.step("deploy", {"cmd": f"c{n}"}, missing) for n in range(6)][-1] == "Block"
    assert {reason for _, _, reason in agent.stamps} == {"same_error"}
    agent = Agent(detect_unknown_tools=False, detect_same_error=False)
    assert [agent.step("deploy", {"cmd": f"c{n}"}, missing) for n in range(7)] == ["Proceed"] * 7


# Volatile results -------------------------------------------------------------------------


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_volatile_fields_are_normalised_only_when_asked() -> None:
    def output(n: int) -> str:
        return f"run 3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d{n:04d} at 2026-11-30T01:0{n}:13Z took {n} ms"

    assert normalize_volatile(output(1)) == normalize_volatile(output(2))
    asked = ({"fresh_results": False}, []), ({"volatile_results": True}, ["steer", "block"])
    for options, expected in asked:
        agent = Agent(**options)
        config = agent.guard.config
        for n in range(5):
            result = result_of(output(n), config.normalizers("date"))
            agent.step("date", {}, result)
        assert [kind for _, kind, _ in agent.stamps] == expected


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_custom_normalizer_per_tool() -> None:
    config = LoopGuardConfig(tools={"exec": ToolPolicy(normalizer=lambda t: t.split("|")[0])})
    agent = Agent(config)
    for n in range(3):
        agent.step("exec", {}, result_of(f"same|cwd=/tmp/run-{n}", config.normalizers("exec")))
        agent.step("other", {}, result_of(f"same|{n}", config.normalizers("other")))
    assert config.normalizers("other") == (normalize_fresh,)
    assert [kind for _, kind, _ in agent.stamps] == []  # "other" changes, so no cycle
    assert len(config.normalizers("exec")) == 2


# Per-tool policy ------------------------------------------------------------------------------


def test_per_tool_thresholds_and_ignore_rules() -> None:
    config = LoopGuardConfig(
        tools={
            "poll": ToolPolicy(warn_threshold=10, block_threshold=20),
            "send": ToolPolicy(warn_threshold=1, block_threshold=2),
            "todo": ToolPolicy(ignore=True),
        }
    )
    agent = Agent(config)
    assert [agent.step("send", {"to": "a"}, "sent") for _ in range(2)] == ["Proceed", "Block"]
    agent = Agent(config)
    assert all(agent.step("poll", {}, "running") == "Proceed" for _ in range(19))
    assert agent.step("poll", {}, "running") == "Block"
    agent = Agent(config)
    assert all(agent.step("todo", {}, "same") == "Proceed" for _ in range(30))
    assert agent.stamps == []


def test_per_tool_policy_from_the_environment() -> None:
    environ = {"LOOP_GUARD_TOOLS": json.dumps({"poll": {"block_threshold": 30, "volatile": True}})}
    config = LoopGuardConfig.from_env(environ)
    assert config.thresholds("poll") == (3, 30)
    assert config.normalizers("poll") == (normalize_volatile, normalize_fresh)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LOOP_GUARD_TOOLS", "not json"),
        ("LOOP_GUARD_TOOLS", '{"poll": {"block_threshold": 0}}'),
        ("LOOP_GUARD_TOOLS", '{"poll": {"warn_threshold": 9}}'),
        ("LOOP_GUARD_TOOLS", '{"poll": {"colour": "red"}}'),
        ("LOOP_GUARD_TOOLS", '["poll"]'),
        ("LOOP_GUARD_MAX_CYCLE_PERIOD", "1"),
        ("LOOP_GUARD_REPEAT_WINDOW", "many"),
        ("LOOP_GUARD_DETECT_CYCLES", "maybe"),
        ("LOOP_GUARD_DETECT_SAME_ERROR", "sometimes"),
        ("LOOP_GUARD_BACKSTOP_THRESHOLD", "1"),
        ("LOOP_GUARD_SAME_ERROR_THRESHOLD", "four"),
        ("LOOP_GUARD_TOOLS", '{"poll": {"detect_same_error": "no"}}'),
    ],
)
def test_bad_detector_variables_keep_the_defaults_with_one_warning(
    variable: str, value: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_config, "_said", set())
    with (
        caplog.at_level(logging.WARNING, logger="loop_guard"),
        pytest.warns(LoopGuardConfigWarning, match=variable),
    ):
        config = LoopGuardConfig.from_env({variable: value})
    assert config == LoopGuardConfig()
    assert len(caplog.records) == 1
    assert variable in caplog.text


@pytest.mark.parametrize(
    "options",
    [
        {"max_cycle_period": 1},
        {"repeat_window": 0},
        {"detect_cycles": "yes"},
        {"tools": {"poll": ToolPolicy(warn_threshold=6)}},
        {"tools": {"poll": {"block_threshold": -1}}},
        {"tools": {"poll": "high"}},
        {"tools": ["poll"]},
        {"tools": {"poll": {"normalizer": "upper"}}},
        {"backstop_threshold": 1},
        {"backstop_threshold": 2.5},
        {"same_error_threshold": 2},
        {"detect_same_error": 1},
        {"tools": {"poll": {"detect_same_error": "yes"}}},
    ],
)
def test_bad_detector_arguments_raise_at_once(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        LoopGuard(**options)


def test_the_environment_turns_detectors_off() -> None:
    environ = {f"LOOP_GUARD_{name}": "off" for name in ("DETECT_CYCLES", "DETECT_INTERLEAVED",
               "ESCALATE_IGNORED", "DETECT_UNKNOWN_TOOLS", "DETECT_SAME_ERROR",
               "FRESH_RESULTS", "DETECT_REPEATED_TEXT")}  # fmt: skip
    assert LoopGuardConfig.from_env(environ) == LoopGuardConfig.pi()


# Checkpoints -----------------------------------------------------------------------------------


def test_detector_state_survives_a_checkpoint_round_trip() -> None:
    guard = LoopGuard()
    session = guard.session(THREAD, {})  # the caller keeps the state, as a checkpoint does
    session.start_request("r")
    for n in range(7):
        call = Call.of("read", {"n": n % 2})
        session.check_call(call)
        session.record_result(call, Result.of("same"))
    restored = guard.session(THREAD, json.loads(json.dumps(session.snapshot())))
    assert restored.state == session.state
    call = Call.of("read", {"n": 1})
    assert restored.check_call(call) == session.check_call(call)


def test_backstop_and_broken_tool_state_survive_a_checkpoint_round_trip() -> None:
    guard = LoopGuard()
    session = guard.session(THREAD, {})  # the caller keeps the state, as a checkpoint does
    session.start_request("r")
    steps = [("read", {"p": "x"}, "nf")] * 3 + [("grep", {"q": 1}, "1")]
    steps += [("lookup", {"q": n}, BROKEN) for n in range(4)]
    for tool, args, text in steps:
        call = Call.of(tool, args)
        session.check_call(call)
        session.record_result(call, Result.of(text, is_error=text != "1"))
    restored = guard.session(THREAD, json.loads(json.dumps(session.snapshot())))
    assert restored.state == session.state
    for call in (Call.of("lookup", {"q": "new"}), Call.of("read", {"p": "x"})):
        assert restored.check_call(call) == session.check_call(call)


@pytest.mark.internals(reason="drives the pure engine's transitions on states the test holds")
def test_a_snapshot_from_before_the_backstop_resumes() -> None:
    engine = Engine(LoopGuardConfig())
    state = RequestState(request_id="r")
    for _ in range(3):
        call = Call.of("read", {"p": "x"})
        state, _, _ = engine.check_call(state, call)
        state, _ = engine.record_result(state, call, Result.of("nf"))
    old = state.to_dict()
    del old["v"]  # older snapshots record no schema version
    old["steered"] = [row[:3] for row in old["steered"]]
    old.pop("failing", None)  # a snapshot from before same-error detection
    restored = RequestState.from_dict(json.loads(json.dumps(old)))
    assert restored.steered[0][:3] == state.steered[0][:3]
    assert restored.steered[0].seen == 3  # the streak it was steered at
    assert engine.check_call(restored, Call.of("read", {"p": "x"}))[1] == Proceed(
        call=Call.of("read", {"p": "x"})
    )


# Edges: a return to a repeat, other settings, tools that appear, odd variables --------------------


def test_returning_to_an_interleaved_repeat_never_leads_to_a_block() -> None:
    """An interleaved repeat's return resumes no streak: going back to it, even twice in
    a row, runs (only its backstop, far later, refuses it)."""
    agent = Agent()
    for n in range(4):
        agent.step("grep", {"pattern": f"p{n}"}, "no match")
        agent.step("pytest", {}, "FAILED test_a")
    assert agent.step("pytest", {}, "FAILED test_a") == "Proceed"
    assert [kind for _, kind, _ in agent.stamps] == ["steer"]


@pytest.mark.internals(reason="builds or edits engine states directly (older snapshot schemas)")
def test_a_snapshot_from_another_max_cycle_period_resumes() -> None:
    state = RequestState(request_id="r")
    wide = Engine(LoopGuardConfig(max_cycle_period=4))
    for n in range(5):
        call = Call.of("read", {"n": n})
        state, _, _ = wide.check_call(state, call)
        state, _ = wide.record_result(state, call, Result.of("x"))
    narrow = Engine(LoopGuardConfig(max_cycle_period=3))
    restored = RequestState.from_dict(json.loads(json.dumps(state.to_dict())))
    for n in range(8):
        call = Call.of("ls", {"n": n % 2})
        restored, verdict, _ = narrow.check_call(restored, call)
        restored, _ = narrow.record_result(restored, call, Result.of("y"))
    assert len(restored.runs) == 2
    assert isinstance(verdict, Proceed)


def test_a_tool_first_missing_then_present_is_judged_by_its_args_again() -> None:
    agent = Agent()
    missing = Result.of("Error: deploy is not a valid tool", is_error=True, available_tools=())
    agent.step("deploy", {"to": "prod"}, missing)
    verdicts = [agent.step("deploy", {"to": "prod"}, "deployed") for _ in range(6)]
    assert verdicts == ["Proceed"] * 4 + ["Block"] * 2


def test_a_deeply_nested_tools_variable_keeps_no_policies_instead_of_crashing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_config, "_said", set())
    with pytest.warns(LoopGuardConfigWarning, match="LOOP_GUARD_TOOLS"):
        config = LoopGuardConfig.from_env({"LOOP_GUARD_TOOLS": "[" * 100_000})
    assert config.enabled
    assert dict(config.tools) == {}
