"""loop_guard: stop LangChain and LangGraph agents that repeat the same tool call.

The guard recognises one signature: the same tool, called with the same arguments,
returning the same result. It steers the model first, then blocks the call, then
stops the request cleanly. Calls with other arguments, or whose results change, are
never touched.

The core (`LoopGuard`, its `Session`s, settings and values) needs no framework: the
adapters for LangChain and LangGraph load when first used.

Examples:
    >>> from loop_guard import LoopGuard, LoopGuardConfig
    >>> LoopGuard(LoopGuardConfig(warn_threshold=2, block_threshold=4)).config.warn_threshold
    2
"""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from loop_guard._config import (
    LoopGuardConfig,
    LoopGuardConfigWarning,
    LoopGuardOptions,
    ToolPolicy,
)
from loop_guard._events import GuardEvent, GuardStats
from loop_guard._guard import LoopGuard, Session
from loop_guard._repeated_text import TextWatch
from loop_guard._values import (
    Block,
    Call,
    Charge,
    Decision,
    Judged,
    LoopCost,
    LoopGuardStop,
    Proceed,
    Reason,
    Result,
    Steer,
    Stop,
    StopReason,
)

if TYPE_CHECKING:
    from loop_guard._agent_state import LoopGuardState
    from loop_guard._compaction import compact_repeats
    from loop_guard.callbacks import LoopGuardCallbackHandler
    from loop_guard.graph import LoopGuardNode
    from loop_guard.middleware import ExitBehavior, LoopGuardMiddleware
    from loop_guard.tools import guard_tools

try:
    __version__ = version("langchain-loop-guard")
    """The installed distribution's version (pyproject.toml is its one source)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Block",
    "Call",
    "Charge",
    "Decision",
    "ExitBehavior",
    "GuardEvent",
    "GuardStats",
    "Judged",
    "LoopCost",
    "LoopGuard",
    "LoopGuardCallbackHandler",
    "LoopGuardConfig",
    "LoopGuardConfigWarning",
    "LoopGuardMiddleware",
    "LoopGuardNode",
    "LoopGuardOptions",
    "LoopGuardState",
    "LoopGuardStop",
    "Proceed",
    "Reason",
    "Result",
    "Session",
    "Steer",
    "Stop",
    "StopReason",
    "TextWatch",
    "ToolPolicy",
    "compact_repeats",
    "guard_tools",
]

# Adapter names and the module each lives in: imported on first use (PEP 562).
_ADAPTERS = {
    "LoopGuardCallbackHandler": "callbacks",
    "LoopGuardNode": "graph",
    "compact_repeats": "_compaction",
    "guard_tools": "tools",
    "ExitBehavior": "_exits",
    "LoopGuardMiddleware": "middleware",
    "LoopGuardState": "_agent_state",
}


_NEEDS_LANGCHAIN = frozenset({"middleware", "_agent_state"})  # the `agents` extra's modules

# Names earlier versions exported from here, by the module each lives in now.
_MOVED = {
    "loop_guard.marks": (
        "BLOCK_MARK",
        "DUPLICATE_MARK",
        "FINAL_ANSWER_MARK",
        "STEER_MARK",
        "GUARD_NAME",
        "JUDGE",
        "REPLY",
    ),
    "loop_guard.normalize": ("Normalizer", "normalize_fresh", "normalize_volatile"),
    "loop_guard.repeated_text": ("Repetition", "find_repetition"),
    "loop_guard.upgrades": ("upgrade_thread", "aupgrade_thread"),
}
# Retired names and what replaces each: every use warns and names it, for one release.
_RETIRED = {
    "LoopGuardAbort": "loop_guard.LoopGuardStop",
    "StopKind": "loop_guard.StopReason",
    **{name: f"{home}.{name}" for home, names in _MOVED.items() for name in names},
}


def __getattr__(name: str) -> Any:
    current = _RETIRED.get(name)
    if current is not None:
        message = f"loop_guard.{name} is deprecated: use {current}"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        home, _, attribute = current.rpartition(".")
        return getattr(importlib.import_module(home), attribute)
    module = _ADAPTERS.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    try:
        value = getattr(importlib.import_module(f"loop_guard.{module}"), name)
    except ImportError as error:
        # Only a missing langchain module means a missing extra; any other failure (a
        # broken dependency, a Python the code does not support) names its real cause.
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if module not in _NEEDS_LANGCHAIN or (missing or "").partition(".")[0] != "langchain":
            raise
        msg = f"{name} needs the `agents` extra: pip install 'langchain-loop-guard[agents]'"
        raise ImportError(msg) from error
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
