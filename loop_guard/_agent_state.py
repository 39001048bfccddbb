"""The guard's part of a `create_agent` agent's state: its schema, and the session a hook or
a tool call reads from it.

The snapshot under `"loop_guard"` is the truth of the request (checkpointed with the
thread); the session a hook gets is that snapshot's, in the conversation the run's config
names. Everything here reads the state; deciding is the session's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Annotated, Any, cast

from langchain.agents.middleware.types import AgentState, PrivateStateAttr, ResponseT
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from typing_extensions import NotRequired

from loop_guard._conversation import ConversationKey, thread_key, thread_of
from loop_guard._guard import LoopGuard, Session
from loop_guard._history import rebuild
from loop_guard._langchain import (
    call_keys,
    calls_of,
    keys_of,
    last_batch,
    messages_of,
    position_of,
    tokens_of,
)
from loop_guard._state import RequestState
from loop_guard._values import Call


class LoopGuardState(AgentState[ResponseT]):
    """State schema for `LoopGuardMiddleware`.

    Extends `AgentState` with the guard's per-request state, a JSON-safe snapshot kept
    in the thread's checkpoint, so a thread resumed in another process continues
    exactly. It is reset at the start of every request. Its type parameter, `ResponseT`,
    is the type of the structured response (`Any` by default).

    Examples:
        >>> "loop_guard" in LoopGuardState.__annotations__
        True
    """

    loop_guard: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


def session_of(guard: LoopGuard, state: Mapping[str, Any], runtime: object) -> Session:
    """The guard's session on `state`'s snapshot, in the conversation `runtime` names.

    A snapshot an earlier version wrote is read again from the history: its steps were
    fingerprinted by that version's rules (0.1.0 read "Error: ..." as a success, and
    masked no fresh values), which today's results would never equal, so each pause it
    made would cost one more run. Its request id stays (the request goes on). Versions
    that decided a reply in an `after_model` node could checkpoint a reply before
    deciding it (human approval listed after the guard, a pause after the model): such a
    reply is decided here, so that its calls count.
    """
    session = guard.session(
        conversation_of(state, runtime),
        state.get("loop_guard") or {},  # `{}`: still the caller's state to keep, fresh
        call_keys=lambda: call_keys(messages_of(state)),
    )
    if session.migrated:
        messages = messages_of(state)
        if guard.config.enabled:
            try:
                session.catch_up(lambda held: _from_history(guard, held, messages))
            except Exception as error:  # a fault of the guard: the snapshot as migrated stands
                guard.report_fault(session.conversation, error)
        reply, _ = last_batch(messages)
        if reply is not None and reply.tool_calls and not session.checked(keys_of(reply)):
            session.check_batch(calls_of(reply), tokens_of(reply))
    return session


def _from_history(
    guard: LoopGuard, held: RequestState | None, messages: Sequence[BaseMessage]
) -> RequestState:
    """The request's state as today's guard reads it from the history, under the id of
    the request `held` was."""
    rebuilt = rebuild(guard._engine, messages, tools=guard.tool_names)
    return rebuilt if held is None else replace(rebuilt, request_id=held.request_id)


def conversation_of(state: Mapping[str, Any], runtime: object) -> str:
    """The thread (narrowed to the agent's graph) when there is one, else this request."""
    info = getattr(runtime, "execution_info", None)
    if info is not None and not isinstance(getattr(runtime, "config", None), Mapping):
        # A hook's runtime (see `config_of`), read without making a config.
        key = None if info.thread_id is None else thread_key(info.thread_id, info.checkpoint_ns)
    else:
        thread = thread_of(config_of(runtime))
        key = None if thread is None else str(thread)
    if key is None:
        request_id = (state.get("loop_guard") or {}).get("request_id")
        return str(ConversationKey("request", str(request_id)))
    return key


def config_of(runtime: object) -> RunnableConfig | None:
    """The run's config: a tool's runtime holds it; a hook's runtime names its thread
    and namespace in its execution info. The context's config is the last resort (older
    LangGraph): in async code on Python 3.10 it is missing, or a caller's (an agent run
    inside an async tool would see the tool's), as tasks get no context there."""
    config = getattr(runtime, "config", None)
    if isinstance(config, Mapping):
        return cast("RunnableConfig", config)
    info = getattr(runtime, "execution_info", None)
    if info is not None:
        if info.thread_id is None:
            return None
        return {"configurable": {"thread_id": info.thread_id, "checkpoint_ns": info.checkpoint_ns}}
    try:
        return get_config()
    except RuntimeError:
        return None


def call_of(request: ToolCallRequest) -> Call | None:
    """The call a tool call is, in its reply (`None` when the history does not hold it)."""
    placed = placed_call(request)
    return None if placed is None else placed[0][placed[1]]


def placed_call(request: ToolCallRequest) -> tuple[Sequence[Call], int] | None:
    """The calls of the reply a tool call belongs to, and its position among them."""
    message, _ = last_batch(messages_of(request.state))
    if message is None:
        return None
    tool_call = request.tool_call
    position = position_of(message, tool_call.get("id"), tool_call["name"], tool_call.get("args"))
    return None if position is None else (calls_of(message), position)


def with_snapshot(output: ToolMessage | Command[Any], session: Session) -> Command[Any]:
    """A tool's output, with the guard's snapshot of a request a person let go on."""
    snapshot = session.snapshot()
    if not isinstance(output, Command):
        return Command(update={"messages": [output], "loop_guard": snapshot})
    if output.update is not None and not isinstance(output.update, Mapping):
        return output  # an update as a list of writes: the tool's own, kept as it is
    update = {**(output.update or {}), "loop_guard": snapshot}
    return Command(graph=output.graph, update=update, resume=output.resume, goto=output.goto)
