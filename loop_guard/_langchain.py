"""Conversions from LangChain's messages and tool calls to the engine's values.

Shared by every adapter, so each reads a tool call and a tool result the same way.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.types import Command

from loop_guard._values import Call, Result


def call_of(tool_call: ToolCall) -> Call:
    """The engine's `Call` for a model's tool call."""
    return Call.of(tool_call["name"], tool_call.get("args", {}), id=tool_call.get("id"))


def result_of(output: Any) -> Result:
    """The engine's `Result` for what a tool produced.

    A `ToolMessage` (what agents see), a `Command` (its tool messages), or a raw return
    value (a tool invoked without a tool call).
    """
    if isinstance(output, ToolMessage):
        return Result.of(output.content, is_error=output.status == "error")
    if isinstance(output, Command):
        update = output.update
        messages = update.get("messages", []) if isinstance(update, dict) else []
        tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
        if tool_messages:
            return result_of(tool_messages[-1])
        return Result.of({"$command": repr(update), "goto": repr(output.goto)})
    return Result.of(output)
