"""Floors for the instruction counts: do-nothing layouts and a minimal loop guard.

What a guard's work costs can only be judged against what the framework charges for
any middleware of its layout, and against the least work a guard of the same idea
does. This module gives both (see `instructions.py`):

- `NullWrapTool`, `NullWrapModel`: do-nothing middleware with one per-step hook
  (`wrap_tool_call`), and with the two `LoopGuardMiddleware` uses per step
  (`wrap_model_call`, `wrap_tool_call`).
- `MinimalGuard`: a minimal guard for repeated identical results only ("Pi" alone: the
  same call answered the same way), in one `wrap_tool_call`: the call's SHA-256 (the tool
  name and the canonical JSON of its args), the tool run, the SHA-256 of the result's
  text, and a streak per (thread, call). A streak of `STEER_AT` appends a steer to the
  result; a call whose streak has reached `REFUSE_AT` is answered with an error
  `ToolMessage` without running. Its table lives in the middleware, keyed by thread.
  The same `wrap_tool_call` is a `ToolNode(wrap_tool_call=...)` interceptor: the graph
  floor runs it in the tools node (`graph_interceptor`).

None of them does what `LoopGuardMiddleware` does beyond that (no batches, no stop, no
progress detectors, no normalisation, no events, no async twins): they are floors, not
guards to use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from loop_guard import LoopGuardState

STEER_AT = 3
"""The streak at which the result carries a steer."""

REFUSE_AT = 5
"""The streak from which the call is refused without running."""

STEER = (
    "\n\n[loop guard] This call returned exactly the same result 3 times in a row. "
    "Try something different."
)
REFUSAL = (
    "[loop guard] Not run: this call returned exactly the same result 5 times in a row. "
    "Try something different."
)
NO_THREAD = ""
"""The table's key for a run without a thread id (one table for all such runs)."""

Handler = Callable[[ToolCallRequest], "ToolMessage | Command[Any]"]
Entry = tuple[str, int]
"""A call's last result fingerprint and its streak."""


def call_fingerprint(name: str, args: Any) -> str:
    """SHA-256 of the tool name and the canonical JSON of the call's args."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{name}\0{canonical}".encode()).hexdigest()


def result_fingerprint(message: ToolMessage) -> str:
    """SHA-256 of a tool result's text content."""
    content = message.content
    text = content if isinstance(content, str) else message.text
    return hashlib.sha256(text.encode()).hexdigest()


def thread_of(request: ToolCallRequest) -> str:
    """The run's thread id, from the tool runtime's config (`NO_THREAD` without one).

    `ToolCallRequest.runtime` is a `ToolRuntime` holding the node's `RunnableConfig`, so
    this is two dict look-ups; no `get_config()` (a context variable) is needed.
    """
    runtime = request.runtime
    config = runtime.config if runtime is not None else None
    if not config:
        return NO_THREAD
    thread = config.get("configurable", {}).get("thread_id")
    return NO_THREAD if thread is None else str(thread)


def refusal(request: ToolCallRequest) -> ToolMessage:
    """The error answer of a refused call."""
    call = request.tool_call
    return ToolMessage(REFUSAL, tool_call_id=call["id"], name=call["name"], status="error")


def steer(message: ToolMessage) -> None:
    """Append the steer to a tool result, in place."""
    content = message.content
    if isinstance(content, str):
        message.content = content + STEER
    else:
        message.content = [*content, {"type": "text", "text": STEER}]


def run_guarded(
    request: ToolCallRequest, handler: Handler, entry: Entry | None
) -> tuple[ToolMessage | Command[Any], Entry | None]:
    """Refuse or run one call given its table entry; the answer and the new entry.

    The new entry is `None` when the table is unchanged (refused, or a `Command` from the
    tool, whose result is not read).
    """
    if entry is not None and entry[1] >= REFUSE_AT:
        return refusal(request), None
    result = handler(request)
    if not isinstance(result, ToolMessage):
        return result, None
    digest = result_fingerprint(result)
    streak = entry[1] + 1 if entry is not None and entry[0] == digest else 1
    if streak == STEER_AT:
        steer(result)
    return result, (digest, streak)


class NullWrapTool(AgentMiddleware):
    """Does nothing, through `wrap_tool_call` alone: the least a guard on the tool path
    costs in `create_agent` (the framework's wrapper around each tool call)."""

    def wrap_tool_call(self, request: ToolCallRequest, handler: Handler) -> Any:
        return handler(request)


class NullWrapModel(NullWrapTool):
    """Does nothing, through `wrap_model_call` and `wrap_tool_call`: the two per-step
    hooks of `LoopGuardMiddleware` (its once-per-request hooks add nothing per step)."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request)


class NullWrapState(NullWrapModel):
    """`NullWrapModel` with `LoopGuardMiddleware`'s state schema: its per-step layout,
    hooks and state field, doing nothing."""

    state_schema = LoopGuardState


class MinimalGuard(AgentMiddleware):
    """The minimal guard (module docstring), its table in memory keyed by thread id.

    The table outlives requests (a thread's streaks go on in its next request) and is
    lost with the process; subagents on the same thread share it. Its `wrap_tool_call`
    also serves as a `ToolNode` interceptor (same signature).
    """

    def __init__(self) -> None:
        super().__init__()
        self.threads: dict[str, dict[str, Entry]] = {}

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Handler
    ) -> ToolMessage | Command[Any]:
        """Refuse a call on a streak of `REFUSE_AT`; else run it and keep its streak."""
        thread = thread_of(request)
        table = self.threads.get(thread)
        if table is None:
            table = self.threads[thread] = {}
        call = request.tool_call
        key = call_fingerprint(call["name"], call["args"])
        answer, entry = run_guarded(request, handler, table.get(key))
        if entry is not None:
            table[key] = entry
        return answer


def graph_interceptor() -> Callable[[ToolCallRequest, Handler], ToolMessage | Command[Any]]:
    """A fresh `MinimalGuard`'s `wrap_tool_call`, for `ToolNode(wrap_tool_call=...)`: the
    minimal guard inside the README graph's tools node, with no node of its own."""
    return MinimalGuard().wrap_tool_call
