"""Identical siblings (`dedupe_siblings`): identical calls of one response run once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, final

from loop_guard._values import Call

CLAIM_TIMEOUT = 5.0
"""Seconds a duplicate waits for its original to start; then it runs itself (fail open)."""


def original_of(call: Call, siblings: Sequence[Call]) -> Call | None:
    """The first identical sibling (model order) when `call` duplicates it, else `None`.

    Examples:
        >>> a, b = Call.of("ls", {}, id="1"), Call.of("ls", {}, id="2")
        >>> original_of(b, [a, b]).id, original_of(a, [a, b])
        ('1', None)
    """
    for sibling in siblings:
        if sibling.tool == call.tool and sibling.fingerprint == call.fingerprint:
            return None if sibling.key == call.key else sibling
    return None


def original_output(future: Future[Any]) -> tuple[bool, Any]:
    """What a finished original leaves its duplicates: `(True, output)`; its own error is
    raised again, as the duplicate would have raised it. `(False, None)` when it was
    interrupted (cancelled, or stopped by a `BaseException`): the duplicate runs itself.
    """
    if future.cancelled():
        return False, None
    error = future.exception()
    if error is None:
        return True, future.result()
    if isinstance(error, Exception):
        raise error
    return False, None


def _publish(run: _Run, *, output: Any = None, error: BaseException | None = None) -> None:
    if run.output.done():  # settled already (cancelled through a duplicate): nothing to add
        return
    if error is None:
        run.output.set_result(output)
    else:
        run.output.set_exception(error)


_KEPT = 1024  # runs kept at most: a duplicate that never comes cannot grow the table


@dataclass(slots=True)
class _Run:
    remaining: int  # duplicates that have not collected the output yet
    started: threading.Event = field(default_factory=threading.Event)
    output: Future[Any] = field(default_factory=Future)


@final
class SharedRuns:
    """Runs an original call once and hands its output to its duplicates.

    Keyed by (conversation, original call id). A duplicate waits for its original to
    start (at most `CLAIM_TIMEOUT` seconds, else it runs itself: fail open) and then
    for its output, an exception included. The entry goes once every duplicate has it.

    Examples:
        >>> runs = SharedRuns()
        >>> runs.run_original(("t", "1"), 1, lambda: "result")
        'result'
        >>> runs.wait(("t", "1"), 1).result()
        'result'
    """

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], _Run] = {}
        self._lock = threading.Lock()

    def run_original(
        self, key: tuple[str, str], duplicates: int, produce: Callable[[], Any]
    ) -> Any:
        """Run the original and publish its output to its `duplicates`."""
        run = self._started(key, duplicates)
        try:
            output = produce()
        except BaseException as error:
            _publish(run, error=error)
            raise
        _publish(run, output=output)
        return output

    async def arun_original(
        self, key: tuple[str, str], duplicates: int, produce: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Async twin of `run_original`."""
        run = self._started(key, duplicates)
        try:
            output = await produce()
        except BaseException as error:
            _publish(run, error=error)
            raise
        _publish(run, output=output)
        return output

    def wait(self, key: tuple[str, str], duplicates: int) -> Future[Any] | None:
        """The original's output to come, or `None` when it did not start in time."""
        run = self._run(key, duplicates)
        return self._collect(key, run) if run.started.wait(CLAIM_TIMEOUT) else None

    async def await_(self, key: tuple[str, str], duplicates: int) -> Future[Any] | None:
        """Async twin of `wait`: waits without blocking the event loop."""
        run = self._run(key, duplicates)
        started = run.started.is_set() or await asyncio.to_thread(run.started.wait, CLAIM_TIMEOUT)
        return self._collect(key, run) if started else None

    def _run(self, key: tuple[str, str], duplicates: int) -> _Run:
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = _Run(remaining=duplicates)
                while len(self._runs) > _KEPT:
                    del self._runs[next(iter(self._runs))]
            return run

    def _started(self, key: tuple[str, str], duplicates: int) -> _Run:
        with self._lock:
            run = self._runs.get(key)
            if run is not None and run.output.done():  # the original again: a retry
                del self._runs[key]
        run = self._run(key, duplicates)
        run.started.set()
        return run

    def _collect(self, key: tuple[str, str], run: _Run) -> Future[Any]:
        def collected(_: Future[Any]) -> None:
            with self._lock:
                run.remaining -= 1
                if run.remaining <= 0 and self._runs.get(key) is run:
                    del self._runs[key]

        run.output.add_done_callback(collected)
        return run.output
