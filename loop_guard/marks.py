"""What the guard writes into a conversation, so that code reading a history can tell
the guard's messages from the agent's.

Every message the guard inserts is named `GUARD_NAME`; a tool result the guard wrote or
annotated carries one of the marks in `response_metadata["loop_guard"]`. Events and stats
about the model's own reply or about the judge name `REPLY` or `JUDGE` as their tool.

Examples:
    >>> from langchain_core.messages import ToolMessage
    >>> from loop_guard.marks import BLOCK_MARK
    >>> result = ToolMessage("...", tool_call_id="call_1")
    >>> result.response_metadata.get("loop_guard") == BLOCK_MARK
    False
"""

from __future__ import annotations

from loop_guard._langchain import BLOCK_MARK, DUPLICATE_MARK, FINAL_ANSWER_MARK, STEER_MARK
from loop_guard._messages import GUARD_NAME, JUDGE, REPLY

__all__ = [
    "BLOCK_MARK",
    "DUPLICATE_MARK",
    "FINAL_ANSWER_MARK",
    "GUARD_NAME",
    "JUDGE",
    "REPLY",
    "STEER_MARK",
]
