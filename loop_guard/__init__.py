"""loop_guard: stop LangChain and LangGraph agents that repeat the same tool call.

The guard recognises one signature: the same tool, called with the same arguments,
returning the same result. It steers the model first, then refuses the call, then
ends the request cleanly. Calls with other arguments, or whose results change, are
never touched.

Example:
    >>> from loop_guard import LoopGuard, LoopGuardConfig
    >>> LoopGuard(LoopGuardConfig(warn_threshold=2, block_threshold=4)).config.warn_threshold
    2
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_guard._config import LoopGuardConfig, Normalizer, ToolPolicy
from loop_guard._engine import Engine, RequestState
from loop_guard._fingerprint import args_fingerprint, result_fingerprint
from loop_guard._guard import GuardEvent, GuardStats, LoopGuard
from loop_guard._messages import GUARD_NAME
from loop_guard._values import (
    Block,
    Call,
    Decision,
    LoopGuardAbort,
    Proceed,
    Reason,
    Result,
    Steer,
    Stop,
    StopKind,
)
from loop_guard._volatile import normalize_volatile
from loop_guard.callbacks import LoopGuardCallbackHandler
from loop_guard.graph import LoopGuardNode
from loop_guard.tools import GuardedTool, guard_tools

if TYPE_CHECKING:
    from loop_guard.middleware import LoopGuardMiddleware

__all__ = [
    "GUARD_NAME",
    "Block",
    "Call",
    "Decision",
    "Engine",
    "GuardEvent",
    "GuardStats",
    "GuardedTool",
    "LoopGuard",
    "LoopGuardAbort",
    "LoopGuardCallbackHandler",
    "LoopGuardConfig",
    "LoopGuardMiddleware",
    "LoopGuardNode",
    "Normalizer",
    "Proceed",
    "Reason",
    "RequestState",
    "Result",
    "Steer",
    "Stop",
    "StopKind",
    "ToolPolicy",
    "args_fingerprint",
    "guard_tools",
    "normalize_volatile",
    "result_fingerprint",
]


def __getattr__(name: str) -> Any:
    # The middleware needs the optional `langchain` package: import it only on use.
    if name == "LoopGuardMiddleware":
        try:
            from loop_guard.middleware import LoopGuardMiddleware
        except ImportError as error:
            msg = (
                "LoopGuardMiddleware needs the `agents` extra: "
                "pip install 'langchain-loop-guard[agents]'"
            )
            raise ImportError(msg) from error
        return LoopGuardMiddleware
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
