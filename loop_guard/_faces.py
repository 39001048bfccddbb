"""What the LangChain faces do with the guard beyond one transition: send its events to
the sinks, read a batch's results (reporting those that cannot be read) and share one
run among identical siblings, and say when a stopped request's final answer failed. The
codec they use is `_langchain.py`, which knows no guard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from loop_guard import _otel_sink
from loop_guard._guard import LoopGuard, Session
from loop_guard._history import handoff_news
from loop_guard._langchain import answers_to, calls_of, duplicate_of, result_of, tokens_of
from loop_guard._langchain_sink import dispatch_event
from loop_guard._siblings import original_of, original_output
from loop_guard._values import Block, Call, Proceed, Result, Stop

logger = logging.getLogger("loop_guard")


def attach_sinks(guard: LoopGuard) -> None:
    """Send the guard's events where a LangChain run's other events go (custom events,
    the `custom` stream), and to OpenTelemetry when its API is installed (`otel`)."""
    guard.subscribe(dispatch_event)
    if _otel_sink.AVAILABLE:
        guard.subscribe(_otel_sink.record_event)


def verdicts_of(
    session: Session, reply: AIMessage, answers: Sequence[ToolMessage]
) -> Iterator[tuple[Call, Proceed | Block | Stop, ToolMessage | None]]:
    """The reply decision every face shares: each call of `reply`, in the model's order,
    with the verdict the session gives it (`Session.check_batch`, which gives a call
    decided before the same verdict again) and its answer among `answers`, if any."""
    calls = calls_of(reply)
    verdicts = session.check_batch(calls, tokens_of(reply))
    return zip(calls, verdicts, answers_to(calls, answers), strict=True)


def final_answer_failed(error: BaseException) -> None:
    """Log that the model call for a stopped request's final answer failed: the request
    ends with the guard's message instead (`exit_behavior="answer"`, `LoopGuardNode(model=...)`)."""
    logger.warning(
        "loop guard: the final answer of a stopped request failed (%s: %s); the request "
        "ends with the guard's message",
        type(error).__name__,
        error,
    )


def results_of(
    guard: LoopGuard,
    session: Session,
    answered: Iterable[tuple[Call, ToolMessage]],
    tools: Collection[str] | None = None,
    batch: tuple[Sequence[BaseMessage], AIMessage] | None = None,
) -> list[tuple[Call, Result]]:
    """Each answered call with its `Result`, read with its tool's normalizers (`tools`:
    as for `result_of`); `batch`, the history and the response the calls are of, gives
    a handoff's result what its agent said (`handoff_news`).

    An answer that cannot be read (a normalizer that raises) is reported and left out,
    so that the rest of its batch is still recorded.
    """
    results = []
    for call, answer in answered:
        try:
            normalizers = guard.config.normalizers(call.tool)
            result = result_of(answer, normalizers, tools, args=call.args)
            if batch is not None:
                result = result.carrying(handoff_news(*batch, answer))
            results.append((call, result))
        except Exception as error:  # a fault of the guard's configuration: this call only
            guard.report_fault(session.conversation, error)
    return results


def shared_run(
    guard: LoopGuard,
    conversation: str,
    call: Call,
    siblings: Sequence[Call],
    produce: Callable[[], Any],
) -> Any:
    """Run a tool call; with `dedupe_siblings`, identical siblings share one run.

    The first identical sibling (model order) runs; each later one waits for its output
    and answers with a copy marked as a duplicate. Fails open: a duplicate whose
    original does not start in time, or has no tool message, runs itself.
    """
    sharing = _sharing(guard, conversation, call, siblings)
    if sharing is None:
        return produce()
    key, duplicates, original = sharing
    if original is None:
        return guard.siblings.run_original(key, duplicates, produce)
    future = guard.siblings.wait(key, duplicates)
    if future is None:
        return produce()
    wait_futures([future])
    copy = _copy(guard, future, original, call)
    return produce() if copy is None else copy


async def ashared_run(
    guard: LoopGuard,
    conversation: str,
    call: Call,
    siblings: Sequence[Call],
    produce: Callable[[], Awaitable[Any]],
) -> Any:
    """Async twin of `shared_run`."""
    sharing = _sharing(guard, conversation, call, siblings)
    if sharing is None:
        return await produce()
    key, duplicates, original = sharing
    if original is None:
        return await guard.siblings.arun_original(key, duplicates, produce)
    future = await guard.siblings.await_(key, duplicates)
    if future is None:
        return await produce()
    try:  # shielded: cancelling this duplicate must not cancel the run others share
        await asyncio.shield(asyncio.wrap_future(future))
    except BaseException:
        if not future.done():
            raise  # this duplicate itself was cancelled
    copy = _copy(guard, future, original, call)
    return await produce() if copy is None else copy


def _sharing(
    guard: LoopGuard, conversation: str, call: Call, siblings: Sequence[Call]
) -> tuple[tuple[str, str], int, Call | None] | None:
    """(key, duplicates, original or None for the original) when the run is shared."""
    if not guard.config.dedupe_siblings:
        return None
    duplicates = sum(sibling == call for sibling in siblings) - 1  # same tool and args
    if duplicates < 1:
        return None
    original = original_of(call, siblings)
    return (conversation, (original or call).key), duplicates, original


def _copy(guard: LoopGuard, future: Future[Any], original: Call, call: Call) -> ToolMessage | None:
    """A duplicate's answer from its original's finished run; `None` when it must run
    itself (the original was interrupted, or its output has no tool message)."""
    finished, output = original_output(future)
    if not finished:
        return None
    return duplicate_of(output, original, call.id, guard.config.normalizers(call.tool))
