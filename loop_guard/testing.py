"""Scripted chat models, for testing agents guarded by loop_guard without an LLM;
`capture_events`, which collects what a guard publishes while a test runs; and
`GuardDriver`, which feeds tool calls and results through a guard with no agent at all.

A script is a function `(messages, call_index) -> AIMessage`. It must return a new
message with fresh tool call ids on every call, as a real model does: `create_agent`
tells calls apart by their ids. `stubborn`, `obedient` and `sequence` build the usual
ones.

Examples:
    >>> from langchain_core.messages import HumanMessage
    >>> model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    >>> reply = model.invoke([HumanMessage("Summarise notes.md")])
    >>> reply.tool_calls[0]["name"], reply.tool_calls[0]["args"], model.calls
    ('read_file', {'path': 'notes.md'}, 1)
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, PrivateAttr
from typing_extensions import override

from loop_guard._events import GuardEvent
from loop_guard._guard import LoopGuard, Session
from loop_guard._langchain import FINAL_ANSWER_MARK
from loop_guard._messages import GUARD_NAME
from loop_guard._values import Block, Call, Proceed, Result, Stop

Script = Callable[[Sequence[BaseMessage], int], AIMessage]
"""`(messages, call_index) -> AIMessage`: what the scripted model answers."""

ToolCallSpec = tuple[str, dict[str, Any]]
"""`(tool_name, args)`: one tool call a script makes."""


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers by a script and supports `bind_tools`.

    Thread-safe; `calls` counts the model calls made so far. With `chunk_chars`, it
    streams when it is asked to (`stream_mode="messages"`, `.stream()`): each reply's
    text in pieces of that many characters, its tool calls and usage in the last one;
    `chunks` counts the pieces it generated, so a test sees where a stream was cut.

    Examples:
        >>> model = ScriptedChatModel(script=lambda m, i: AIMessage("hello"), chunk_chars=2)
        >>> [chunk.content for chunk in model.stream("hi")][:3], model.chunks
        (['he', 'll', 'o'], 4)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: Script
    chunk_chars: int = 0
    """Characters per streamed chunk; 0: the model does not stream."""
    _calls: int = PrivateAttr(default=0)
    _chunks: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @override
    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        if not self.chunk_chars and "disable_streaming" not in self.model_fields_set:
            self.disable_streaming = True  # answers whole, streamed or not

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        return self._calls

    @property
    def chunks(self) -> int:
        """How many chunks the model streamed."""
        return self._chunks

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        with self._lock:
            index = self._calls
            self._calls += 1
        return self.script(messages, index)

    @override
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    @override
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in _pieces(self._reply(messages), max(self.chunk_chars, 1)):
            with self._lock:
                self._chunks += 1
            yield ChatGenerationChunk(message=chunk)

    @override
    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in _pieces(self._reply(messages), max(self.chunk_chars, 1)):
            with self._lock:
                self._chunks += 1
            yield ChatGenerationChunk(message=chunk)
            await asyncio.sleep(0)  # as a network stream would, let other tasks run

    @property
    @override
    def _llm_type(self) -> str:
        return "scripted"

    @override
    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """Accept any tools: the script decides what gets called."""
        return self


def _pieces(reply: AIMessage, size: int) -> Iterator[AIMessageChunk]:
    """A reply as a stream: its text in pieces of `size` characters, then its tool
    calls and usage."""
    text = reply.text
    for start in range(0, len(text), size):
        yield AIMessageChunk(content=text[start : start + size], id=reply.id)
    calls = [
        tool_call_chunk(name=call["name"], args=json.dumps(call["args"]), id=call["id"], index=i)
        for i, call in enumerate(reply.tool_calls)
    ]
    yield AIMessageChunk(
        content="",
        id=reply.id,
        tool_call_chunks=calls,
        usage_metadata=reply.usage_metadata,
        response_metadata=reply.response_metadata,
        chunk_position="last",
    )


def tool_calls_message(*calls: ToolCallSpec) -> AIMessage:
    """An AI message with fresh tool call ids, unique across processes too."""
    return AIMessage(
        content="",
        tool_calls=[
            {
                "name": name,
                "args": dict(args),
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "tool_call",
            }
            for name, args in calls
        ],
    )


def steered(messages: Sequence[BaseMessage]) -> bool:
    """Whether the guard has spoken to the model since the last user message."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.name == GUARD_NAME
        if isinstance(message, ToolMessage) and "LOOP GUARD" in str(message.content):
            return True
    return False


def stubborn(*calls: ToolCallSpec, answer: str | None = None) -> Script:
    """A model that makes the same call(s) forever, whatever it is told.

    With `answer`, it says that when the guard stops the request and asks it for its
    answer (`LoopGuardMiddleware(exit_behavior="answer")`).
    """

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        if answer is not None and asked_to_answer(messages):
            return AIMessage(content=answer)
        return tool_calls_message(*calls)

    return script


def asked_to_answer(messages: Sequence[BaseMessage]) -> bool:
    """Whether the guard has just stopped the request and asked the model for its answer."""
    last = messages[-1] if messages else None
    return (
        isinstance(last, HumanMessage)
        and last.name == GUARD_NAME
        and last.response_metadata.get("loop_guard") == FINAL_ANSWER_MARK
    )


def obedient(*calls: ToolCallSpec, answer: str = "Giving up on that; here is my answer.") -> Script:
    """A model that repeats the call(s) until the guard steers it, then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        if steered(messages):
            return AIMessage(content=answer)
        return tool_calls_message(*calls)

    return script


def sequence(*turns: Sequence[ToolCallSpec], answer: str = "done") -> Script:
    """A model that makes the given turns in order (in each request), then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        turn = sum(1 for m in _current_request(messages) if isinstance(m, AIMessage))
        if turn < len(turns):
            return tool_calls_message(*turns[turn])
        return AIMessage(content=answer)

    return script


def with_usage(script: Script, input_tokens: int, output_tokens: int) -> Script:
    """`script`, each reply reporting the tokens it cost (`usage_metadata`), as a
    provider's does: what the guard charges a loop (`LoopCost.tokens`).

    Examples:
        >>> model = ScriptedChatModel(script=with_usage(stubborn(("ls", {})), 900, 100))
        >>> model.invoke("list it").usage_metadata["total_tokens"]
        1000
    """

    def scripted(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        return script(messages, index).model_copy(update={"usage_metadata": usage})

    return scripted


def _current_request(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and message.name != GUARD_NAME:
            return list(messages[index:])
    return list(messages)


@contextmanager
def capture_events(guard: LoopGuard) -> Iterator[list[GuardEvent]]:
    """Collect the events `guard` publishes inside the `with` block, as a list.

    Every steer, block and stop (and the guard's own faults), from any thread, each
    conversation's in the order published (conversations run on several threads at once
    interleave as they happen to); the list stops growing when the block ends. For the
    middleware, pass its guard (`middleware.guard`).

    Examples:
        >>> from loop_guard import Call, LoopGuard, Result
        >>> guard = LoopGuard(warn_threshold=2)
        >>> with capture_events(guard) as events:
        ...     session = guard.session("t")
        ...     for _ in range(2):
        ...         call = Call.of("ls", {"path": "/"})
        ...         _ = session.check_call(call)
        ...         session.record_result(call, Result.of("empty"))
        >>> [(event.kind, event.tool, event.streak) for event in events]
        [('steer', 'ls', 2)]
    """
    events: list[GuardEvent] = []
    sink = events.append  # one bound method: the one sink to unsubscribe
    guard.subscribe(sink)
    try:
        yield events
    finally:
        guard.unsubscribe(sink)


Step = tuple[str, Any, Any]
"""`(tool_name, args, result)`: one call a `GuardDriver` makes and what it returns; a
result is recorded as given when it is a `Result`, as `Result.of(result)` otherwise."""


class GuardDriver:
    """Feeds tool calls and their results through a guard the way an agent loop does,
    with no agent and no model: for testing a configuration, a detector or a policy.

    Each call gets a fresh id and is numbered from 1; a call the guard lets through
    (`Proceed`) has its result recorded, a blocked or stopped one does not. `events`
    holds what the guard published, `stamps` each event as `(call number, kind,
    reason)`, the number of the call it came at.

    Examples:
        >>> from loop_guard import LoopGuard
        >>> driver = GuardDriver(LoopGuard(warn_threshold=2, block_threshold=3))
        >>> [driver.step("ls", {"path": "/"}, "README.md") for _ in range(3)]
        ['Proceed', 'Proceed', 'Block']
        >>> driver.stamps
        [(2, 'steer', 'repeat'), (3, 'block', 'repeat')]
        >>> driver.batch([("ls", {"path": "/"}, "README.md"), ("ls", {"path": "src"}, "a.py")])
        ['Block', 'Proceed']
    """

    def __init__(
        self, guard: LoopGuard | None = None, *, thread: str = "t", request: str = "r1"
    ) -> None:
        self.guard = LoopGuard() if guard is None else guard
        self.events: list[GuardEvent] = []
        self.stamps: list[tuple[int, str, str | None]] = []
        self.calls = 0
        self.guard.subscribe(self._seen)
        self.session: Session = self.guard.session(thread)
        self.session.start_request(request)

    def _seen(self, event: GuardEvent) -> None:
        self.events.append(event)
        self.stamps.append((self.calls, event.kind, event.reason))

    def _call(self, tool: str, args: Any) -> Call:
        self.calls += 1
        return Call.of(tool, args, id=f"call_{self.calls}")

    def _record(self, call: Call, verdict: Proceed | Block | Stop, result: Any, error: bool) -> str:
        if isinstance(verdict, Proceed):
            outcome = result if isinstance(result, Result) else Result.of(result, is_error=error)
            self.session.record_result(call, outcome)
        return type(verdict).__name__

    def step(self, tool: str, args: Any, result: Any, *, error: bool = False) -> str:
        """One call on its own, with no model response declared around it; the verdict's
        kind: `"Proceed"`, `"Block"` or `"Stop"`."""
        call = self._call(tool, args)
        return self._record(call, self.session.check_call(call), result, error)

    def batch(
        self,
        steps: Sequence[Step],
        *,
        errors: Sequence[bool] = (),
        order: Sequence[int] | None = None,
        tokens: int = 0,
        together: bool = False,
    ) -> list[str]:
        """One model response of several calls (it cost `tokens`); each verdict's kind.

        The response is declared, then its calls checked one by one in their order; with
        `together`, all are decided before any runs (`Session.check_batch`, as the
        middleware does: a stop then blocks the siblings before it too). Results are
        recorded in `order` (indexes into `steps`; by default theirs); `errors[i]` marks
        the i-th an error.
        """
        calls = [self._call(tool, args) for tool, args, _ in steps]
        if together:
            verdicts = self.session.check_batch(calls, tokens)
        else:
            self.session.open_batch(calls, tokens)
            verdicts = [self.session.check_call(call) for call in calls]
        for index in range(len(steps)) if order is None else order:
            error = index < len(errors) and errors[index]
            self._record(calls[index], verdicts[index], steps[index][2], error)
        return [type(verdict).__name__ for verdict in verdicts]

    def new_request(self, request_id: str, question: str = "") -> None:
        """A new user message: the next calls belong to request `request_id`."""
        self.session.start_request(request_id, question)

    def kinds(self) -> list[str]:
        """The kinds of the events published so far, in order."""
        return [event.kind for event in self.events]
