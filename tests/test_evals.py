"""The evaluation on recorded traces (needs ../shared/traces beside the repository)."""

from __future__ import annotations

import pytest

from evals.traces import DEFAULT_TRACES, evaluate, summary, table
from loop_guard import LoopGuardConfig

pytestmark = pytest.mark.skipif(
    not (DEFAULT_TRACES / "labels.json").is_file(), reason="the recorded traces are not here"
)


def test_pi_mode_on_the_recorded_traces() -> None:
    """No block and no steer on the 30 healthy traces; the 117-repeat runaway is stopped
    before its 10th call; at least 6 of the 10 loops are steered in time."""
    rows = evaluate(DEFAULT_TRACES, LoopGuardConfig())
    by_file = {row.file: row for row in rows}
    healthy = [row for row in rows if row.kind == "healthy"]
    assert len(healthy) == 30
    assert all(row.block is None and row.warn is None for row in healthy)
    runaway = by_file["kimi-openclaw-P1-r5"]
    assert runaway.stop is not None
    assert runaway.stop < 10
    assert sum(row.steered_in_time for row in rows if row.kind == "loop") >= 6
    assert summary(rows)["healthy with a block (target 0)"] == 0
    assert "kimi-openclaw-P2-r7" in table({"pi": rows})
