"""Loops between agents on a thread that another process resumes mid-loop (SPEC §5, §9).

A swarm ping-pong, a supervisor re-delegating the same task and a ping-pong in a network
of one's own (the first two also watched by the callback handler instead of middleware)
run their first laps in one process; a fresh process, with agents and guards
of its own, resumes the same thread from its checkpointer: the steer and the stop land
exactly where one uninterrupted run puts them, and the two processes together publish
the events that run does, each once. SQLite always, every shape in every mode; PostgreSQL
too when LOOP_GUARD_TEST_POSTGRES_URL names a server, every shape in one mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.support import ROOT
from tests.support.agents import needs_async_context

PROCESS = ROOT / "tests" / "support" / "between_process.py"
STEER = "human[loop_guard]:LOOP GUARD"
HANDED_STEER = "\n\nLOOP GUARD: "  # the handler's steer, riding on a tool's answer
STOP = "ai[loop_guard]:Stopped by loop_guard"
MODES = [pytest.param("sync"), pytest.param("async", marks=needs_async_context)]
SHAPES = ["swarm", "supervisor", "network", "handler-swarm", "handler-supervisor"]
AFTER_STEER = {
    "swarm": 3,
    "supervisor": 3,
    "network": 5,
    "handler-swarm": 3,
    "handler-supervisor": 3,
}
"""Resumes after which the first process has published the steer (the network's: decided
by the guarded tool, still to be written by the node)."""


Place = tuple[str, str]  # a checkpointer (a SQLite file, a PostgreSQL URL) and a thread in it


class Share(NamedTuple):
    """What one process saw of a thread: its timeline when the process was done, and the
    kinds of the events it published."""

    timeline: list[str]
    events: list[str]


def run_process(place: Place, shape: str, mode: str, resumes: int) -> Share:
    """Drive a thread from a new process; what it saw of it."""
    store, thread = place
    done = subprocess.run(
        [sys.executable, str(PROCESS), store, thread, shape, mode, str(resumes)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    return Share(seen["timeline"], seen["events"])


def assert_stopped_in_time(shape: str, whole: Sequence[str]) -> None:
    """The ping-pongs: steered within 3 laps, stopped within 6; the supervisor: steered
    after 3 delegations and stopped with at most 4 run. All end with the stop."""
    steer = next(
        i for i, line in enumerate(whole) if line.startswith(STEER) or HANDED_STEER in line
    )
    shape = shape.removeprefix("handler-")
    if shape == "network":
        handoffs = [line.startswith("tool:success:Transferred") for line in whole]
        assert sum(handoffs[:steer]) == 2 * 3
        assert sum(handoffs) <= 2 * 6
    elif shape == "swarm":
        handoffs = [line.startswith("tool:success:Successfully transferred") for line in whole]
        assert sum(handoffs[:steer]) <= 2 * 3
        assert sum(handoffs) <= 2 * 6
    else:
        reports = [line == "ai[worker]:Nothing found." for line in whole]
        assert sum(reports[:steer]) == 3
        assert sum(reports) <= 4
    assert whole[-1].startswith(STOP)


def resumed_mid_loop(whole_run: Place, moved_runs: Sequence[Place], shape: str, mode: str) -> None:
    """One process runs `whole_run` to its end; on each of `moved_runs`, one process runs
    the first laps (before the steer, then after the first process published it), a fresh
    one the rest: the same timeline, and between them the same events, each once."""
    whole = run_process(whole_run, shape, mode, 1000)
    assert_stopped_in_time(shape, whole.timeline)
    assert whole.events == ["steer", "block", "block", "block", "stop"]
    before_steer, after_steer = moved_runs
    for place, resumes in ((before_steer, 2), (after_steer, AFTER_STEER[shape])):
        first = run_process(place, shape, mode, resumes)
        assert ("steer" in first.events) == (place is after_steer)
        second = run_process(place, shape, mode, 1000)
        assert second.timeline[: len(first.timeline)] == first.timeline
        assert second.timeline == whole.timeline
        assert first.events + second.events == whole.events


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_loop_between_agents_resumed_by_a_fresh_process_on_sqlite(
    tmp_path: Path, shape: str, mode: str
) -> None:
    moved = [(str(tmp_path / f"moved-{n}.sqlite"), "t") for n in range(2)]
    resumed_mid_loop((str(tmp_path / "whole.sqlite"), "t"), moved, shape, mode)


# On PostgreSQL each shape in one mode, the modes taken in turn: every shape and every mode
# meet the server (every pair of them meets SQLite above), at half the processes.
ON_POSTGRES = [
    pytest.param(shape, *MODES[index % len(MODES)].values, marks=MODES[index % len(MODES)].marks)
    for index, shape in enumerate(SHAPES)
]


@pytest.mark.parametrize(("shape", "mode"), ON_POSTGRES)
def test_a_loop_between_agents_resumed_by_a_fresh_process_on_postgres(
    postgres_url: str, new_thread: Any, shape: str, mode: str
) -> None:
    moved = [(postgres_url, new_thread()) for _ in range(2)]
    resumed_mid_loop((postgres_url, new_thread()), moved, shape, mode)


CHATS = ["chat-middleware", "chat-handler", "chat-node"]


def talked_to_the_end(whole_run: Place, moved: Place, shape: str, mode: str) -> None:
    """The guessing game (`tests.support.talk`), paused before each of bob's turns: moved
    to a fresh process after 3 of his turns, it runs to the same answer as one
    uninterrupted run, and neither process publishes any event (SPEC §9: new words are
    progress, read from the history alike in every process)."""
    whole = run_process(whole_run, shape, mode, 1000)
    assert whole.timeline[-1] == "ai[alice]:The number is 37."
    assert whole.events == []
    first = run_process(moved, shape, mode, 3)
    second = run_process(moved, shape, mode, 1000)
    assert len(first.timeline) < len(whole.timeline)
    assert second.timeline == whole.timeline
    assert first.events + second.events == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", CHATS)
def test_a_conversation_between_agents_resumed_by_a_fresh_process_on_sqlite(
    tmp_path: Path, shape: str, mode: str
) -> None:
    moved = (str(tmp_path / "moved.sqlite"), "t")
    talked_to_the_end((str(tmp_path / "whole.sqlite"), "t"), moved, shape, mode)


@pytest.mark.parametrize("shape", CHATS)
def test_a_conversation_between_agents_resumed_by_a_fresh_process_on_postgres(
    postgres_url: str, new_thread: Any, shape: str
) -> None:
    """The same on PostgreSQL (sync: the async checkpointer is the SQLite test's)."""
    talked_to_the_end((postgres_url, new_thread()), (postgres_url, new_thread()), shape, "sync")
