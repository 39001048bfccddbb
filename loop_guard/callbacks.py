"""Loop guard callback handler: watches any runnable's model and tool events."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langgraph.errors import ParentCommand
from langgraph.types import Command
from typing_extensions import override

from loop_guard._conversation import ConversationKey, RunTree, session_for
from loop_guard._faces import attach_sinks, checked_guard
from loop_guard._guard import LoopGuard, Session
from loop_guard._langchain import (
    HANDOFF_KEY,
    answers_to,
    calls_of,
    error_result,
    hands_over,
    last_batch,
    result_of,
    stop_messages,
    tokens_of,
)
from loop_guard._messages import GUARD_NAME
from loop_guard._reply_watch import ReplyWatches, kept_out
from loop_guard._values import Call, LoopGuardStop, Result, Stop


class _StopIsNotAnError(logging.Filter):
    """Drops langchain-core's "Error in LoopGuardCallbackHandler.on_chat_model_start
    callback" warning for the handler's own stop (a subclass's too): the stop is how it
    ends a run on purpose, and the guard has logged it already. Every other record
    passes."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            isinstance(args, tuple)
            and len(args) == 3
            and args[1] in ("on_chat_model_start", "on_llm_new_token")
            and str(args[2]).startswith((f"{LoopGuardStop.__name__}(", f"{_GraphStop.__name__}("))
        )


class _GraphStop(ParentCommand):
    """Ends the run of a subgraph (a `Send` branch, a subagent) whose request the guard
    stopped, in place of its next model call: LangGraph gives the `Command` to the model
    node's task as that node's update (the stop message), and the subgraph ends there
    while its caller goes on."""


_QUIET_STOPS = _StopIsNotAnError()


def _ends_at_stop(prompt: list[BaseMessage]) -> bool:
    """Whether a model's prompt ends with the message of a request the guard stopped."""
    return bool(prompt) and isinstance(prompt[-1], AIMessage) and prompt[-1].name == GUARD_NAME


class LoopGuardCallbackHandler(RunTree, BaseCallbackHandler):
    """Track steps from a run's callbacks: model responses, tool starts, ends and errors.

    Attach it to any runnable with `config={"callbacks": [handler]}`. It observes: it
    groups each model response's tool calls into a batch, records every result, emits
    the guard's events, and ends the next model call once the request was stopped
    (raising `LoopGuardStop`; in a subgraph, such as a `Send` branch or a subagent, it
    ends that subgraph with the stop message instead, and its caller goes on). A reply
    that keeps repeating its own text counts as the middleware counts it (a steer,
    then blocks toward the stop), read from its tokens as it streams and whole once
    finished; it cannot be cut without ending the run, so a streaming reply is stopped
    only when it stops the request (`LoopGuardMiddleware` cuts it). A
    thread's state outlives a run (a resume after a pause), bounded by the guard's
    `max_conversations`. Blocking a call before it runs is the job of
    `guard_tools` and `LoopGuardNode`; combined with them, no step is counted twice.
    `LoopGuardMiddleware` keeps its own state and needs no handler.

    A conversation is the LangGraph thread (`configurable.thread_id`) narrowed to the
    graph a run is in, else the top-level run; a thread's requests start at each new
    user message.

    Args:
        guard: The `LoopGuard` holding the conversations' state.
        messages_key: The state key a subgraph's stop message is written under (as
            `LoopGuardNode(messages_key=...)`).

    Raises:
        ValueError: If `guard` is not a `LoopGuard` or `messages_key` is empty.

    Examples:
        ```python
        guard = LoopGuard()
        handler = LoopGuardCallbackHandler(guard)
        agent = create_agent(model, guard_tools(tools, guard))
        agent.invoke(inputs, {"callbacks": [handler], "configurable": {"thread_id": "1"}})
        ```
    """

    raise_error = True  # only the guard's stops escape: every other failure is reported
    run_inline = True  # cheap and thread-safe: no executor hop in async runs

    def __init__(self, guard: LoopGuard, *, messages_key: str = "messages") -> None:
        """Watch runs on behalf of `guard`."""
        guard = checked_guard(guard)
        if not isinstance(messages_key, str) or not messages_key:
            msg = f"messages_key must be a state key, got {messages_key!r}"
            raise ValueError(msg)
        super().__init__()
        self.guard = guard
        self.messages_key = messages_key
        attach_sinks(guard)
        logging.getLogger("langchain_core.callbacks.manager").addFilter(_QUIET_STOPS)
        # Per tool run: its session, its call, and the args it ran with (a call taken from
        # a restored state keeps no args; an error is read with the args it quotes masked).
        self._tools: dict[UUID, tuple[Session, Call, Any, bool]] = {}
        self._claiming = threading.Lock()
        # Per conversation: the calls of its latest responses a tool run answers already.
        self._claimed: OrderedDict[str, set[str]] = OrderedDict()
        # Per model run watched for repeated text: its task's namespace and its prompt,
        # for a stop that ends it.
        config = guard.config
        self._replies = ReplyWatches(config.repeated_text_chars)
        self._watched: dict[UUID, tuple[object, list[BaseMessage]]] = {}
        self._watches_text = config.enabled and config.detect_repeated_text

    @override
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: dict[str, Any] | Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Remember where the run sits in the tree of runs."""
        self.start(run_id, parent_run_id, metadata)

    @override
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Bring the conversation up to date; end the model call once it stopped."""
        self.start(run_id, parent_run_id, metadata)
        key = self.conversation_of(run_id)
        stop = None
        try:
            # A prompt that ends at the guard's stop goes on after a stopped request (an
            # agent run after a subagent's stop on the same messages): the response it
            # gets begins a new request, so the old stop ends nothing.
            if key is not None and messages and not _ends_at_stop(messages[0]):
                stop = session_for(self.guard, key, messages[0]).stop
        except Exception as error:
            self.guard.report_fault(str(key), error)
        task = (metadata or {}).get("langgraph_checkpoint_ns")
        if stop is not None:
            self.end(run_id)  # no error callback follows for this model run
            self._stop_run(key, task, messages[0], stop)
        if key is not None and self._watches_text and messages and not kept_out(kwargs.get("tags")):
            self._replies.start(run_id)
            self._watched[run_id] = (task, messages[0])

    @override
    def on_llm_new_token(
        self, token: Any, *, run_id: UUID, chunk: Any = None, **kwargs: Any
    ) -> None:
        """Watch a streaming reply for repeated text; stop it if that stops the request."""
        stop = None
        try:
            found = self._replies.feed(run_id, token)
            if found is not None:
                reply = getattr(chunk, "message", None)
                reply_id = getattr(reply, "id", None) or str(run_id)
                stop = self._repeated(run_id, reply_id, found.repeats, 0)
        except Exception as error:
            self.guard.report_fault(None, error)
        if stop is not None:
            task, prompt = self._watched.pop(run_id, (None, []))
            self._end(run_id)  # its error callback finds nothing left to forget
            self._stop_run(self.conversation_of(run_id), task, prompt, stop)

    def _repeated(self, run_id: UUID, reply_id: str, repeats: int, tokens: int) -> Stop | None:
        """Count a reply of the run that repeated its own text; the stop, if it stopped
        the request."""
        key = self.conversation_of(run_id)
        if key is None:
            return None
        after = self.guard.session(str(key)).repeated_text(reply_id, repeats, tokens)
        return after if isinstance(after, Stop) else None

    def _stop_run(self, key: object, task: object, prompt: list[BaseMessage], stop: Stop) -> None:
        """End a stopped request's model run: the subgraph it is in, or the whole run."""
        if isinstance(key, ConversationKey) and key.graph and isinstance(task, str):
            raise _GraphStop(self._stop_update(task, prompt, stop))
        raise LoopGuardStop(stop)

    def _stop_update(self, task: str, history: list[BaseMessage], stop: Stop) -> Command[Any]:
        """The update that ends a subgraph's stopped request, for the model node's task
        (`task`, its namespace): a "not run" answer to any call left unanswered, then
        the stop message."""
        ai_message, answers = last_batch(history)
        calls = calls_of(ai_message) if ai_message is not None else ()
        answered = [answer is not None for answer in answers_to(calls, answers)]
        ending = stop_messages(ai_message, answered, stop)
        return Command(graph=task, update={self.messages_key: ending})

    @override
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Declare the response's tool calls as one batch, in the model's order; count a
        reply that repeated its own text."""
        try:
            key = self.conversation_of(run_id)
            generation = response.generations[0][0] if response.generations else None
            message = generation.message if isinstance(generation, ChatGeneration) else None
            if key is not None and isinstance(message, AIMessage):
                found = self._replies.finished(run_id, message)
                if found is not None:
                    reply_id = message.id or str(run_id)
                    self._repeated(run_id, reply_id, found.repeats, tokens_of(message))
                if message.tool_calls:
                    session = self.guard.session(str(key))
                    session.open_batch(calls_of(message), tokens_of(message))
        except Exception as error:
            self.guard.report_fault(None, error)
        self._end(run_id)

    @override
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the failed model run."""
        self._end(run_id)

    @override
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Pair the tool run with the call it answers."""
        self.start(run_id, parent_run_id, metadata)
        key = self.conversation_of(run_id)
        try:
            if key is not None:
                session = self.guard.session(str(key))
                name = str((serialized or {}).get("name") or kwargs.get("name") or "")
                tool_call_id = kwargs.get("tool_call_id")
                call = self._claim(session, tool_call_id, name)
                args = inputs if inputs is not None else input_str
                if call is None:  # a call no response showed (a tool invoked directly)
                    call = Call.of(name, args, id=tool_call_id)
                # The model's args where the call still has them, as the other faces read;
                # a handoff's result is read from the history (`hands_over`).
                handoff = HANDOFF_KEY in (metadata or {})
                self._tools[run_id] = (
                    session,
                    call,
                    args if call.args is None else call.args,
                    handoff,
                )
        except Exception as error:
            self.guard.report_fault(str(key), error)

    @override
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the result."""
        self._record(run_id, output, None)

    @override
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the failure as an error result. A run stopped by control flow (an
        interrupt, a cancellation) has no result: its call stays open for the run that
        answers it (a resume, a re-run)."""
        tracked = self._tools.get(run_id)
        result = error_result(error, None if tracked is None else tracked[2])
        if result is None:
            self._release(run_id)
        else:
            self._record(run_id, None, result)

    @override
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the run; a finished top-level run outside a thread frees its conversation."""
        self._end(run_id)

    @override
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the run; a failed top-level run outside a thread frees its conversation."""
        self._end(run_id)

    def _claim(self, session: Session, tool_call_id: str | None, name: str) -> Call | None:
        """The call of the latest responses that this tool run answers: the first one with
        its tool-call id and tool that no run claimed yet (a provider may repeat ids, so
        the id alone does not tell)."""
        latest = session.latest_calls
        with self._claiming:
            # Claims outlive neither the latest responses nor the guard's conversations.
            keys = {call.key for call in latest}
            claimed = self._claimed.pop(session.conversation, set()) & keys
            self._claimed[session.conversation] = claimed
            while len(self._claimed) > self.guard.max_conversations:
                self._claimed.popitem(last=False)
            for call in latest:
                if (
                    call.id == (tool_call_id or "")
                    and call.tool == name
                    and call.key not in claimed
                ):
                    claimed.add(call.key)
                    return call
        return None

    def _release(self, run_id: UUID) -> None:
        """Forget a tool run that ended without a result, and give its call back: the run
        that answers it later (after a resume) claims it again."""
        tracked = self._tools.get(run_id)
        if tracked is not None:
            session, call, _, _ = tracked
            with self._claiming:
                self._claimed.get(session.conversation, set()).discard(call.key)
        self._end(run_id)

    def _record(self, run_id: UUID, output: Any, result: Result | None) -> None:
        tracked = self._tools.pop(run_id, None)
        try:
            if tracked is not None:
                session, call, args, handoff = tracked
                if session.awaits_result(call) and not (handoff or hands_over(output)):
                    if result is None:
                        normalizers = self.guard.config.normalizers(call.tool)
                        result = result_of(output, normalizers, args=args)
                    session.record_result(call, result)
        except Exception as error:
            self.guard.report_fault(None, error)
        self._end(run_id)

    def _end(self, run_id: UUID) -> None:
        self._tools.pop(run_id, None)
        self._replies.end(run_id)
        self._watched.pop(run_id, None)
        ended = self.end(run_id)
        if ended is not None and not ended.follows_history:
            # A top-level run outside any thread has ended: nothing can go on with its
            # conversation. A thread's stays (bounded by `max_conversations`), proving it is
            # current at the next look, so a resume after an interrupt keeps what a trimmed
            # history lost.
            with self._claiming:
                self._claimed.pop(str(ended), None)
            self.guard.session(str(ended)).end_request()
