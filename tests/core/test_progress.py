"""What counts as progress: a change between two runs of a check, a result that differs
only in fresh values, an error that quotes its input, a shell's exit status.

Through the guard's core with `result_of`, the adapters' reading of a tool message; the
catalogue (`evals/catalogue.py`) drives the same shapes through every face."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from loop_guard import Call, LoopGuard, LoopGuardConfig, ToolPolicy
from loop_guard._langchain import result_of
from loop_guard.testing import GuardDriver

THREAD = "t"


class Agent(GuardDriver):
    """Serial calls through one guard (`GuardDriver`), each result read from a tool message
    as the adapters read it."""

    def __init__(self, **options: Any) -> None:
        super().__init__(LoopGuard(**options), thread=THREAD)

    def step(self, tool: str, args: Any, result: Any, *, error: bool = False) -> str:
        status = "error" if error else "success"
        message = ToolMessage(result, tool_call_id=f"c{self.calls + 1}", status=status)
        normalizers = self.guard.config.normalizers(tool)
        return super().step(tool, args, result_of(message, normalizers, args=args))


def sent(n: int) -> str:
    receipt = {"platformMessageId": str(9_000_000 + n)}
    return json.dumps({"ok": True, "messageId": f"{n:016x}", "receipt": receipt, "ts": n})


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_message_sent_again_with_fresh_ids_is_a_near_repeat() -> None:
    """Steered and blocked `near_repeat_patience` calls later than exact repeats."""
    agent = Agent()
    verdicts = [agent.step("send", {"to": "ops", "text": "done"}, sent(n)) for n in range(9)]
    assert agent.stamps[:2] == [(5, "steer", "repeat"), (7, "block", "repeat")]
    assert verdicts[:6] == ["Proceed"] * 6
    assert verdicts[6] == "Block"


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
@pytest.mark.parametrize(
    ("tool", "answer"),
    [
        ("upload_file", lambda n: json.dumps({"ok": True, "fileId": f"file_{n:024x}"})),
        ("upload_file", lambda n: f"Uploaded report.pdf as file_{n:024x}"),
        ("plugin_send", lambda n: f"msg_{n:020x}"),
        ("plugin_send", lambda n: str(1_764_466_033_000 + n)),
    ],
    ids=["json-file-id", "text-file-id", "bare-id", "bare-number"],
)
def test_what_a_state_changing_call_made_is_fresh_whatever_its_key(tool: str, answer: Any) -> None:
    """An upload or a send answers the id of what it made: new on every call, a
    near-repeat however it is written. Another tool's answer is a near-repeat only where
    its JSON names the id that changed (`mask_named_ids`): in text, a new id there stays
    a new result."""
    agent, reader = Agent(), Agent()
    for n in range(1, 8):
        agent.step(tool, {"path": "report.pdf", "to": "ops"}, answer(n))
        reader.step("get_file", {"path": "report.pdf"}, answer(n))
    assert agent.stamps[:2] == [(5, "steer", "repeat"), (7, "block", "repeat")]
    named = answer(0).startswith("{")
    assert reader.stamps[:2] == ([(5, "steer", "repeat"), (7, "block", "repeat")] if named else [])


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_an_exact_repeat_of_a_result_with_fresh_values_is_judged_at_once() -> None:
    """Masked or not, an identical result is an exact repeat: never later than Pi."""
    agent = Agent()
    for _ in range(5):
        agent.step("send", {"to": "ops", "text": "done"}, sent(7))
    assert agent.stamps == [(3, "steer", "repeat"), (5, "block", "repeat")]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_progress_and_a_changed_identity_are_never_near_repeats() -> None:
    agent = Agent()
    for n in range(12):
        agent.step("poll", {"job": 1}, json.dumps({"status": "running", "rows": n * 10}))
        agent.step("send", {"to": "ops"}, json.dumps({"ok": True, "conversationId": f"c{n}"}))
    assert agent.stamps == []


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
@pytest.mark.parametrize("options", [{"fresh_results": False}, {"near_repeat_patience": 0}])
def test_near_repeats_can_be_turned_off_or_judged_as_exact(options: dict[str, Any]) -> None:
    agent, exact = Agent(**options), Agent(**options)
    for n in range(6):
        agent.step("send", {"to": "ops", "text": "done"}, sent(n))
        exact.step("send", {"to": "ops", "text": "done"}, sent(0))
    expected = [] if options.get("fresh_results") is False else exact.stamps
    assert agent.stamps == expected


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_tool_policy_turns_fresh_masking_off_for_one_tool() -> None:
    agent = Agent(tools={"send": ToolPolicy(fresh=False)})
    for n in range(6):
        agent.step("send", {"to": "ops", "text": "done"}, sent(n))
    assert agent.stamps == []


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_an_error_is_compared_with_the_arguments_it_quotes_masked() -> None:
    message = ToolMessage("Plan P1006 not found", tool_call_id="c", status="error")
    other = ToolMessage("Plan P1007 not found", tool_call_id="c", status="error")
    masked = result_of(message, args={"plan_id": "P1006"})
    assert masked.fingerprint == result_of(other, args={"plan_id": "P1007"}).fingerprint
    assert masked.variant  # equal only once masked: weak evidence
    unmasked = result_of(message)
    assert unmasked.fingerprint != result_of(other).fingerprint
    success = ToolMessage("Plan P1006: 3 steps", tool_call_id="c")
    assert result_of(success, args={"plan_id": "P1006"}).variant == ""  # results keep theirs


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_an_error_naming_each_input_is_steered_once_and_never_blocked() -> None:
    agent = Agent()
    verdicts = [
        agent.step(
            "get_plan", {"plan_id": f"P{1006 + n}"}, f"Plan P{1006 + n} not found", error=True
        )
        for n in range(10)
    ]
    assert verdicts == ["Proceed"] * 10
    assert agent.stamps == [(4, "steer", "same_error")]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_broken_tool_with_one_error_for_every_input_is_still_blocked() -> None:
    agent = Agent()
    verdicts = [
        agent.step("lookup", {"query": f"q{n}"}, "'str' object has no attribute 'get'", error=True)
        for n in range(8)
    ]
    assert "Block" in verdicts
    assert ("stop", "abort_threshold") in [(kind, reason) for _, kind, reason in agent.stamps]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
@pytest.mark.parametrize("shell", ["bash", "run_shell_command", "exec"])
def test_a_sweep_of_shell_commands_exiting_1_is_steered_once_at_most(shell: str) -> None:
    agent = Agent()
    verdicts = [
        agent.step(shell, {"command": f"grep -q p{n} src/"}, "exit code 1", error=True)
        for n in range(12)
    ]
    assert verdicts == ["Proceed"] * 12
    assert agent.stamps == [(4, "steer", "same_error")]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_policy_decides_whether_a_tool_is_a_shell() -> None:
    agent = Agent(tools={"bash": ToolPolicy(shell=False)})
    verdicts = [
        agent.step("bash", {"command": f"make t{n}"}, "exit code 2", error=True) for n in range(8)
    ]
    assert "Block" in verdicts


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_an_error_reported_in_the_text_is_an_error_result() -> None:
    """ "Error: ..." returned instead of raised: the same-error detector sees it."""
    agent = Agent()
    for n in range(6):
        agent.step("lookup", {"query": f"q{n}"}, "Error: service unavailable")
    assert ("steer", "same_error") in [(kind, reason) for _, kind, reason in agent.stamps]
    assert result_of(ToolMessage("No errors found", tool_call_id="c")).is_error is False


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
@pytest.mark.parametrize("period", [5, 6])
def test_a_cycle_of_up_to_six_calls_is_steered_by_its_third_lap(period: int) -> None:
    agent = Agent()
    for _ in range(6):
        for n in range(period):
            agent.step("read", {"path": f"f{n}"}, f"contents {n}")
    assert agent.stamps[0] == (2 * period + 3, "steer", "cycle")  # three calls into it
    assert "block" in [kind for _, kind, _ in agent.stamps]


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_the_same_call_once_per_user_turn_is_one_rule_whatever_came_between() -> None:
    """Three turns of the same question that each made the same call: steered in the
    third, with or without other calls between; two turns are not enough."""
    plain, mixed, twice = Agent(), Agent(), Agent()
    for turn in range(3):
        plain.new_request(f"r{turn}", "balance?")
        plain.step("get_balance", {}, "42")
        mixed.new_request(f"r{turn}", "balance?")
        if turn == 1:
            mixed.step("get_orders", {}, "[]")
        mixed.step("get_balance", {}, "42")
    for turn in range(2):
        twice.new_request(f"r{turn}", "balance?")
        for _ in range(2):
            twice.step("ls", {}, "")
    assert plain.stamps == [(3, "steer", "interleaved")]
    assert mixed.stamps == [(4, "steer", "interleaved")]
    assert twice.stamps == []


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_a_change_between_user_turns_makes_the_check_new() -> None:
    agent = Agent()
    for turn in range(4):
        agent.new_request(f"r{turn}")
        agent.step("write_file", {"path": "a", "text": f"v{turn}"}, "written")
        agent.step("pytest", {}, "FAILED test_a")
    assert agent.stamps == []


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
def test_what_the_turns_remember_survives_a_snapshot() -> None:
    guard = LoopGuard()
    snapshot: dict[str, Any] = {}  # the caller keeps the state, through JSON at every turn
    for turn in range(3):
        session = guard.session(THREAD, snapshot)
        session.start_request(f"r{turn}", "balance?")
        call = Call.of("get_balance", {}, id=f"c{turn}")
        session.check_call(call)
        session.record_result(call, result_of(ToolMessage("42", tool_call_id="c")))
        snapshot = json.loads(json.dumps(session.snapshot()))
    steer = guard.session(THREAD, snapshot).take_steer()
    assert steer is not None
    assert steer.reason == "interleaved"


def test_the_configuration_checks_its_new_fields() -> None:
    with pytest.raises(ValueError, match="near_repeat_patience"):
        LoopGuardConfig(near_repeat_patience=-1)
    with pytest.raises(ValueError, match="changes_state"):
        ToolPolicy(changes_state="yes")  # type: ignore[arg-type]
    environ = {"LOOP_GUARD_NEAR_REPEAT_PATIENCE": "0", "LOOP_GUARD_FRESH_RESULTS": "false"}
    config = LoopGuardConfig.from_env(environ)
    assert (config.near_repeat_patience, config.fresh_results) == (0, False)
    assert LoopGuardConfig.pi().fresh_results is False


@pytest.mark.internals(
    reason="how the adapters read a tool message into a Result; no public reader"
)
@pytest.mark.parametrize("where", ["head", "tail"])
def test_a_result_quoting_its_own_call_id_is_the_same_answer_each_call(where: str) -> None:
    """A successful result is searched for its call's id only once the call recurs; the
    repeats are then told exactly as repeats of a result that quotes no id."""
    filler = "line of the file\n" * 400  # past the head `reports_error` reads

    def quoting(n: int) -> str:
        quote = f"served for c{n}"
        return f"{quote}\n{filler}" if where == "head" else f"{filler}{quote}\n"

    quoting_agent, plain_agent = Agent(), Agent()
    verdicts = [quoting_agent.step("read_file", {"path": "a"}, quoting(n)) for n in range(1, 8)]
    plain = [plain_agent.step("read_file", {"path": "a"}, quoting(0)) for _ in range(1, 8)]
    assert verdicts == plain
    assert quoting_agent.stamps == plain_agent.stamps
    assert [kind for _, kind, _ in plain_agent.stamps][:2] == ["steer", "block"]
