"""Loop guard tool wrapper: tools that ask the guard before they run."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final, overload

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.prebuilt import ToolRuntime
from langgraph.prebuilt.tool_node import _get_all_injected_args
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict
from typing_extensions import assert_never, override

from loop_guard._conversation import conversation_for, session_for, watched
from loop_guard._faces import ashared_run, attach_sinks, checked_guard, reply_step, shared_run
from loop_guard._guard import LoopGuard, Session
from loop_guard._langchain import (
    BLOCK_MARK,
    RESULT_KEY,
    STATE_KEY,
    STEER_MARK,
    as_handoff,
    error_result,
    hands_over,
    last_batch,
    messages_of,
    position_of,
    result_of,
    result_record,
    tool_message_of,
    with_tool_message,
)
from loop_guard._values import Block, Call, LoopGuardStop, Proceed, Result, Stop

RUNTIME_ARG = "loop_guard_runtime"
"""The injected argument through which `ToolNode` hands a guarded tool the graph state."""

_block_message: contextvars.ContextVar[str] = contextvars.ContextVar("loop_guard_block")


@final
@dataclass(frozen=True, slots=True)
class _Decision:
    """What the wrapper decided for one invocation, and what it needs afterwards."""

    blocked: str | None  # the block message when the call must not run
    session: Session | None  # None: outside any conversation, untracked
    call: Call | None
    input: Any  # the input for the wrapped tool, without the guard's injected argument
    siblings: tuple[Call, ...] = ()  # the calls of the same response, in model order
    watched: bool = False  # a `LoopGuardCallbackHandler` for this guard watches the run


class GuardedTool(BaseTool):
    """A tool that behaves exactly like the one it wraps, except that the guard may block
    a repeated call: then the tool body does not run and the model gets an error result
    with the reason (raised as a `ToolException` that this tool turns into a message).

    Built by `guard_tools`; see there.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    guard: LoopGuard
    deliver_steer: bool | None = None  # None: unless a `LoopGuardNode` steers the conversation
    messages_key: str = "messages"
    runtime_arg: str = RUNTIME_ARG
    handle_tool_error: bool = True  # a block must never crash the run

    @functools.cached_property
    def _model_arg_names(self) -> frozenset[str]:
        schema = self.inner.tool_call_schema
        if isinstance(schema, dict):
            return frozenset(schema.get("properties", {}))
        fields = getattr(schema, "model_fields", None)
        if fields is None:  # a pydantic 1 model; a pydantic 2 one warns on `__fields__`
            fields = getattr(schema, "__fields__", {})
        return frozenset(fields)

    @property
    def func(self) -> Any:
        """The wrapped tool's function: `ToolNode` reads its injected arguments."""
        return getattr(self.inner, "func", None)

    @property
    def coroutine(self) -> Any:
        """The wrapped tool's coroutine, likewise."""
        return getattr(self.inner, "coroutine", None)

    @property
    @override
    def tool_call_schema(self) -> Any:
        """The model-facing schema: exactly the wrapped tool's."""
        return self.inner.tool_call_schema

    @override
    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        """The wrapped tool's input schema, plus the runtime the guard needs injected."""
        schema = self.inner.get_input_schema(config)
        if self.runtime_arg != RUNTIME_ARG or not issubclass(schema, BaseModel):
            return schema  # the tool's own runtime argument serves, or it cannot be extended
        return _with_runtime_field(schema)

    @override
    def invoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the wrapped tool, unless the guard blocks the call."""
        decision = self._decide(input, config)
        if decision.blocked is not None:
            with _blocking(decision.blocked):
                output = super().invoke(decision.input, config, **kwargs)
            return _with_record(_marked(output, BLOCK_MARK), decision.session)
        with self._recording_failure(decision):
            output = self._run_once(
                decision, lambda: self.inner.invoke(decision.input, config, **kwargs)
            )
        return self._after(decision, output)

    @override
    async def ainvoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        """Async twin of `invoke`: the wrapped tool's own async path runs."""
        decision = self._decide(input, config)
        if decision.blocked is not None:
            with _blocking(decision.blocked):
                output = await super().ainvoke(decision.input, config, **kwargs)
            return _with_record(_marked(output, BLOCK_MARK), decision.session)
        with self._recording_failure(decision):
            output = await self._arun_once(
                decision, lambda: self.inner.ainvoke(decision.input, config, **kwargs)
            )
        return self._after(decision, output)

    def _run_once(self, decision: _Decision, produce: Callable[[], Any]) -> Any:
        """Run the tool; an identical sibling may share its run (`dedupe_siblings`)."""
        if decision.session is None or decision.call is None:
            return produce()
        conversation = decision.session.conversation
        return shared_run(self.guard, conversation, decision.call, decision.siblings, produce)

    async def _arun_once(self, decision: _Decision, produce: Callable[[], Awaitable[Any]]) -> Any:
        """Async twin of `_run_once`."""
        if decision.session is None or decision.call is None:
            return await produce()
        conversation = decision.session.conversation
        return await ashared_run(
            self.guard, conversation, decision.call, decision.siblings, produce
        )

    def _steers_here(self, session: Session, watched: bool) -> bool:
        """Whether this tool delivers the steer, in its result: unless a `LoopGuardNode`
        does. Without a node for this guard, it does; with one, it does only in a run the
        handler watches (the pairing without a node) before a node served the
        conversation."""
        if not self.guard.node_attached:
            return True
        return watched and not session.served_by_node

    @override
    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise ToolException(_block_message.get())

    @override
    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        raise ToolException(_block_message.get())

    def _decide(self, input: Any, config: RunnableConfig | None) -> _Decision:
        tool_call = input if _is_tool_call(input) else None
        args = tool_call["args"] if tool_call is not None else input
        runtime = args.get(self.runtime_arg) if isinstance(args, Mapping) else None
        if isinstance(args, Mapping) and self.runtime_arg == RUNTIME_ARG and RUNTIME_ARG in args:
            args = {k: v for k, v in args.items() if k != RUNTIME_ARG}
            input = {**tool_call, "args": args} if tool_call is not None else args
        try:
            return self._judge(input, tool_call, args, runtime, config)
        except LoopGuardStop:
            raise
        except Exception as error:  # a fault of the guard: this call goes unguarded
            self.guard.report_fault(None, error)
            return _Decision(blocked=None, session=None, call=None, input=input)

    def _judge(
        self,
        input: Any,
        tool_call: ToolCall | None,
        args: Any,
        runtime: Any,
        config: RunnableConfig | None,
    ) -> _Decision:
        messages = messages_of(getattr(runtime, "state", None), self.messages_key)
        key = conversation_for(self.guard, config, messages)
        if key is None:
            return _Decision(blocked=None, session=None, call=None, input=input)
        session = session_for(self.guard, key, messages)
        ai_message, _ = last_batch(messages)
        call_id = tool_call["id"] if tool_call is not None else None
        position = (
            None
            if ai_message is None or tool_call is None
            else position_of(ai_message, call_id, self.name, self._model_args(args))
        )
        siblings: Sequence[Call] = ()
        if ai_message is None or position is None:
            call = self._call_from_args(call_id, args)
            verdict = session.check_call(call)
        else:
            # The call as the model made it. The whole response is decided at once, in the
            # model's order, as the other faces do (the reply step, before any call runs):
            # the first sibling to ask decides, the others find their verdicts.
            step = reply_step(self.guard, session, ai_message, settle=False, claim=False)
            call, verdict = step.calls[position].call, step.calls[position].verdict
            if self.guard.config.dedupe_siblings:
                siblings = [outcome.call for outcome in step.calls]
        match verdict:
            case Proceed():
                blocked = None
            case Block():
                blocked = verdict.message
            case Stop():
                raise LoopGuardStop(verdict)
            case _:
                assert_never(verdict)
        return _Decision(
            blocked, session, call, input, tuple(siblings), watched(self.guard, config)
        )

    def _call_from_args(self, call_id: str | None, args: Any) -> Call:
        """A call no AI message shows (a direct invocation)."""
        return Call.of(self.name, self._model_args(args), id=call_id)

    def _model_args(self, args: Any) -> Any:
        """The args as the model gave them: without the injected ones it never saw."""
        if isinstance(args, Mapping):
            return {key: value for key, value in args.items() if key in self._model_arg_names}
        return args

    @contextlib.contextmanager
    def _recording_failure(self, decision: _Decision) -> Iterator[None]:
        """A tool that raises has an error result, as the handler sees it; one stopped by
        control flow (an interrupt, a cancellation) has none yet (`error_result`)."""
        try:
            yield
        except BaseException as error:
            session, call = decision.session, decision.call
            if session is not None and call is not None:
                try:
                    result = error_result(error, call.args)
                    if result is not None and session.awaits_result(call):
                        session.record_result(call, result)
                except Exception as fault:
                    self.guard.report_fault(session.conversation, fault)
            raise

    def _after(self, decision: _Decision, output: Any) -> Any:
        session, call = decision.session, decision.call
        if session is None or call is None:
            return output
        try:
            output = as_handoff(output, self.inner.metadata)
            normalizers = self.guard.config.normalizers(call.tool)
            result = None
            # Recorded already by the handler; a handoff's, from the history (`hands_over`).
            if session.awaits_result(call) and not hands_over(output):
                result = result_of(output, normalizers, args=call.args)
                session.record_result(call, result)
            deliver = self.deliver_steer
            if deliver is None:
                deliver = self._steers_here(session, decision.watched)
            if not deliver or tool_message_of(output) is None:
                return _with_record(output, session)
            steer = session.take_steer()
            if steer is not None:
                if result is None:
                    result = result_of(output, normalizers, args=call.args)
                output = _with_steer(output, steer.message, result)
            return _with_record(output, session)
        except Exception as error:  # a fault of the guard: the tool's output goes through
            self.guard.report_fault(session.conversation, error)
            return output


@overload
def guard_tools(
    tools: Sequence[BaseTool | Callable[..., Any]],
    guard: LoopGuard,
    *,
    deliver_steer: bool | None = None,
    messages_key: str = "messages",
) -> list[BaseTool]: ...


@overload
def guard_tools(
    tools: Sequence[BaseTool | Callable[..., Any] | dict[str, Any]],
    guard: LoopGuard,
    *,
    deliver_steer: bool | None = None,
    messages_key: str = "messages",
) -> list[BaseTool | dict[str, Any]]: ...


def guard_tools(
    tools: Sequence[BaseTool | Callable[..., Any] | dict[str, Any]],
    guard: LoopGuard,
    *,
    deliver_steer: bool | None = None,
    messages_key: str = "messages",
) -> list[Any]:
    """Wrap tools so that the guard can block a repeated call before it runs.

    Each wrapped tool keeps the original's name, description, model-facing schema,
    sync and async paths, injected arguments (state, store, runtime, tool call id),
    artifacts, `Command` returns and `return_direct`. A blocked call does not run: it
    becomes an error `ToolMessage` (`status="error"`) with the reason, in
    `create_agent`, in a default `ToolNode`, and on direct `invoke`. A call that arrives
    after the request was stopped raises `LoopGuardStop`.

    Takes what `create_agent` takes: tools, plain functions (made tools as
    `create_agent` makes them) and provider tool dicts such as `{"type":
    "web_search_preview"}`, which run at the provider, out of the guard's sight, and
    are returned untouched.

    Inside a LangGraph `ToolNode` the wrapper sees the graph state, so it knows the
    thread, the request and the batch on its own. Outside a graph, attach
    `LoopGuardCallbackHandler` so it knows which run a call belongs to.

    Args:
        tools: The tools to wrap.
        guard: The `LoopGuard` that decides.
        deliver_steer: Whether to append the steer message to the tool result that
            completes a streak (the model reads it there). By default it is, unless a
            `LoopGuardNode` serves the conversation: the node then delivers it as a
            message of its own.
        messages_key: The graph state key holding the messages (as
            `ToolNode(messages_key=...)`).

    Returns:
        The wrapped tools, in the same order.

    Raises:
        TypeError: If `tools` is not a list of tools, functions or tool dicts, or
            `guard` is not a `LoopGuard`.

    Examples:
        >>> from langchain_core.tools import tool
        >>> @tool
        ... def read_file(path: str) -> str:
        ...     '''Read a file.'''
        ...     return "File not found"
        >>> [guarded] = guard_tools([read_file], LoopGuard())
        >>> guarded.name, guarded.args == read_file.args
        ('read_file', True)
    """
    _check_arguments(tools, guard)
    attach_sinks(guard)
    wrapped: list[Any] = []
    for given in tools:
        if isinstance(given, dict):
            wrapped.append(given)  # a provider-side tool: nothing here runs it
            continue
        inner = given if isinstance(given, BaseTool) else tool(given)
        if isinstance(inner, GuardedTool):
            inner = inner.inner  # never guard twice
        runtime_arg = _get_all_injected_args(inner).runtime or RUNTIME_ARG
        wrapped.append(
            GuardedTool(
                inner=inner,
                guard=guard,
                deliver_steer=deliver_steer,
                messages_key=messages_key,
                runtime_arg=runtime_arg,
                name=inner.name,
                description=inner.description,
                args_schema=inner.args_schema,
                return_direct=inner.return_direct,
                response_format=inner.response_format,
                tags=inner.tags,
                metadata=inner.metadata,
                extras=inner.extras,
                handle_validation_error=inner.handle_validation_error,
                verbose=inner.verbose,
            )
        )
    guard.add_tools(wrapped)
    return wrapped


def _check_arguments(tools: object, guard: object) -> None:
    """`guard_tools`' arguments, checked at run time: callers may be untyped."""
    checked_guard(guard, TypeError)
    if isinstance(tools, (BaseTool, str, bytes, Mapping)) or not isinstance(tools, Sequence):
        msg = (
            "tools must be a list of tools, functions or provider tool dicts, got "
            f"{type(tools).__name__} (wrap a single tool as guard_tools([tool], guard))"
        )
        raise TypeError(msg)
    for given in tools:
        if isinstance(given, type) or (
            not isinstance(given, (BaseTool, dict)) and not callable(given)
        ):
            got = (
                f"the class {given.__name__} (pass an instance)"
                if isinstance(given, type)
                else f"{type(given).__name__}: {given!r:.80}"
            )
            msg = f"each tool must be a BaseTool, a function or a provider tool dict, got {got}"
            raise TypeError(msg)


@functools.cache
def _with_runtime_field(schema: type[BaseModel]) -> type[BaseModel]:
    """`schema` plus an optional `ToolRuntime` field, which `ToolNode` fills in."""
    namespace = {
        "__annotations__": {RUNTIME_ARG: ToolRuntime},
        RUNTIME_ARG: None,
        # ToolRuntime holds arbitrary objects (a store, a stream writer).
        "model_config": {**schema.model_config, "arbitrary_types_allowed": True},
        "__module__": schema.__module__,
    }
    return type(schema.__name__, (schema,), namespace)


@contextlib.contextmanager
def _blocking(message: str) -> Iterator[None]:
    """While set, the wrapper's own `_run`/`_arun` raise the block message."""
    token = _block_message.set(message)
    try:
        yield
    finally:
        _block_message.reset(token)


def _is_tool_call(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "tool_call" and "args" in value


def _with_steer(output: Any, steer: str, result: Result) -> Any:
    """The tool's output with the steer appended to its tool message.

    The message keeps the fingerprint of what the tool returned, so a replay of the
    history counts the result, not the result plus the steer.
    """
    if isinstance(output, ToolMessage):
        content = output.content
        steered = (
            f"{content}\n\n{steer}"
            if isinstance(content, str)
            else [*content, {"type": "text", "text": steer}]
        )
        metadata = {**output.response_metadata, RESULT_KEY: result_record(result)}
        message = output.model_copy(update={"content": steered, "response_metadata": metadata})
        return _marked(message, STEER_MARK)
    if isinstance(output, Command):
        return with_tool_message(output, lambda message: _with_steer(message, steer, result))
    return output


def _with_record(output: Any, session: Session | None) -> Any:
    """The tool's output with the conversation's state recorded in its tool message
    (`STATE_KEY`): a history trimmed later, read by a process that holds nothing for
    the thread, still shows what the guard knew."""
    if session is None:
        return output
    record = session.state.to_dict()

    def recorded(message: ToolMessage) -> ToolMessage:
        metadata = {**message.response_metadata, STATE_KEY: record}
        return message.model_copy(update={"response_metadata": metadata})

    if isinstance(output, ToolMessage):
        return recorded(output)
    return with_tool_message(output, recorded) if isinstance(output, Command) else output


def _marked(output: Any, mark: str) -> Any:
    """A tool message tagged as the guard's doing, in `response_metadata["loop_guard"]`."""
    if not isinstance(output, ToolMessage):
        return output  # a direct call without a tool call id returns the bare text
    metadata = {**output.response_metadata, "loop_guard": mark}
    return output.model_copy(update={"response_metadata": metadata})
