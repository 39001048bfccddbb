"""Loops between agents on a thread that another process resumes mid-loop (SPEC §5, §9).

A swarm ping-pong and a supervisor re-delegating the same task run their first laps in one
process; a fresh process, with agents and guards of its own, resumes the same thread from
its checkpointer: the steer and the stop land exactly where one uninterrupted run puts them.
SQLite always; PostgreSQL too when LOOP_GUARD_TEST_POSTGRES_URL names a server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.agents import needs_async_context

PROCESS = ROOT / "tests" / "support" / "between_process.py"
STEER = "human[loop_guard]:LOOP GUARD"
STOP = "ai[loop_guard]:Stopped by loop_guard"
MODES = [pytest.param("sync"), pytest.param("async", marks=needs_async_context)]
SHAPES = ["swarm", "supervisor"]


Place = tuple[str, str]  # a checkpointer (a SQLite file, a PostgreSQL URL) and a thread in it


def run_process(place: Place, shape: str, mode: str, resumes: int) -> list[str]:
    """Drive a thread from a new process; the thread's timeline when it is done."""
    store, thread = place
    done = subprocess.run(
        [sys.executable, str(PROCESS), store, thread, shape, mode, str(resumes)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def assert_stopped_in_time(shape: str, whole: Sequence[str]) -> None:
    """The swarm: steered within 3 laps, stopped within 6; the supervisor: steered after
    3 delegations and stopped with at most 4 run. Both end with the stop."""
    steer = next(i for i, line in enumerate(whole) if line.startswith(STEER))
    if shape == "swarm":
        handoffs = [line.startswith("tool:success:Successfully transferred") for line in whole]
        assert sum(handoffs[:steer]) <= 2 * 3
        assert sum(handoffs) <= 2 * 6
    else:
        reports = [line == "ai[worker]:Nothing found." for line in whole]
        assert sum(reports[:steer]) == 3
        assert sum(reports) <= 4
    assert whole[-1].startswith(STOP)


def resumed_mid_loop(whole_run: Place, moved_run: Place, shape: str, mode: str) -> None:
    """One process runs `whole_run` to its end; on `moved_run`, one process runs the first
    laps, a fresh one the rest: the same timeline."""
    whole = run_process(whole_run, shape, mode, 1000)
    assert_stopped_in_time(shape, whole)
    first = run_process(moved_run, shape, mode, 2)
    assert not any(line.startswith(STEER) for line in first)  # moved before the steer
    second = run_process(moved_run, shape, mode, 1000)
    assert second[: len(first)] == first
    assert second == whole


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_loop_between_agents_resumed_by_a_fresh_process_on_sqlite(
    tmp_path: Path, shape: str, mode: str
) -> None:
    resumed_mid_loop(
        (str(tmp_path / "whole.sqlite"), "t"), (str(tmp_path / "moved.sqlite"), "t"), shape, mode
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_loop_between_agents_resumed_by_a_fresh_process_on_postgres(
    postgres_url: str, new_thread: Any, shape: str, mode: str
) -> None:
    resumed_mid_loop((postgres_url, new_thread()), (postgres_url, new_thread()), shape, mode)
