"""The evaluation on recorded traces (needs ../shared/traces beside the repository)."""

from __future__ import annotations

import pytest

from evals.traces import DEFAULT_TRACES, Row, evaluate, summary, table
from loop_guard import LoopGuardConfig

pytestmark = pytest.mark.skipif(
    not (DEFAULT_TRACES / "labels.json").is_file(), reason="the recorded traces are not here"
)


def _by_file(rows: list[Row]) -> dict[str, Row]:
    return {row.file: row for row in rows}


def test_default_detectors_meet_every_target_on_the_recorded_traces() -> None:
    """The targets: every loop steered no later than two calls after its labelled first
    loop call; the 117-repeat runaway aborted before its 10th call; the interleaved one
    blocked; zero blocks on the 30 healthy traces, a steer on at most one."""
    rows = evaluate(DEFAULT_TRACES, LoopGuardConfig())
    loops = [row for row in rows if row.kind == "loop"]
    healthy = [row for row in rows if row.kind == "healthy"]
    assert (len(loops), len(healthy)) == (10, 30)
    late = [row.file for row in loops if not row.steered_in_time]
    assert late == []
    by_file = _by_file(rows)
    runaway = by_file["kimi-openclaw-P1-r5"]
    assert runaway.stop is not None
    assert runaway.stop < 10
    assert by_file["kimi-openclaw-P2-r7"].block is not None
    assert [row.file for row in healthy if row.block is not None] == []
    assert sum(row.steer is not None for row in healthy) <= 1


def test_pi_mode_is_the_baseline_the_detectors_improve_on() -> None:
    """Pi mode misses the non-consecutive loops the detectors catch, and never steers
    a healthy trace; every loop Pi catches in time, the default catches no later."""
    pi = _by_file(evaluate(DEFAULT_TRACES, LoopGuardConfig.pi()))
    default = _by_file(evaluate(DEFAULT_TRACES, LoopGuardConfig()))
    assert sum(row.steered_in_time for row in pi.values()) == 6
    assert all(row.steer is None and row.block is None for row in pi.values() if row.kind != "loop")
    for name, row in pi.items():
        if row.steer is not None:
            assert default[name].steer is not None
            assert default[name].steer <= row.steer
    text = table({"pi": list(pi.values()), "default": list(default.values())})
    assert "| kimi-openclaw-P2-r7 | loop | 5 | 19 | 6 / - / - | 6 / 11 / 14 |" in text
    assert summary(list(default.values()))["loops steered in time"] == "10/10"
