"""What the model is sent, each repeated result shown once (`compact_repeats`).

A tool result (or a steer, block or stop of the guard's) identical to one earlier in the
messages is sent as a short line naming the earlier one. The compacted form of a message
depends only on the messages up to it: while a history only grows, every request starts
with exactly the messages of the request before it, so a provider's cached prefix stays
valid. The history itself is never changed; only what the model is sent.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loop_guard._messages import GUARD_NAME

MessageT = TypeVar("MessageT", bound=BaseMessage)


@dataclass(frozen=True, slots=True)
class Compacted:
    """Messages to send, and what compacting them kept out of the model's context.

    Attributes:
        messages: The messages, each repeat shown once.
        chars_kept_out: Characters of content kept out by the lines replacing repeats.
        chars_sent: Characters of content in `messages`.
    """

    messages: list[BaseMessage]
    chars_kept_out: int
    chars_sent: int


def compact_repeats(messages: Sequence[MessageT]) -> list[MessageT]:
    """`messages` as a model is to be sent them: a tool result identical to an earlier
    one (and a message of the guard identical to an earlier one) replaced by a short
    line naming the earlier call and its size. Every tool call keeps its answer (its
    `tool_call_id`, `name` and `status`), so every provider accepts the messages.

    Only content is compared, exactly; a repeat is replaced only when the line is
    shorter. A message is compacted the same way in every list that begins with the
    messages before it, so sending the compacted history at each model call keeps a
    provider's cached prefix valid. Call it where the model is called (a graph's model
    node); `LoopGuardMiddleware(compact_repeats=True)` does it for `create_agent`.

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        >>> def step(n):
        ...     call = {"name": "read_file", "args": {}, "id": f"call_{n}"}
        ...     result = ToolMessage("x" * 500, tool_call_id=f"call_{n}")
        ...     return [AIMessage("", tool_calls=[call]), result]
        >>> sent = compact_repeats([HumanMessage("Summarise notes.md"), *step(0), *step(1)])
        >>> len(sent[2].content), sent[4].tool_call_id
        (500, 'call_1')
        >>> print(sent[4].content)
        [Identical to the result of read_file call call_0 above (500 characters); not repeated.]
    """
    return compacted(messages).messages  # type: ignore[return-value]  # each keeps its type


def compacted(messages: Sequence[BaseMessage]) -> Compacted:
    """`compact_repeats`, with what it kept out (`Compacted`)."""
    tools: dict[str, str] = {}  # tool-call id -> its tool, as the last AI message named it
    lines: dict[tuple[str, str, str], str] = {}  # first shown -> the line for its repeats
    sent: list[BaseMessage] = []
    kept_out = chars = 0
    for message in messages:
        if isinstance(message, AIMessage):
            tools.update((call["id"] or "", call["name"]) for call in message.tool_calls)
        text, size = _canonical(message.content)
        key = _key(message, text)
        line = None if key is None else lines.get(key)
        if key is not None and line is None:
            lines[key] = _line(message, tools, size)
        elif line is not None and len(line) < size:
            message = message.model_copy(update={"content": line})
            kept_out += size - len(line)
            size = len(line)
        sent.append(message)
        chars += size
    return Compacted(sent, kept_out, chars)


def _canonical(content: object) -> tuple[str, int]:
    """A message's content as one string equal for equal contents, and its size."""
    if isinstance(content, str):
        return content, len(content)
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return text, len(text)


def _key(message: BaseMessage, text: str) -> tuple[str, str, str] | None:
    """What makes two messages repeats: their kind and exact content; `None` for a
    message never compacted (the user's, the model's, a system prompt)."""
    if isinstance(message, ToolMessage):
        return ("tool", message.status, text)
    if isinstance(message, HumanMessage) and message.name == GUARD_NAME:
        return ("guard", "", text)
    return None


def _line(first: BaseMessage, tools: dict[str, str], size: int) -> str:
    """The line that stands for a repeat of `first`, shown in full."""
    if isinstance(first, ToolMessage):
        call = first.tool_call_id
        tool = tools.get(call) or first.name or "tool"
        earlier = f"the result of {tool} call {call}"
    else:
        earlier = "the loop guard's message"
    return f"[Identical to {earlier} above ({size:,} characters); not repeated.]"
