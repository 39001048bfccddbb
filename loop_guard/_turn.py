"""One model turn of `LoopGuardMiddleware.wrap_model_call`: the model's calls until a reply
the guard lets through, and what the turn adds to the history.

Theory of operation. A turn is one state machine, `Turn`, whose `Mode` says what comes
next. It starts `CALLING`: the last batch's results are recorded (a due steer goes before
the model call) and the model is called. Its reply is decided by the session (`take`):

- nothing blocked, no stop: the turn is `DONE` (the common case);
- blocked in full: the blocks join the turn and the model is asked again (`REASKING`),
  so no other middleware acts on a reply that has nothing left to run; the requests that
  may block add up to the stop, so the re-asks are bounded (`calls_left`, set once);
- stopped: the reply's calls are answered and the stop ends the turn (`DONE`), or the
  model is asked for its final answer first (`FINAL_ANSWER`, `exit_behavior="answer"`);
  with `exit_behavior="ask"` the tool node asks a person instead;
- a reply that keeps repeating its own text is cut where the repetition began, and the
  session told: a cut reply that calls no tool is asked again.

The session is read from the state once and written back once (`outcome`); its decisions
are published once each, even when a retry or fallback around the guard runs the model call
again. Sync and async share the turn: the middleware's two hooks only call the model.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from enum import Enum, auto
from typing import Any, Generic, cast

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
from loop_guard._compaction import Compacted, compacted, tokens_kept_out
from loop_guard._faces import final_answer_failed, results_of, verdicts_of
from loop_guard._guard import LoopGuard
from loop_guard._judge import judge_messages, verdict_of
from loop_guard._langchain import (
    answer_request,
    answers_to,
    block_message,
    calls_of,
    earlier_runs,
    final_answer,
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
from loop_guard._values import Block, Proceed, Steer

logger = logging.getLogger("loop_guard")

_NOT_WATCHING: AbstractContextManager[None] = nullcontext()


class Mode(Enum):
    """What a turn does next."""

    CALLING = auto()
    """The model is to be called for the turn's reply (a due steer before it)."""
    REASKING = auto()
    """The reply was blocked in full, or cut with no call: the model is asked again."""
    FINAL_ANSWER = auto()
    """The request stopped: the model is asked for its final answer, with no tools."""
    DONE = auto()
    """The turn has its reply, or its end: no more model calls."""


class Turn(Generic[ResponseT]):
    """One model turn; see the module's theory of operation.

    The guard's hooks only look at the last AI message and what follows it, so once the
    turn has added a reply, the messages it added stand for the whole history (no copy of
    it per model call).
    """

    def __init__(
        self,
        guard: LoopGuard,
        request: ModelRequest[Any],
        tools: frozenset[str],
        *,
        exit_behavior: str,
        judge_every: int,
        compact_repeats: bool = False,
    ) -> None:
        self.guard = guard
        self.request = request
        self.exit_behavior = exit_behavior
        self.judge_every = judge_every
        self.compact_repeats = compact_repeats
        self._sent: Compacted | None = None  # the compacted request of the model call
        self.session = session_of(guard, request.state, request.runtime)
        self.history = messages_of(request.state)  # the history before this turn
        # Where earlier runs of a call are found when it recurs (`Engine.record_result`).
        self.earlier = earlier_runs(self.history, guard.config.normalizers)
        self._start = self.session.state  # the state read: changed when it is not this one
        self.tools = tools  # the names of the tools the request offers: others are missing
        self.mode = Mode.CALLING
        # Each reply blocked in full adds a block, and enough blocks stop the request
        # (`abort_threshold`, or more once a person let it go on): the bound on re-asks.
        state = self.session.state
        stops_at = max(guard.config.abort_threshold, state.rearm)
        self.calls_left = max(stops_at - state.blocks, 0) + 2
        self.added: list[BaseMessage] = []  # what the turn adds to the history, in order
        self.response: ModelResponse[ResponseT] | None = None  # the model's last response
        # What follows the last reply, applied after the result: a stop's answers and its
        # message (the model's final answer in its place, once given).
        self.ending: list[BaseMessage] = []
        self.final_question: HumanMessage | None = None  # what the final answer answers
        self.final_answered = False
        # The repetition a streaming reply was cut at (`cut_short`), for `take`; the ids of
        # the replies whose stream was read to its end and found clean.
        self._cut: Repetition | None = None
        self._read: set[str] = set()
        config = guard.config
        self.text_chars = config.repeated_text_chars
        self.watches_text = config.enabled and config.detect_repeated_text

    # --- the model calls ---------------------------------------------------------------

    def next_request(self) -> ModelRequest[Any] | None:
        """The model request to send now (a due steer added), or `None` when done."""
        match self.mode:  # in the order a healthy step meets them: done, then calling
            case Mode.DONE:
                return None
            case Mode.CALLING:
                if self._stopped_before():
                    return self.next_request()
                return self._model_request()
            case Mode.REASKING:
                return self._model_request()
            case Mode.FINAL_ANSWER:
                self.mode = Mode.DONE
                return self._final_request()

    def take(self, response: ModelResponse[ResponseT]) -> None:
        """Decide the model's reply (see the module's theory of operation)."""
        if self._sent is not None:
            self._decide(lambda _: self._count_kept_out(response.result))
        if self.final_question is not None:
            self._take_final(self._trimmed(response)[0])
            return
        response = self._without_repetition(response)
        self.response = response
        self._add(response.result)
        if self.session.stop is not None and self.ending:
            return  # the reply's repeated text stopped the request
        answers = self._decide(self._check_reply)
        if not answers:  # nothing blocked, no stop: the common case
            return
        stop = self.session.stop
        if stop is not None:
            if self.exit_behavior == "ask":
                return  # the tool node answers the calls, and asks about the stopping one
            self.ending = list(answers)
            if self.exit_behavior == "answer":
                self._ask_final_answer()
            return
        reply, _ = last_batch(response.result)
        blocks = sum(isinstance(answer, ToolMessage) for answer in answers)  # one per call
        if (
            reply is not None
            and reply.tool_calls
            and blocks == len(reply.tool_calls)
            and response.structured_response is None
            and self.calls_left > 0  # else the tool node answers them, as after a failure
        ):
            self._add(answers)
            self.mode = Mode.REASKING

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
        self.mode = Mode.DONE
        if self.final_question is not None:
            final_answer_failed(error)
            return True
        if self.response is None:
            return False
        logger.warning(
            "loop guard: asking the model again after a block failed (%s: %s); "
            "the model is asked on the next step",
            type(error).__name__,
            error,
        )
        last_reply = max(i for i, m in enumerate(self.added) if isinstance(m, AIMessage))
        del self.added[last_reply + 1 :]
        return True

    def outcome(self) -> ModelResponse[ResponseT] | ExtendedModelResponse[ResponseT]:
        """The model node's result: the turn's messages and the guard's new snapshot.

        A stop travels in the command, applied after the result: the result still ends
        with the model's last reply.
        """
        response = self.response
        update: dict[str, Any] = {"loop_guard": self.session.snapshot()}
        if response is None:  # stopped before this turn: its end is the whole result
            if not self.ending:  # never reached: the model is called, or the turn ends
                msg = "the model was not called"
                raise RuntimeError(msg)
            reply = ModelResponse(result=list(self.ending), structured_response=None)
            return ExtendedModelResponse(model_response=reply, command=Command(update=update))
        if self.session.state is self._start and self.added == response.result:
            return response  # the common case: nothing changed, nothing added
        reply = ModelResponse(result=self.added, structured_response=response.structured_response)
        if self.ending:
            update["messages"] = self.ending
        if self.final_answered:
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
        self._decide(lambda messages: self._record_results(messages, deliver=False))
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

    def _model_request(self) -> ModelRequest[Any]:
        """The model's request (a due steer added); the reply decides what comes next."""
        self.mode = Mode.DONE
        self.calls_left -= 1
        steer = self._decide(self._record_results)
        if steer:
            self._add(steer)
        if not self.added:
            return self.request
        messages = [*self.request.messages, *self.added]
        return self.request.override(messages=cast("list[AnyMessage]", messages))

    def _stopped_before(self) -> bool:
        """Whether the request stopped before this turn (a person, asked, chose to stop):
        the model is not called again, and the turn ends the request, with the model's
        own answer when the person asked for it."""
        stop = self.session.stop
        if stop is None:
            return False
        self.mode = Mode.DONE
        self.ending = [AIMessage(content=stop.message, name=_messages.GUARD_NAME)]
        _, answers = last_batch(self.history)
        if any(answer.response_metadata.get("loop_guard_end") == "answer" for answer in answers):
            self._ask_final_answer()
        return True

    def _ask_final_answer(self) -> None:
        stop = self.session.stop
        if stop is not None:
            self.final_question = answer_request(stop)
            self.mode = Mode.FINAL_ANSWER

    def _final_request(self) -> ModelRequest[Any] | None:
        """The request for the model's final answer: the history so far with the stop's
        answers and what the model is told, no tools, plain text."""
        if self.final_question is None:
            return None
        messages = [*self.request.messages, *self.added, *self.ending[:-1], self.final_question]
        return self.request.override(
            messages=cast("list[AnyMessage]", messages),
            tools=[],
            tool_choice=None,
            response_format=None,
        )

    def _take_final(self, response: ModelResponse[ResponseT]) -> None:
        """End the turn with the model's final answer in place of the guard's message,
        unless the reply calls a tool or says nothing."""
        answer = final_answer(response.result[-1] if response.result else None)
        if answer is not None and self.final_question is not None:
            self.ending = [*self.ending[:-1], self.final_question, answer]
            self.final_answered = True

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

    def _without_repetition(self, response: ModelResponse[ResponseT]) -> ModelResponse[ResponseT]:
        """`response` with its reply cut where it began repeating its own text, if it
        did; the guard told (a steer, a block, or the stop, which ends the turn), and a
        cut reply that calls no tool asked again."""
        response, repetition = self._trimmed(response)
        if repetition is None:
            return response
        reply = cast("AIMessage", response.result[-1])
        session = self.session
        try:
            session.repeated_text(
                reply.id or uuid.uuid4().hex, repetition.repeats, tokens_of(reply)
            )
            session.publish()
        except Exception as error:  # a fault of the guard: the cut reply goes on
            self.guard.report_fault(session.conversation, error)
        stop = session.stop
        if stop is not None:
            self.ending = list(stop_messages(reply, [False] * len(reply.tool_calls), stop))
            if self.exit_behavior == "answer":
                self._ask_final_answer()
        elif not reply.tool_calls and self.calls_left > 0:
            self.mode = Mode.REASKING  # asked again, the steer before it
        return response

    def _check_reply(self, messages: Sequence[BaseMessage]) -> list[AnyMessage] | None:
        """Decide the last reply's calls; the blocks and the stop, as messages.

        A call the reply answers itself (structured output: the agent answers an invalid
        one with its own retry message) never reaches a tool. It counts like any call,
        its answer being its result, so a model stuck on it is steered and stopped; but
        it gets no second answer from the guard.
        """
        message, given = last_batch(messages)
        if message is None or not message.tool_calls:
            return None
        session = self.session
        answers: list[AnyMessage] = []
        answered = []
        self_answered = []  # the calls the reply answered itself, with their answers
        for call, verdict, answer in verdicts_of(session, message, given):
            if answer is not None and isinstance(verdict, Proceed):
                self_answered.append((call, answer))
            elif answer is None and isinstance(verdict, Block):
                answers.append(block_message(call.id, call.tool, verdict.message))
            answered.append(answer is not None or isinstance(verdict, Block))
        for call, result in results_of(self.guard, session, self_answered, self.tools):
            session.record_result(call, result, self.earlier)
        stop = session.stop
        if stop is not None:
            answers.extend(stop_messages(message, answered, stop))  # ends with the stop
        return answers

    def _record_results(
        self, messages: Sequence[BaseMessage], *, deliver: bool = True
    ) -> list[AnyMessage] | None:
        """Record the last batch's results; a due steer as a message (also one due from
        calls the reply answered itself, recorded when it was decided), unless `deliver`
        is false (the steer stays due)."""
        session = self.session
        awaiting = {call.key for call in session.awaiting}
        message, answers = last_batch(messages)
        if (not awaiting or message is None) and not session.steer_pending:
            return None
        answered = []
        if awaiting and message is not None:
            # Read from the AI message, not the snapshot: the snapshot keeps no args.
            calls = calls_of(message)
            for call, answer in zip(calls, answers_to(calls, answers), strict=True):
                if answer is not None and call.key in awaiting:
                    answered.append((call, answer))
        batch = None if message is None else (messages, message)
        results = results_of(self.guard, session, answered, self.tools, batch)
        # Settled only where the batch's response is in sight; a stop is the reply's to
        # tell (`_check_reply`).
        after = session.finish(
            results,
            settle=bool(awaiting) and message is not None,
            claim=deliver,
            earlier=self.earlier,
        )
        if not isinstance(after, Steer) or not deliver:
            return []
        return [HumanMessage(content=after.message, name=_messages.GUARD_NAME)]

    def _decide(
        self, decide: Callable[[Sequence[BaseMessage]], list[AnyMessage] | None]
    ) -> list[AnyMessage] | None:
        """Run one of the turn's decisions on its messages; publish what the session
        decided, once even when a middleware around this one runs the model call again
        (a retry, a fallback model)."""
        # Once the turn has a reply, its messages stand for the history (see the class).
        messages = self.added if self.response is not None else self.history
        try:
            decided = decide(messages)
        except Exception as error:  # a fault of the guard: the agent goes on unguarded
            self.guard.report_fault(self.session.conversation, error)
            decided = None
        self.session.publish()
        return decided

    def _add(self, messages: Sequence[BaseMessage]) -> None:
        self.added.extend(messages)
