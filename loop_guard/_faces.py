"""What the LangChain faces do with the guard beyond one transition: check the guard
they are given, send its events to the sinks, take the reply step (`reply_step`), read a
batch's results (reporting those that cannot be read) and share one run among identical
siblings, and say when a stopped request's final answer failed. The codec they use is
`_langchain.py`, which knows no guard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, cast, final

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from loop_guard import _otel_sink
from loop_guard._guard import LoopGuard, Session
from loop_guard._history import handoff_news
from loop_guard._langchain import (
    answers_to,
    as_handoff,
    calls_of,
    duplicate_of,
    result_of,
    tokens_of,
)
from loop_guard._langchain_sink import dispatch_event
from loop_guard._siblings import original_of, original_output
from loop_guard._values import Block, Call, Proceed, Result, Steer, Stop

logger = logging.getLogger("loop_guard")


def checked_guard(guard: object, error: type[Exception] = ValueError) -> LoopGuard:
    """`guard` as a face is given it, checked at run time (callers may be untyped)."""
    if isinstance(guard, LoopGuard):
        return guard
    hint = (
        " (a LoopGuardMiddleware guards a create_agent agent by itself: pass it as "
        "middleware=[...] and leave the tools unwrapped)"
        if type(guard).__name__ == "LoopGuardMiddleware"
        else ""
    )
    msg = f"guard must be a LoopGuard, got {type(guard).__name__}{hint}"
    raise error(msg)


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


@final
@dataclass(frozen=True, slots=True)
class CallOutcome:
    """One call of a reply after the reply step: its verdict and its answer in the
    history, if it has one yet."""

    call: Call
    verdict: Proceed | Block | Stop
    answer: ToolMessage | None

    @property
    def message(self) -> str | None:
        """What the model is told in the call's place when it does not run: the block's
        message, or the stop's."""
        verdict = self.verdict
        return verdict.message if isinstance(verdict, Block | Stop) else None


@final
@dataclass(frozen=True, slots=True)
class ReplyStep:
    """What a face renders of a reply: each call's outcome, in the model's order (none
    when the step did not decide the reply), and what comes next (`Session.finish`):
    the `Stop` that ended the request, else the steer claimed for delivery, else `None`."""

    calls: tuple[CallOutcome, ...]
    after: Stop | Steer | None


def reply_step(
    guard: LoopGuard,
    session: Session,
    reply: AIMessage | None,
    answers: Sequence[ToolMessage] = (),
    *,
    awaiting: Sequence[Call] | None = None,
    settle: bool = True,
    claim: bool = True,
    tools: Collection[str] | None = None,
    history: Sequence[BaseMessage] | None = None,
    earlier: Callable[[Call], Iterable[Result]] | None = None,
) -> ReplyStep:
    """The step every face takes on a model reply and the answers it has so far.

    1. Decide: each call's verdict, in the model's order (`verdicts_of`); unless
       `awaiting` is given (the open batch's calls still awaited, `Session.awaiting`):
       the reply was decided before, and only the answers of those calls are read.
    2. Record: the answered calls that proceed and whose result the session awaits
       (another face may have recorded it) are read as results (`results_of`, with
       `tools`; `history`, the messages the reply ends, gives a handoff's result what
       its agent said).
    3. Finish (`Session.finish`, with `settle`, `claim` and `earlier`): the results
       recorded, the batch closed, and what comes next. With `claim` false, a due
       steer stays due and `after` is only the stop. A step with nothing to record,
       settle or claim reads the stop alone.
    """
    outcomes: tuple[CallOutcome, ...] = ()
    answered: list[tuple[Call, ToolMessage]] = []
    if reply is not None and reply.tool_calls:
        if awaiting is None:
            outcomes = tuple(
                CallOutcome(*decided) for decided in verdicts_of(session, reply, answers)
            )
            for outcome in outcomes:
                if (
                    outcome.answer is not None
                    and isinstance(outcome.verdict, Proceed)
                    and session.awaits_result(outcome.call)
                ):
                    answered.append((outcome.call, outcome.answer))
        else:
            keys = {call.key for call in awaiting}
            calls = calls_of(reply)
            answered = [
                (call, answer)
                for call, answer in zip(calls, answers_to(calls, answers), strict=True)
                if answer is not None and call.key in keys
            ]
    batch = None if reply is None or history is None else (history, reply)
    results = results_of(guard, session, answered, tools, batch)
    if not (results or settle or claim):
        return ReplyStep(outcomes, session.stop)
    after = session.finish(results, settle=settle, claim=claim, earlier=earlier)
    return ReplyStep(outcomes, after if claim or isinstance(after, Stop) else None)


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


def ran_tool(
    guard: LoopGuard,
    handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    request: ToolCallRequest,
) -> ToolMessage | Command[Any]:
    """A tool node's run of `request` (`wrap_tool_call`'s `handler`): the tool's output, a
    handoff's answer naming where it went (`as_handoff`)."""
    return _handoff_marked(guard, handler(request), request)


async def aran_tool(
    guard: LoopGuard,
    handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    request: ToolCallRequest,
) -> ToolMessage | Command[Any]:
    """Async twin of `ran_tool`."""
    return _handoff_marked(guard, await handler(request), request)


def _handoff_marked(
    guard: LoopGuard, output: ToolMessage | Command[Any], request: ToolCallRequest
) -> ToolMessage | Command[Any]:
    try:
        metadata = None if request.tool is None else request.tool.metadata
        return cast("ToolMessage | Command[Any]", as_handoff(output, metadata))
    except Exception as error:  # a fault of the guard: the tool's output goes through
        guard.report_fault(None, error)
        return output
