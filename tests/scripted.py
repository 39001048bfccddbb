"""A scripted chat model: the only fake in the test suite (the framework is real).

Each script is a function `(messages, call_index) -> AIMessage`; it returns a new
message with fresh tool call ids on every call, as a real model would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, PrivateAttr

from loop_guard import GUARD_NAME

Script = Callable[[Sequence[BaseMessage], int], AIMessage]
ToolCallSpec = tuple[str, dict[str, Any]]


class ScriptedChatModel(BaseChatModel):
    """A chat model that follows a script and supports `bind_tools`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: Script
    _calls: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def calls(self) -> int:
        return self._calls

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:
            index = self._calls
            self._calls += 1
        return ChatResult(generations=[ChatGeneration(message=self.script(messages, index))])

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self


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
    """Whether the guard has spoken to the model in the current request."""
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.name == GUARD_NAME
        if isinstance(message, ToolMessage) and "LOOP GUARD" in str(message.content):
            return True
    return False


def stubborn(*calls: ToolCallSpec) -> Script:
    """A model that repeats the same call(s) forever, whatever it is told."""
    return lambda messages, index: tool_calls_message(*calls)


def obedient(*calls: ToolCallSpec, answer: str = "Giving up on that; here is my answer.") -> Script:
    """A model that repeats until the guard steers it, then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        if steered(messages):
            return AIMessage(content=answer)
        return tool_calls_message(*calls)

    return script


def sequence(*turns: Sequence[ToolCallSpec], answer: str = "done") -> Script:
    """A model that makes the given turns in order (per request), then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        turn = sum(1 for m in _current_request(messages) if isinstance(m, AIMessage))
        if turn < len(turns):
            return tool_calls_message(*turns[turn])
        return AIMessage(content=answer)

    return script


def _current_request(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and message.name != GUARD_NAME:
            return list(messages[index:])
    return list(messages)
