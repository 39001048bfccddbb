"""Threads an earlier version paused before one of the guard's nodes that the middleware no
longer has: `upgrade_thread` moves them on, so that a resume runs what those nodes did.

A snapshot of an earlier shape needs nothing of this: `LoopGuard.session` migrates it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.pregel import Pregel

__all__ = ["aupgrade_thread", "upgrade_thread"]

# The guard's nodes of earlier versions, and the node whose run stands for theirs now: a
# thread paused before one goes on from there (recording results and deciding replies
# happen in the model call now).
_REMOVED_NODES = {"before_model": "tools", "after_model": "model"}


def upgrade_thread(
    agent: Pregel[Any, Any], config: RunnableConfig, *, name: str = "LoopGuardMiddleware"
) -> str | None:
    """Move a thread an earlier version paused before one of the guard's removed nodes
    (`before_model`, `after_model`) on to the nodes that do their work now.

    Call it before resuming a thread checkpointed by such a version: LangGraph runs
    nothing for a pending node the graph no longer has, so the resume would do nothing.
    Any other thread is left as it is. `name`: the middleware's `name`.

    Returns:
        The node the thread was paused before, or `None` when it needed nothing.
    """
    found = _removed_node(agent, _checkpointer(agent).get_tuple(config), name)
    if found is None:
        return None
    agent.update_state(config, None, as_node=_REMOVED_NODES[found])
    return f"{name}.{found}"


async def aupgrade_thread(
    agent: Pregel[Any, Any], config: RunnableConfig, *, name: str = "LoopGuardMiddleware"
) -> str | None:
    """Async twin of `upgrade_thread`."""
    found = _removed_node(agent, await _checkpointer(agent).aget_tuple(config), name)
    if found is None:
        return None
    await agent.aupdate_state(config, None, as_node=_REMOVED_NODES[found])
    return f"{name}.{found}"


def _checkpointer(agent: Pregel[Any, Any]) -> BaseCheckpointSaver[Any]:
    if not isinstance(agent.checkpointer, BaseCheckpointSaver):
        msg = "upgrade_thread needs an agent compiled with a checkpointer"
        raise ValueError(msg)
    return agent.checkpointer


def _removed_node(agent: Pregel[Any, Any], saved: CheckpointTuple | None, name: str) -> str | None:
    """Which of the guard's removed nodes the thread's checkpoint waits for, if any: an
    edge to it (`branch:to:<node>`) was written, and the graph has no such node."""
    if saved is None:
        return None
    waiting = saved.checkpoint["channel_values"]
    for hook in _REMOVED_NODES:
        node = f"{name}.{hook}"
        if f"branch:to:{node}" in waiting and node not in agent.nodes:
            return hook
    return None
