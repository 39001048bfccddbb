"""Reading LangChain messages, tool calls and configs into the engine's terms.

Shared by every adapter, so each one reads a tool call, a tool result, a conversation
and a request the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.callbacks.manager import dispatch_custom_event
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from loop_guard import _messages
from loop_guard._engine import Engine, RequestState
from loop_guard._guard import GuardEvent
from loop_guard._messages import GUARD_NAME
from loop_guard._values import Call, Decision, Proceed, Result, Stop

STEER_MARK = "steer"
"""`response_metadata["loop_guard"]` of a tool result that carries the steer in-band."""

BLOCK_MARK = "blocked"
"""`response_metadata["loop_guard"]` of a tool result written by the guard instead of a run."""

RESULT_KEY = "loop_guard_result"
"""`response_metadata` key of a steered tool result: the fingerprint of what the tool returned."""


def dispatch_event(event: GuardEvent) -> None:
    """Publish a guard event as the LangChain custom event `loop_guard`.

    It then shows in `astream_events(version="v2")` and in tracing, under the run the
    event happened in. Outside any run there is nowhere to publish it, so nothing is.
    """
    payload = {
        "kind": event.kind,
        "conversation": event.conversation,
        "tool": event.tool,
        "args": event.args,
        "streak": event.streak,
        "blocks": event.blocks,
        "message": event.message,
    }
    try:
        dispatch_custom_event(GUARD_NAME, payload)
    except RuntimeError:
        return  # not inside a run (the engine used on its own)


def call_of(tool_call: ToolCall) -> Call:
    """The engine's `Call` for a model's tool call."""
    return Call.of(tool_call["name"], tool_call.get("args", {}), id=tool_call.get("id"))


def result_of(output: Any) -> Result:
    """The engine's `Result` for what a tool produced.

    A `ToolMessage` (what agents see), a `Command` (its tool message), or a raw return
    value (a tool invoked without a tool call).
    """
    if isinstance(output, ToolMessage):
        is_error = output.status == "error"
        recorded = output.response_metadata.get(RESULT_KEY)
        if isinstance(recorded, str):  # a steered result: what the tool itself returned
            return Result(fingerprint=recorded, is_error=is_error)
        return Result.of(output.content, is_error=is_error)
    if isinstance(output, Command):
        update = output.update
        messages = update.get("messages", []) if isinstance(update, dict) else []
        tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
        if tool_messages:
            return result_of(tool_messages[-1])
        return Result.of({"command": repr(update), "goto": repr(output.goto)})
    return Result.of(output)


def error_result(error: BaseException) -> Result:
    """The `Result` of a tool that raised: an error with the exception's type and text."""
    return Result.of(f"{type(error).__name__}: {error}", is_error=True)


def current_request(messages: Sequence[BaseMessage]) -> tuple[str | None, Sequence[BaseMessage]]:
    """The id of the request's user message and the messages from it on.

    A request begins with a user message; messages the guard inserted never count.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and message.name != GUARD_NAME:
            return message.id, messages[index:]
    return None, messages


def thread_key(config: RunnableConfig | None) -> str | None:
    """The conversation key of a LangGraph thread: its id, plus the graph's namespace.

    The namespace keeps a subgraph (a subagent) apart from its parent on one thread.
    """
    if not config:
        return None
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    thread = configurable.get("thread_id", metadata.get("thread_id"))
    if thread is None:
        return None
    return _with_namespace(str(thread), metadata)


def thread_key_of_metadata(metadata: Mapping[str, Any] | None) -> str | None:
    """`thread_key` for a callback's run metadata."""
    if not metadata or metadata.get("thread_id") is None:
        return None
    return _with_namespace(str(metadata["thread_id"]), metadata)


def _with_namespace(thread: str, metadata: Mapping[str, Any]) -> str:
    namespace = str(metadata.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns") or "")
    graph = namespace.rpartition("|")[0]  # drop the running node's own segment
    return f"{thread}|{graph}" if graph else thread


def last_batch(messages: Sequence[BaseMessage]) -> tuple[AIMessage | None, list[ToolMessage]]:
    """The last AI message and the tool messages after it."""
    answers: list[ToolMessage] = []
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message, answers[::-1]
        if isinstance(message, ToolMessage):
            answers.append(message)
    return None, answers[::-1]


Observer = Callable[[Call, Sequence[Decision]], object]
"""Receives each replayed call with the decisions it led to (for the offline scan)."""


def replay(
    engine: Engine,
    request_id: str | None,
    messages: Sequence[BaseMessage],
    observe: Observer | None = None,
) -> RequestState:
    """Rebuild a request's state from its messages, as if the guard had watched it live.

    The engine is deterministic, so checking the recorded calls again reproduces the
    blocks that were made (a call it blocks is not counted, whatever the history says
    it returned). A steer is taken as delivered once the model was called after it or
    it was written into a tool result.
    """
    state = RequestState(request_id=request_id)
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage) or not message.tool_calls:
            continue
        calls = [call_of(tool_call) for tool_call in message.tool_calls]
        state, decisions = engine.open_batch(state, calls)
        for call in calls:
            answer = answers.get(call.id)
            if answer is None:
                continue  # still running: the live adapter checks it
            state, verdict, checked = engine.check_call(state, call)
            decisions = (*decisions, *checked)
            if isinstance(verdict, Proceed):
                state, recorded = engine.record_result(state, call, result_of(answer))
                decisions = (*decisions, *recorded)
            if observe is not None and decisions:
                observe(call, decisions)
            decisions = ()
        later = messages[index + 1 :]
        delivered = any(isinstance(m, AIMessage) for m in later) or any(
            answers.get(call.id) is not None and is_marked(answers[call.id], STEER_MARK)
            for call in calls
        )
        if delivered:
            state, _ = engine.take_steer(state)
    return state


def block_message(tool_call_id: str, tool: str, text: str) -> ToolMessage:
    """The error tool result the guard writes for a call it did not let run."""
    return ToolMessage(
        content=text,
        tool_call_id=tool_call_id,
        name=tool,
        status="error",
        response_metadata={"loop_guard": BLOCK_MARK},
    )


def stop_messages(
    ai_message: AIMessage | None, answered: set[str], stop: Stop
) -> list[ToolMessage | AIMessage]:
    """How a stopped request ends: every unanswered call of the last response gets a
    "not run" result, then a final message tells the user why (the history stays valid).
    """
    pending = [
        block_message(tool_call["id"] or "", tool_call["name"], _messages.not_run_text())
        for tool_call in (ai_message.tool_calls if ai_message is not None else ())
        if tool_call["id"] not in answered
    ]
    return [*pending, AIMessage(content=stop.message, name=GUARD_NAME)]


def messages_of(state: Any, key: str = "messages") -> Sequence[BaseMessage]:
    """The messages of a graph state: a `MessagesState`-like mapping, object or list."""
    messages = state.get(key, ()) if isinstance(state, Mapping) else getattr(state, key, state)
    return messages if isinstance(messages, Sequence) else ()


def is_marked(message: BaseMessage, mark: str) -> bool:
    """Whether the guard marked this message (`BLOCK_MARK` or `STEER_MARK`)."""
    return message.response_metadata.get("loop_guard") == mark
