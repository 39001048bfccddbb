"""What the model is sent, each repeated result shown once (`compact_repeats`).

A tool result (or a steer, block or stop of the guard's) identical to one earlier in the
messages is sent as a short line naming the earlier one and how many messages above it
is. The compacted form of a message depends only on the messages up to it: while a
history only grows, every request starts with exactly the messages of the request before
it, so a provider's cached prefix stays valid. The history itself is never changed; only
what the model is sent.
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
        sizes: The characters of content of each message sent.
        kept_out: The characters each message's line kept out (0: sent as it is).
    """

    messages: list[BaseMessage]
    sizes: list[int]
    kept_out: list[int]

    @property
    def chars_sent(self) -> int:
        """Characters of content in `messages`."""
        return sum(self.sizes)

    @property
    def chars_kept_out(self) -> int:
        """Characters of content kept out by the lines replacing repeats."""
        return sum(self.kept_out)


def tokens_kept_out(chars: int, input_chars: int, input_tokens: int) -> int:
    """`chars` kept out of a model call's input, in tokens: estimated at the rate of the
    input it was sent, `input_chars` characters that cost `input_tokens` (0 when unknown).

    Examples:
        >>> tokens_kept_out(4_000, input_chars=10_000, input_tokens=2_500)
        1000
    """
    return round(chars * input_tokens / input_chars) if input_chars else 0


def compact_repeats(messages: Sequence[MessageT]) -> list[MessageT]:
    """`messages` as a model is to be sent them: a tool result identical to an earlier
    one (and a message of the guard identical to an earlier one) replaced by a short
    line naming the earlier call, how many messages above it is (a provider may give
    several calls one id) and its size. Every tool call keeps its answer (its
    `tool_call_id`, `name` and `status`), so every provider accepts the messages.

    Only content is compared, exactly; a repeat is replaced only when the line is
    shorter. A message is compacted the same way in every list that begins with the
    messages before it, so sending the compacted history at each model call keeps a
    provider's cached prefix valid. Call it where the model is called (a graph's model
    node), on exactly what is sent: after any trimming, which could otherwise drop a result
    a line names. `LoopGuardMiddleware(compact_repeats=True)` does it for `create_agent`.

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        >>> def step(n):
        ...     call = {"name": "read_file", "args": {}, "id": f"call_{n}"}
        ...     result = ToolMessage("x" * 500, tool_call_id=f"call_{n}")
        ...     return [AIMessage("", tool_calls=[call]), result]
        >>> sent = compact_repeats([HumanMessage("Summarise notes.md"), *step(0), *step(1)])
        >>> len(sent[2].content), sent[4].tool_call_id
        (500, 'call_1')
        >>> print(sent[4].content)  # doctest: +NORMALIZE_WHITESPACE
        [Identical to the result of read_file call call_0, 2 messages above
        (500 characters); not repeated.]
    """
    return compacted(messages).messages  # type: ignore[return-value]  # each keeps its type


def compacted(messages: Sequence[BaseMessage]) -> Compacted:
    """`compact_repeats`, with what it kept out (`Compacted`)."""
    tools: dict[str, str] = {}  # tool-call id -> its tool, as the last AI message named it
    firsts: dict[tuple[str, str, str], tuple[int, str]] = {}  # first shown: where, named
    sent: list[BaseMessage] = []
    sizes: list[int] = []
    kept_out: list[int] = []
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage):
            tools.update((call["id"] or "", call["name"]) for call in message.tool_calls)
        text, size = _canonical(message.content)
        key = _key(message, text)
        first = None if key is None else firsts.get(key)
        kept = 0
        if key is not None and first is None:
            firsts[key] = (index, _earlier(message, tools))
        elif first is not None:
            at, earlier = first
            line = _line(earlier, index - at, size)
            if len(line) < size:
                message = message.model_copy(update={"content": line})
                kept, size = size - len(line), len(line)
        sent.append(message)
        sizes.append(size)
        kept_out.append(kept)
    return Compacted(sent, sizes, kept_out)


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


def _earlier(first: BaseMessage, tools: dict[str, str]) -> str:
    """What a repeat's line calls the message `first` it repeats."""
    if isinstance(first, ToolMessage):
        call = first.tool_call_id
        return f"the result of {tools.get(call) or first.name or 'tool'} call {call},"
    return "the loop guard's message,"


def _line(earlier: str, distance: int, size: int) -> str:
    """The line that stands for a repeat of `earlier`, shown in full `distance` messages
    above (which tells it apart from another call given the same id, and which stays
    true as the messages grow)."""
    above = "1 message" if distance == 1 else f"{distance} messages"
    return f"[Identical to {earlier} {above} above ({size:,} characters); not repeated.]"
