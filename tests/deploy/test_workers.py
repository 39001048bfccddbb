"""Two long-lived worker processes take turns on one thread mid-request.

A LangGraph deployment runs each step of a thread on whichever worker is free, and its
workers live on between steps. So a worker may resume a thread that another worker moved
on since it last saw it, while it still holds its own memory of the earlier steps. The
guard must decide from the thread, not from that stale memory: whichever processes run
the steps, the decisions equal those of one uninterrupted run (one steer, three blocks,
the stop, four tool runs).

The workers (`tests/support/workers_process.py`) share one PostgreSQL checkpointer, as a
deployment's do. Set LOOP_GUARD_TEST_POSTGRES_URL (`"$(.ci/postgres.sh)"`) to run these
tests; without it, or with a server that does not answer, they are skipped.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import queue
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import pytest

from tests.support import ROOT

PROCESS = ROOT / "tests" / "support" / "workers_process.py"
FACES = ("agent", "graph", "handler")
MODES = ("sync", "async")
REPLY_TIMEOUT = 60.0  # seconds a worker may take to answer one command
STEER = "LOOP GUARD: you have called"
BLOCK = "LOOP GUARD: this call was blocked"
STOP = "ai[loop_guard]:Stopped by loop_guard"
ASK = "human[]:Summarise notes.md"

Reply = dict[str, Any]


# --- the worker processes ---------------------------------------------------------------------


class Worker:
    """One `workers_process.py` process, alive across commands (and so is its guard)."""

    def __init__(self, name: str, url: str, face: str, mode: str) -> None:
        self.name = name
        self.stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, str(PROCESS), url, face, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
            cwd=ROOT,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the process closed its stdout: it exited

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self) -> None:
        assert self._receive() == {"ready": True}

    def send(self, op: str, thread: str, **arguments: Any) -> Reply:
        """Run one command; its reply (a worker's failure fails the test, with its traceback)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, "thread": thread, **arguments}) + "\n")
        self.process.stdin.flush()
        reply = self._receive()
        assert "error" not in reply, f"worker {self.name} failed on {op}:\n{reply['error']}"
        return reply

    def _receive(self) -> Reply:
        try:
            line = self._lines.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            self.close(graceful=False)  # stuck: its state is unknown, a new one replaces it
            pytest.fail(f"worker {self.name} gave no answer in {REPLY_TIMEOUT} s{self._tail()}")
        if line is None:
            self.close()
            pytest.fail(f"worker {self.name} exited{self._tail()}")
        return dict(json.loads(line))

    def _tail(self) -> str:
        with contextlib.suppress(ValueError):  # already closed
            self.stderr.seek(0)
            return ":\n" + self.stderr.read()[-3000:]
        return ""

    def close(self, *, graceful: bool = True) -> None:
        """Ask the worker to quit, else terminate it (then kill it): no process outlives
        its test module, even when a test fails mid-conversation."""
        if self.alive() and graceful:
            with contextlib.suppress(OSError, ValueError):
                assert self.process.stdin is not None
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ValueError):
            self.stderr.close()


@dataclass
class Run:
    """What a request left in the thread, and what it cost in all processes together."""

    timeline: list[str]
    runs: Counter[str]
    model_calls: int
    aborted: bool  # the last command ended with LoopGuardStop (the handler's stop)
    log: list[str]  # who did what, for failure messages


@dataclass
class Pool:
    """Workers A and B for one face and mode, shared by the tests of that face and mode.

    Every test uses threads of its own, so a worker's memory of another test's thread
    never matters; what carries over is only what a deployment's workers carry over.
    """

    url: str
    face: str
    mode: str
    workers: dict[str, Worker] = field(default_factory=dict)
    reference_run: Run | None = None

    @property
    def stops_late(self) -> bool:
        """Before 3.11 the handler never sees create_agent's async model calls (no run
        context for asyncio tasks): the guarded tool raises the stop instead, at the call
        the next model response makes, one model call later (docs/supported-versions.md)."""
        return self.face == "handler" and self.mode == "async" and sys.version_info < (3, 11)

    def pair(self) -> tuple[Worker, Worker]:
        """A and B, alive: a worker that died (or was killed by a failing test) is replaced."""
        fresh = [
            Worker(name, self.url, self.face, self.mode)
            for name in ("A", "B")
            if name not in self.workers or not self.workers[name].alive()
        ]
        for worker in fresh:  # started together, they import in parallel
            self.workers[worker.name] = worker  # closed with the pool, whatever happens
        for worker in fresh:
            worker.wait_ready()
        return self.workers["A"], self.workers["B"]

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()


@pytest.fixture(
    scope="module",
    params=[(face, mode) for face in FACES for mode in MODES],
    ids=[f"{face}-{mode}" for face in FACES for mode in MODES],
)
def pool(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[Pool]:
    face, mode = request.param
    workers = Pool(postgres_url, face, mode)
    try:
        yield workers
    finally:
        workers.close()


# --- running a request ------------------------------------------------------------------------


class Driver:
    """Sends commands on one thread to the workers and adds up what they report."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.runs: Counter[str] = Counter()
        self.model_calls = 0
        self.log: list[str] = []
        self.last: Reply = {}

    def __call__(self, worker: Worker, op: str, **arguments: Any) -> Reply:
        reply = worker.send(op, self.thread, **arguments)
        self.runs.update(reply["runs"])
        self.model_calls += reply["model_calls"]
        self.log.append(
            f"{worker.name} {op}{arguments or ''}: {reply['resumes']} resumes, "
            f"runs {reply['runs']}, {reply['model_calls']} model calls, "
            f"{len(reply['timeline'])} messages" + (", aborted" if reply["aborted"] else "")
        )
        self.last = reply
        return reply

    def done(self) -> bool:
        return not self.last["next"] or bool(self.last["aborted"])

    def result(self) -> Run:
        return Run(
            list(self.last["timeline"]),
            self.runs,
            self.model_calls,
            bool(self.last["aborted"]),
            self.log,
        )


def reference(pool: Pool, new_thread: Any) -> Run:
    """One worker runs the whole request alone, pausing before each tool step (cached)."""
    if pool.reference_run is None:
        a, _ = pool.pair()
        drive = Driver(new_thread())
        drive(a, "start")
        drive(a, "finish")
        pool.reference_run = drive.result()
    return pool.reference_run


def summary(run: Run) -> str:
    return (
        f"{run.runs['read_file']} tool runs, {count(run.timeline, STEER)} steers, "
        f"{count(run.timeline, BLOCK)} blocks, {run.model_calls} model calls, "
        f"{'aborted' if run.aborted else 'stop message' if stopped(run.timeline) else 'no stop'}"
    )


def count(timeline: list[str], text: str) -> int:
    return sum(text in line for line in timeline)


def stopped(timeline: list[str]) -> bool:
    return bool(timeline) and timeline[-1].startswith(STOP)


def assert_guarded(run: Run, pool: Pool) -> None:
    """One steer, three blocks, then the stop, as the face delivers them."""
    face = pool.face
    timeline = run.timeline
    steer = [line for line in timeline if STEER in line]
    assert len(steer) == 1, summary(run)
    blocks = sum(line.startswith(f"tool:error:{BLOCK}") for line in timeline)
    assert blocks == 3, summary(run)
    if face == "handler":
        # No node: the steer rides on the 3rd tool result, and the handler stops the
        # next model call with LoopGuardStop (the thread ends with the last block).
        assert steer[0].startswith("tool:error:"), steer
        assert run.aborted, summary(run)
        assert not any(line.startswith("ai[loop_guard]") for line in timeline)
        if pool.stops_late:
            assert timeline[-2].startswith(f"tool:error:{BLOCK}"), summary(run)
            assert timeline[-1].startswith("ai[]:read_file"), summary(run)
        else:
            assert timeline[-1].startswith(f"tool:error:{BLOCK}"), summary(run)
    else:
        assert steer[0].startswith("human[loop_guard]:"), steer
        assert not run.aborted, summary(run)
        assert stopped(timeline), summary(run)


def assert_same_decisions(run: Run, whole: Run, what: str) -> None:
    """The run's thread and tool runs equal the uninterrupted run's; a readable diff if not."""
    if run.timeline == whole.timeline and run.runs == whole.runs and run.aborted == whole.aborted:
        return
    diff = "\n".join(
        line[:140]
        for line in difflib.unified_diff(
            whole.timeline, run.timeline, "one worker", what, lineterm="", n=len(run.timeline)
        )
    )
    pytest.fail(
        f"{what} decided differently from one uninterrupted run\n"
        f"  one worker: {summary(whole)}\n  {what}: {summary(run)}\n"
        + "\n".join(f"    {line}" for line in run.log)
        + f"\n{diff}"
    )


# --- the tests --------------------------------------------------------------------------------


def test_one_worker_alone_is_steered_blocked_and_stopped(pool: Pool, new_thread: Any) -> None:
    """The reference: paused before every tool step, one worker steers once, blocks three
    calls and stops the request after four tool runs and seven model calls."""
    whole = reference(pool, new_thread)
    assert whole.timeline[0] == ASK
    assert_guarded(whole, pool)
    assert whole.runs == Counter(read_file=4), summary(whole)
    # The handler stops the 8th model call, or the guarded tool the 8th's tool call.
    assert whole.model_calls == 7 + pool.stops_late, summary(whole)


@pytest.mark.parametrize("b_steps", [2, 3])
def test_a_worker_resumes_a_thread_another_worker_moved_on(
    pool: Pool, new_thread: Any, b_steps: int
) -> None:
    """A runs tool step 1, B runs the next steps, then A (still holding its memory of
    step 1) finishes the request: the same decisions as one uninterrupted run."""
    whole = reference(pool, new_thread)
    a, b = pool.pair()
    drive = Driver(new_thread())
    drive(a, "start")
    drive(a, "step", n=1)
    drive(b, "step", n=b_steps)
    assert drive.last["timeline"] == whole.timeline[: len(drive.last["timeline"])], (
        "B did not continue the thread as one worker would:\n" + "\n".join(drive.log)
    )
    drive(a, "finish")
    assert_same_decisions(drive.result(), whole, f"A, B ({b_steps} steps), A")
    assert_guarded(drive.result(), pool)


def test_workers_alternating_step_by_step(pool: Pool, new_thread: Any) -> None:
    """A and B take turns one tool step at a time: both always resume a thread the other
    moved on; the same decisions as one uninterrupted run."""
    whole = reference(pool, new_thread)
    a, b = pool.pair()
    drive = Driver(new_thread())
    drive(a, "start")
    turn = 0
    while not drive.done() and turn < 40:
        drive((b, a)[turn % 2], "step", n=1)
        turn += 1
    assert_same_decisions(drive.result(), whole, "A and B alternating")
    assert_guarded(drive.result(), pool)


def test_the_next_request_on_the_other_worker_starts_fresh(pool: Pool, new_thread: Any) -> None:
    """After A's request was stopped, B runs the thread's next request and A the one after:
    each decides as the same request on one worker does (the streak starts over at each
    user message; the third turn making the same failing call is a repeat across turns)."""
    a, b = pool.pair()

    def requests(workers: Sequence[Worker]) -> list[Run]:
        drive, done, before = Driver(new_thread()), [], []
        for worker in workers:
            drive.runs, drive.model_calls, drive.log = Counter(), 0, []
            drive(worker, "start")
            drive(worker, "finish")
            run = drive.result()
            assert run.timeline[: len(before)] == before, "the earlier requests were rewritten"
            rest = run.timeline[len(before) :]
            done.append(Run(rest, run.runs, run.model_calls, run.aborted, run.log))
            before = list(run.timeline)
        assert count(before, ASK) == len(workers)
        return done

    alone = requests([a, a, a])
    assert_guarded(alone[0], pool)
    for n, (this, reference) in enumerate(zip(requests([a, b, a]), alone, strict=True)):
        assert_same_decisions(this, reference, f"request {n + 1} on {(a, b, a)[n].name}")
    assert "in 3 of your last turns" in "\n".join(alone[2].timeline)
