"""Loop guard callback handler: watches any runnable's model and tool events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableConfig
from typing_extensions import override

from loop_guard._guard import LoopGuard
from loop_guard._langchain import (
    calls_of,
    current_request,
    dispatch_event,
    error_result,
    result_of,
    thread_key,
    thread_key_of_metadata,
    up_to_date,
    within_graph,
)
from loop_guard._values import Call, LoopGuardAbort, Result


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
            and args[1] == "on_chat_model_start"
            and str(args[2]).startswith(f"{LoopGuardAbort.__name__}(")
        )


_QUIET_STOPS = _StopIsNotAnError()


class LoopGuardCallbackHandler(BaseCallbackHandler):
    """Track steps from a run's callbacks: model responses, tool starts, ends and errors.

    Attach it to any runnable with `config={"callbacks": [handler]}`. It observes: it
    groups each model response's tool calls into a batch, records every result, emits
    the guard's events, and refuses the next model call once the request was stopped
    (raising `LoopGuardAbort`). Blocking a call before it runs is the job of
    `guard_tools` and `LoopGuardNode`; combined with them, no step is counted twice.
    `LoopGuardMiddleware` keeps its own state and needs no handler.

    A conversation is the LangGraph thread (`configurable.thread_id`), else the
    top-level run; a thread's requests start at each new user message.

    Args:
        guard: The `LoopGuard` holding the conversations' state.

    Example:
        ```python
        guard = LoopGuard()
        handler = LoopGuardCallbackHandler(guard)
        agent = create_agent(model, guard_tools(tools, guard))
        agent.invoke(inputs, {"callbacks": [handler], "configurable": {"thread_id": "1"}})
        ```
    """

    raise_error = True  # only LoopGuardAbort escapes: every other failure is reported
    run_inline = True  # cheap and thread-safe: no executor hop in async runs

    def __init__(self, guard: LoopGuard) -> None:
        """Watch runs on behalf of `guard`."""
        given: object = guard  # checked at run time: callers may be untyped
        if not isinstance(given, LoopGuard):
            msg = f"guard must be a LoopGuard, got {type(given).__name__}"
            raise ValueError(msg)
        self.guard = guard
        guard.subscribe(dispatch_event)
        logging.getLogger("langchain_core.callbacks.manager").addFilter(_QUIET_STOPS)
        self._parents: dict[UUID, UUID | None] = {}
        self._conversations: dict[UUID, str] = {}
        self._tools: dict[UUID, tuple[str, Call]] = {}
        self._claimed: dict[str, set[str]] = {}  # per conversation: calls a tool run answers
        self._lock = threading.Lock()

    def conversation_of(self, run_id: UUID | None) -> str | None:
        """The conversation a live run belongs to: its thread, else its top-level run."""
        with self._lock:
            while run_id is not None:
                if run_id in self._conversations:
                    return self._conversations[run_id]
                parent = self._parents.get(run_id, run_id)
                if parent == run_id:
                    return None  # a run this handler never saw
                if parent is None:
                    return f"run:{run_id}"
                run_id = parent
        return None

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
        self._start(run_id, parent_run_id, metadata)

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
        """Announce the request the model is answering; refuse the call once it stopped."""
        conversation = self._start(run_id, parent_run_id, metadata)
        stop = None
        try:
            if conversation is not None and messages:
                announce(self.guard, conversation, messages[0])
                stop = self.guard.stop_of(conversation)
        except Exception as error:
            self.guard.report_fault(conversation, error)
        if stop is not None:
            raise LoopGuardAbort(stop)

    @override
    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Declare the response's tool calls as one batch, in the model's order."""
        try:
            conversation = self.conversation_of(run_id)
            generation = response.generations[0][0] if response.generations else None
            if (
                conversation is not None
                and isinstance(generation, ChatGeneration)
                and isinstance(generation.message, AIMessage)
            ):
                calls = calls_of(generation.message)
                if calls:
                    self.guard.open_batch(conversation, calls)
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
        """Remember the call, to pair it with its result."""
        conversation = self._start(run_id, parent_run_id, metadata)
        try:
            if conversation is not None:
                name = str((serialized or {}).get("name") or kwargs.get("name") or "")
                args = inputs if inputs is not None else input_str
                tool_call_id = kwargs.get("tool_call_id")
                with self._lock:
                    call = self._claim(conversation, tool_call_id, name)
                    if call is None:  # a call no response of this run showed
                        call = Call.of(name, args, id=tool_call_id)
                    self._tools[run_id] = (conversation, call)
        except Exception as error:
            self.guard.report_fault(conversation, error)

    @override
    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the result."""
        self._record(run_id, output, None)

    @override
    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record the failure as an error result."""
        self._record(run_id, None, error_result(error))

    @override
    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the run; a finished top-level run frees its conversation."""
        self._end(run_id)

    @override
    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the run; a failed top-level run frees its conversation."""
        self._end(run_id)

    def _start(
        self, run_id: UUID, parent_run_id: UUID | None, metadata: dict[str, Any] | None
    ) -> str | None:
        with self._lock:
            self._parents[run_id] = parent_run_id
            key = thread_key_of_metadata(metadata)
            if key is None and metadata and parent_run_id is not None:
                # Outside a thread, a subgraph's runs (an agent run inside a tool) are a
                # conversation of their own within the top-level run.
                top = parent_run_id
                while (parent := self._parents.get(top)) is not None:
                    top = parent
                graph = within_graph(f"run:{top}", metadata.get("langgraph_checkpoint_ns"))
                key = None if graph == f"run:{top}" else graph
            if key is not None:
                self._conversations[run_id] = key
        return self.conversation_of(run_id)

    def _claim(self, conversation: str, tool_call_id: str | None, name: str) -> Call | None:
        """The call of the latest responses that this tool run answers: the first one with
        its tool-call id and tool that no run claimed yet (a provider may repeat ids, so
        the id alone does not tell)."""
        claimed = self._claimed.setdefault(conversation, set())
        for call in self.guard.latest_calls(conversation):
            if call.id == (tool_call_id or "") and call.tool == name and call.key not in claimed:
                claimed.add(call.key)
                return call
        return None

    def _record(self, run_id: UUID, output: Any, result: Result | None) -> None:
        with self._lock:
            tracked = self._tools.pop(run_id, None)
        try:
            if tracked is not None:
                conversation, call = tracked
                if result is None:
                    result = result_of(output, self.guard.config.normalizers(call.tool))
                self.guard.record_result(conversation, call, result)
        except Exception as error:
            self.guard.report_fault(None, error)
        self._end(run_id)

    def _end(self, run_id: UUID) -> None:
        with self._lock:
            parent = self._parents.pop(run_id, None)
            conversation = self._conversations.pop(run_id, None)
            self._tools.pop(run_id, None)
        if parent is None:
            # A top-level run has ended: free its conversation. A thread that goes on later
            # (a new request, or a resume after an interrupt) is rebuilt from its history.
            ended = conversation or f"run:{run_id}"
            with self._lock:
                self._claimed.pop(ended, None)
            self.guard.end_request(ended)


def announce(guard: LoopGuard, conversation: str, messages: Sequence[BaseMessage]) -> None:
    """Bring the conversation's state up to date with its history (`up_to_date`).

    A top-level run outside a thread is a single request seen from its start, so there
    is nothing to catch up on.
    """
    if conversation.startswith("run:") or not guard.config.enabled:
        return
    guard.catch_up(conversation, lambda held: up_to_date(guard.engine, held, messages))


def conversation_for(
    guard: LoopGuard, config: RunnableConfig | None, messages: Sequence[BaseMessage]
) -> str | None:
    """The conversation key for a node or tool: the same one the handler would use.

    The thread when there is one; else the top-level run, when a handler for this
    guard is attached; else the request's user message.
    """
    thread = thread_key(config)
    if thread is not None:
        return thread
    found = handler_for(guard, config)
    if found is not None:
        handler, callbacks = found
        return handler.conversation_of(callbacks.parent_run_id)
    request_id, _ = current_request(messages)
    return None if request_id is None else f"request:{request_id}"


def handler_for(
    guard: LoopGuard, config: RunnableConfig | None
) -> tuple[LoopGuardCallbackHandler, BaseCallbackManager] | None:
    """The handler watching this run for `guard`, if one is attached, and its manager."""
    callbacks = (config or {}).get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        for handler in callbacks.handlers:
            if isinstance(handler, LoopGuardCallbackHandler) and handler.guard is guard:
                return handler, callbacks
    return None
