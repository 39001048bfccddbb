"""One model turn of `LoopGuardMiddleware.wrap_model_call`: the model's calls until a reply
the guard lets through, and what the turn adds to the history.

Theory of operation. A turn is one state machine, `Turn`, whose mode (`Mode`, a small
frozen record carrying its data) says what comes next, and which only `take` and
`next_request` change. It starts `Calling`: the last batch's results are recorded (a due
steer goes before the model call) and the model is called. Its reply is decided by the
session (`take`, through the reply step every face takes, `_faces.reply_step`):

- nothing blocked, no stop: the turn is `Done` (the common case);
- blocked in full: the blocks join the turn and the model is asked again
  (`Reasking(reasks_left)`), so no other middleware acts on a reply that has nothing left
  to run; the requests that may block add up to the stop, so the re-asks are bounded
  (counted down from the blocks left before the stop, read once);
- stopped: the reply's calls are answered and the stop ends the turn (`Done(ending)`), or
  the model is asked for its final answer first (`FinalAnswer(question, ending)`, with
  `exit_behavior="answer"`); with `exit_behavior="ask"` the tool node asks a person
  instead (`_exits` tells the behaviours apart);
- a reply that keeps repeating its own text is cut where the repetition began, and the
  session told: a cut reply that calls no tool is asked again.

The session is read from the state once and written back once (`outcome`); the stop is
read once per reply. Each decision is published once (`_Publishing`, around it), even
when a retry or fallback around the guard runs the model call again. Sync and async
share the turn: the middleware's two hooks only call the model.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeAlias, cast, final

from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ResponseT,
)
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command

from loop_guard import _messages
from loop_guard._agent_state import session_of
from loop_guard._ask import wants_answer
from loop_guard._compaction import Compacted, compacted, tokens_kept_out
from loop_guard._exits import ExitBehavior, FinalAnswer, asks_a_person, ends_with_answer
from loop_guard._faces import final_answer_failed, reply_step
from loop_guard._guard import LoopGuard, Session
from loop_guard._judge import judge_messages, verdict_of
from loop_guard._langchain import (
    block_message,
    earlier_runs,
    last_batch,
    messages_of,
    stop_messages,
    tokens_of,
)
from loop_guard._repeated_text import Repetition
from loop_guard._reply_watch import (
    Cutter,
    RepeatedTextCut,
    cut_reply,
    may_stream,
    repetition_in,
)
from loop_guard._values import Block, Steer, Stop

logger = logging.getLogger("loop_guard")

_NOT_WATCHING: AbstractContextManager[None] = nullcontext()


@final
@dataclass(frozen=True, slots=True)
class Calling:
    """The model is to be called for the turn's first reply (a due steer before it)."""


@final
@dataclass(frozen=True, slots=True)
class Reasking:
    """The reply was blocked in full, or cut with no call: the model is asked again, and
    may be asked `reasks_left` more times after this."""

    reasks_left: int


@final
@dataclass(frozen=True, slots=True)
class Done:
    """The turn has its reply, or its end: no more model calls. `ending` follows the
    last reply (a stop's answers and message, or the model's final answer in its place:
    `answered`)."""

    ending: tuple[BaseMessage, ...] = field(default=())
    answered: bool = False


Mode: TypeAlias = Calling | Reasking | FinalAnswer | Done
"""What a turn does next (`FinalAnswer`: the request stopped, and the model is asked for
its final answer, with no tools)."""

_CALLING = Calling()
_DONE = Done()


class _Publishing:
    """Around each of the turn's decisions: publish what the session decided (once even
    when a middleware around this one runs the model call again: a retry, a fallback
    model); a fault of the guard is reported, and the agent goes on unguarded."""

    __slots__ = ("guard", "session")

    def __init__(self, guard: LoopGuard, session: Session) -> None:
        self.guard = guard
        self.session = session

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        fault = isinstance(error, Exception)
        if fault:
            self.guard.report_fault(self.session.conversation, cast("Exception", error))
        self.session.publish()
        return fault


class Turn(Generic[ResponseT]):
    """One model turn; see the module's theory of operation.

    The guard's hooks only look at the last AI message and what follows it, so once the
    turn has added a reply, the messages it added stand for the whole history (no copy of
    it per model call). After `__init__` only the mode and the model call's own fields
    (what was sent, where its stream was cut or read) are set; `added` and `replies`
    grow.
    """

    def __init__(
        self,
        guard: LoopGuard,
        request: ModelRequest[Any],
        tools: frozenset[str],
        *,
        exit_behavior: ExitBehavior,
        judge_every: int,
        compact_repeats: bool = False,
    ) -> None:
        self.guard = guard
        self.request = request
        self.exit_behavior = exit_behavior
        self.judge_every = judge_every
        self.compact_repeats = compact_repeats
        self.session = session = session_of(guard, request.state, request.runtime)
        self.history = messages_of(request.state)  # the history before this turn
        # Where earlier runs of a call are found when it recurs (`Engine.record_result`).
        self.earlier = earlier_runs(self.history, guard.config.normalizers)
        self._start = session.state  # the state read: changed when it is not this one
        self.tools = tools  # the names of the tools the request offers: others are missing
        self.mode: Mode = _CALLING
        # Each reply blocked in full adds a block, and enough blocks stop the request
        # (`abort_threshold`, or more once a person let it go on): the bound on re-asks.
        state = session.state
        self.reasks = max(max(guard.config.abort_threshold, state.rearm) - state.blocks, 0)
        self.added: list[BaseMessage] = []  # what the turn adds to the history, in order
        self.replies: list[ModelResponse[ResponseT]] = []  # the model's responses, in order
        self._publishing = _Publishing(guard, session)
        # The model call's own fields: the compacted request sent; the repetition a
        # streaming reply was cut at (`cut_short`), for `take`; the ids of the replies
        # whose stream was read to its end and found clean.
        self._sent: Compacted | None = None
        self._cut: Repetition | None = None
        self._read: set[str] = set()
        config = guard.config
        self.text_chars = config.repeated_text_chars
        self.watches_text = config.enabled and config.detect_repeated_text

    # --- the model calls ---------------------------------------------------------------

    def next_request(self) -> ModelRequest[Any] | None:
        """The model request to send now (a due steer added), or `None` when done."""
        match self.mode:  # in the order a healthy step meets them: done, then calling
            case Done():
                return None
            case Calling():
                stop = self.session.stop
                if stop is not None:  # stopped before this turn: no more model calls
                    self.mode = self._stopped_before(stop)
                    return self.next_request()
                return self._model_request()
            case Reasking():
                return self._model_request()
            case FinalAnswer() as final_answer:
                return self._final_request(final_answer)

    def take(self, response: ModelResponse[ResponseT]) -> None:
        """Decide the model's reply: the turn's next mode (see the module's theory of
        operation)."""
        self.mode = self._next_mode(response)

    def ended_by(self, error: Exception) -> bool:
        """Whether a failed model call ends the turn with what it has (then ended).

        The first call's failure is the caller's: a retry or fallback around the guard
        runs the turn again. Asking again after a reply blocked in full is the guard's
        own doing: raising there would make such a middleware repeat the whole turn
        (the reply, its blocks, the failing call) until it gives up, throwing the blocks
        away. The turn ends instead with the blocked reply, its calls left to the tool
        node, which answers them with their blocks without running them: the model sees
        them on the next step, and the graph takes its usual way (no jump from the model
        back to the model, which agents without an `after_model` hook could not take
        before langchain 1.4). An interrupt always propagates.
        """
        if isinstance(error, GraphBubbleUp):
            return False
        match self.mode:
            case FinalAnswer():
                final_answer_failed(error)  # the turn ends with the guard's message
                return True
            case Reasking():
                logger.warning(
                    "loop guard: asking the model again after a block failed (%s: %s); "
                    "the model is asked on the next step",
                    type(error).__name__,
                    error,
                )
                last = max(i for i, m in enumerate(self.added) if isinstance(m, AIMessage))
                del self.added[last + 1 :]
                return True
            case Calling() | Done():
                return False

    def outcome(self) -> ModelResponse[ResponseT] | ExtendedModelResponse[ResponseT]:
        """The model node's result: the turn's messages and the guard's new snapshot.

        A stop travels in the command, applied after the result: the result still ends
        with the model's last reply.
        """
        ending: tuple[BaseMessage, ...] = ()
        answered = False
        match self.mode:
            case Done(ending=ending, answered=answered):
                pass
            case FinalAnswer(ending=ending):
                pass  # the final answer failed: the guard's message ends the request
            case Calling() | Reasking():
                pass  # nothing follows the last reply
        response = self.replies[-1] if self.replies else None
        update: dict[str, Any] = {"loop_guard": self.session.snapshot()}
        if response is None:  # stopped before this turn: its end is the whole result
            if not ending:  # never reached: the model is called, or the turn ends
                msg = "the model was not called"
                raise RuntimeError(msg)
            reply = ModelResponse(result=list(ending), structured_response=None)
            return ExtendedModelResponse(model_response=reply, command=Command(update=update))
        if self.session.state is self._start and self.added == response.result:
            return response  # the common case: nothing changed, nothing added
        reply = ModelResponse(result=self.added, structured_response=response.structured_response)
        if ending:
            update["messages"] = list(ending)
        if answered:
            # One more model call for `ModelCallLimitMiddleware`, whose `after_model`
            # counts this turn once; its counts exist from its first count on.
            for count in ("thread_model_call_count", "run_model_call_count"):
                value = self.request.state.get(count)
                if isinstance(value, int):
                    update[count] = value + 1
        return ExtendedModelResponse(model_response=reply, command=Command(update=update))

    def sending(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """What the model is sent of `request`: each repeat shown once when the turn
        compacts repeats (`_compaction`); the history keeps them all."""
        if not self.compact_repeats:
            return request
        sent = self._sent = compacted(request.messages)
        return request.override(messages=cast("list[AnyMessage]", sent.messages))

    def _count_kept_out(self, result: Sequence[BaseMessage]) -> None:
        """Tell the session what compacting the model call's request kept out: its
        characters, and its tokens at the rate of the input tokens the reply reports."""
        sent, self._sent = self._sent, None
        if sent is None or not sent.chars_kept_out:
            return
        reply = result[-1] if result else None
        sent_tokens = tokens_of(reply, "input_tokens") if isinstance(reply, AIMessage) else 0
        kept = sent.chars_kept_out
        self.session.kept_out(kept, tokens_kept_out(kept, sent.chars_sent, sent_tokens))

    # --- the judge ---------------------------------------------------------------------

    def question(self) -> list[BaseMessage] | None:
        """What the judge is to be asked before this turn's model call, if it is due
        (`Session.judge_due`): the history's recent calls and results, as data. The
        last batch's results are recorded first, its steer left for the model call."""
        with self._publishing:
            self._record_results(deliver=False)
        try:
            if not self.session.judge_due(self.judge_every):
                return None  # the common case
            return judge_messages(self.history)
        except Exception as error:  # a fault of the guard: no judgment this turn
            self.guard.report_fault(self.session.conversation, error)
            return None

    def judged(self, reply: object, failure: str) -> None:
        """Record the judge's answer: its verdict, or no progress found when it gave
        none (`failure` says why); a verdict of no progress makes a steer due, delivered
        with this turn's model call."""
        verdict = verdict_of(reply) if not failure else None
        if verdict is None:
            failure = failure or "no verdict in the judge's reply"
            logger.warning("loop guard: the judge gave no verdict (%s)", failure)
        tokens = tokens_of(reply) if isinstance(reply, AIMessage) else 0
        try:
            self.session.judged(
                progress=verdict is None or verdict.progress,
                tokens=tokens,
                reason=failure if verdict is None else verdict.reason,
            )
            self.session.publish()
        except Exception as error:  # a fault of the guard: no judgment this turn
            self.guard.report_fault(self.session.conversation, error)

    # --- repeated text -----------------------------------------------------------------

    def watching(self, request: ModelRequest[Any]) -> AbstractContextManager[Cutter | None]:
        """Around a model call: a streaming reply that begins repeating its own text is
        cut there (`RepeatedTextCut`, then `cut_short`). Middleware between the guard and
        the model may take the cut for a failure and answer otherwise (older langchain
        releases): the cut, kept by the `Cutter`, still wins."""
        if not self.watches_text or not may_stream(request.model):
            return _NOT_WATCHING  # a reply that does not stream is read whole
        return Cutter(self.text_chars, request.messages)

    def cut_short(self, cut: RepeatedTextCut) -> ModelResponse[ResponseT]:
        """The model's reply as it was when its stream was cut."""
        self._cut = cut.repetition
        return ModelResponse(result=[cut.reply], structured_response=None)

    def watched(
        self, response: ModelResponse[ResponseT], cutter: Cutter | None
    ) -> ModelResponse[ResponseT]:
        """The model call's response, as the cutter saw its stream: cut where its reply
        began repeating itself (found at its end, or a cut that middleware between the
        guard and the model took for a failure), or known clean (not read again)."""
        if cutter is None:
            return response
        if cutter.cut is not None:
            return self.cut_short(cutter.cut)
        self._read = cutter.read
        return response

    # --- the steps of a turn -------------------------------------------------------------

    def _next_mode(self, response: ModelResponse[ResponseT]) -> Mode:
        """What comes after the model's reply: decided by the session, read once."""
        if self._sent is not None:
            with self._publishing:
                self._count_kept_out(response.result)
        mode = self.mode
        if isinstance(mode, FinalAnswer):
            result = self._trimmed(response)[0].result
            ending = mode.ended_with(result[-1] if result else None)
            return Done(mode.ending) if ending is None else Done(ending, answered=True)
        response, repetition = self._trimmed(response)
        self.replies.append(response)
        self.added.extend(response.result)
        if repetition is not None:
            reply = cast("AIMessage", response.result[-1])
            after = None
            with self._publishing:
                after = self.session.repeated_text(
                    reply.id or uuid.uuid4().hex, repetition.repeats, tokens_of(reply)
                )
            if isinstance(after, Stop):  # the reply's repeated text stopped the request
                return self._ending(
                    after, stop_messages(reply, [False] * len(reply.tool_calls), after)
                )
            if not reply.tool_calls:
                return self._reasked()  # asked again, the steer before it
        answers: list[AnyMessage] = []
        stop = None
        with self._publishing:
            answers, stop = self._check_reply()
        if not answers:  # nothing blocked, no stop: the common case
            return _DONE
        if stop is not None:
            if asks_a_person(self.exit_behavior):
                return _DONE  # the tool node answers the calls, and asks about the stopping one
            return self._ending(stop, answers)
        last, _ = last_batch(response.result)
        blocks = sum(isinstance(answer, ToolMessage) for answer in answers)  # one per call
        if (
            last is not None
            and last.tool_calls
            and blocks == len(last.tool_calls)
            and response.structured_response is None
        ):
            mode = self._reasked()
            if isinstance(mode, Reasking):  # else the tool node answers them, as after a failure
                self.added.extend(answers)
            return mode
        return _DONE

    def _reasked(self) -> Reasking | Done:
        """The model asked again, while the re-asks last; else the turn done."""
        match self.mode:
            case Calling():
                return Reasking(self.reasks)
            case Reasking(reasks_left=left) if left > 0:
                return Reasking(left - 1)
        return _DONE

    def _ending(self, stop: Stop, ending: Sequence[BaseMessage]) -> FinalAnswer | Done:
        """A stopped request's end after the last reply: its messages, or the model's
        final answer in place of the guard's (`exit_behavior="answer"`)."""
        if ends_with_answer(self.exit_behavior):
            return FinalAnswer.of(stop, ending)
        return Done(tuple(ending))

    def _stopped_before(self, stop: Stop) -> FinalAnswer | Done:
        """The end of a request stopped before this turn (a person, asked, chose to stop):
        the model is not called again, and the turn ends the request, with the model's
        own answer when the person asked for it."""
        ending = (AIMessage(content=stop.message, name=_messages.GUARD_NAME),)
        if wants_answer(last_batch(self.history)[1]):
            return FinalAnswer.of(stop, ending)
        return Done(ending)

    def _model_request(self) -> ModelRequest[Any]:
        """The model's request (a due steer added); the reply decides what comes next."""
        steer = None
        with self._publishing:
            steer = self._record_results()
        if steer:
            self.added.extend(steer)
        if not self.added:
            return self.request
        messages = [*self.request.messages, *self.added]
        return self.request.override(messages=cast("list[AnyMessage]", messages))

    def _final_request(self, final_answer: FinalAnswer) -> ModelRequest[Any]:
        """The request for the model's final answer: the history so far with the stop's
        answers and what the model is told, no tools, plain text."""
        messages = final_answer.prompt([*self.request.messages, *self.added])
        return self.request.override(
            messages=cast("list[AnyMessage]", messages),
            tools=[],
            tool_choice=None,
            response_format=None,
        )

    def _trimmed(
        self, response: ModelResponse[ResponseT]
    ) -> tuple[ModelResponse[ResponseT], Repetition | None]:
        """`response` with its reply cut where it began repeating its own text, and where
        that was; as it is, and `None`, when it did not."""
        repetition, self._cut = self._cut, None
        if not self.watches_text or not response.result:
            return response, None
        reply = response.result[-1]
        if not isinstance(reply, AIMessage) or reply.name == _messages.GUARD_NAME:
            return response, None
        if repetition is None and reply.id in self._read:
            return response, None  # its stream was read to its end
        try:
            repetition = repetition or repetition_in(reply, self.text_chars)
            if repetition is None:
                return response, None  # the common case
            result = [*response.result[:-1], cut_reply(reply, repetition)]
        except Exception as error:  # a fault of the guard: the reply goes on as it is
            self.guard.report_fault(self.session.conversation, error)
            return response, None
        cut = ModelResponse(result=result, structured_response=response.structured_response)
        return cut, repetition

    def _check_reply(self) -> tuple[list[AnyMessage], Stop | None]:
        """Decide the last reply's calls (the reply step); the blocks and the stop, as
        messages, and the stop.

        A call the reply answers itself (structured output: the agent answers an invalid
        one with its own retry message) never reaches a tool. It counts like any call,
        its answer being its result, so a model stuck on it is steered and stopped; but
        it gets no second answer from the guard.
        """
        message, given = last_batch(self.added)
        if message is None or not message.tool_calls:
            return [], None
        step = reply_step(
            self.guard,
            self.session,
            message,
            given,
            settle=False,
            claim=False,
            tools=self.tools,
            earlier=self.earlier,
        )
        answers: list[AnyMessage] = [
            block_message(outcome.call.id, outcome.call.tool, outcome.verdict.message)
            for outcome in step.calls
            if outcome.answer is None and isinstance(outcome.verdict, Block)
        ]
        stop = step.after if isinstance(step.after, Stop) else None
        if stop is not None:
            answered = [
                outcome.answer is not None or isinstance(outcome.verdict, Block)
                for outcome in step.calls
            ]
            answers.extend(stop_messages(message, answered, stop))  # ends with the stop
        return answers, stop

    def _record_results(self, *, deliver: bool = True) -> list[AnyMessage] | None:
        """Record the last batch's results (the reply step, on a reply decided before); a
        due steer as a message (also one due from calls the reply answered itself,
        recorded when it was decided), unless `deliver` is false (the steer stays due)."""
        # Once the turn has a reply, its messages stand for the history (see the class).
        messages = self.added if self.replies else self.history
        session = self.session
        awaiting = session.awaiting
        message, answers = last_batch(messages)
        if (not awaiting or message is None) and not session.steer_pending:
            return None
        # Settled only where the batch's response is in sight; a stop is the reply's to
        # tell (`_check_reply`).
        step = reply_step(
            self.guard,
            session,
            message,
            answers,
            awaiting=awaiting,
            settle=bool(awaiting) and message is not None,
            claim=deliver,
            tools=self.tools,
            history=messages,
            earlier=self.earlier,
        )
        if not isinstance(step.after, Steer):
            return []
        return [HumanMessage(content=step.after.message, name=_messages.GUARD_NAME)]
