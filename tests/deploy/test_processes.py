"""Processes and restarts: a thread moved between processes decides as if it never moved."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from tests.support.agents import WORKER, assert_valid_history, run_worker

FACES = ["agent", "graph"]


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("steps", [3])
def test_resume_mid_streak_in_a_new_process(tmp_path: Path, face: str, steps: int) -> None:
    """Paused before a tool step and continued by another process: the same decisions."""
    whole = run_worker(tmp_path / "one.sqlite", face, "step")
    first = run_worker(tmp_path / "two.sqlite", face, "step", steps)
    second = run_worker(tmp_path / "two.sqlite", face, "step")
    assert len(first) < len(second)
    assert second == whole
    assert sum("LOOP GUARD: you have called" in line for line in whole) == 1
    assert sum("LOOP GUARD: this call was blocked" in line for line in whole) == 3
    assert whole[-1].startswith("ai[loop_guard]:Stopped by loop_guard")


@pytest.mark.parametrize("face", FACES)
def test_processes_alternating_requests_on_one_thread(tmp_path: Path, face: str) -> None:
    """Two requests of a thread in two processes equal the same requests in one process."""
    database = tmp_path / "thread.sqlite"
    first = run_worker(database, face, "request")
    second = run_worker(database, face, "request")
    assert second[: len(first)] == first
    assert second[len(first) :] == first  # the second request starts fresh, decides alike
    assert sum(line.startswith("ai[loop_guard]:Stopped") for line in second) == 2


def _messages(database: Path) -> int:
    try:
        saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
        found = saver.get_tuple({"configurable": {"thread_id": "t"}})
    except sqlite3.OperationalError:  # the worker is still creating the database
        return 0
    return 0 if found is None else len(found.checkpoint["channel_values"].get("messages", []))


@pytest.mark.parametrize("face", FACES)
def test_a_process_killed_mid_run_then_resumed(tmp_path: Path, face: str) -> None:
    """SIGKILL in the middle of a streak; a new process resumes the thread: the history
    is valid and the decisions equal an uninterrupted run."""
    whole = run_worker(tmp_path / "whole.sqlite", face, "slow")
    database = tmp_path / "killed.sqlite"
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(database), "t", face, "slow"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if database.exists() and _messages(database) >= 5:  # after the 2nd result
            break
        time.sleep(0.02)
    assert process.poll() is None, "the worker finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _messages(database) < len(whole)
    resumed = run_worker(database, face, "continue")
    assert resumed == whole
    saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    found = saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert found is not None
    assert_valid_history(found.checkpoint["channel_values"]["messages"])
