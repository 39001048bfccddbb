"""One process's share of a thread where agents loop between them (SPEC §9).

Usage: python tests/support/between_process.py STORE THREAD SHAPE MODE RESUMES

STORE is a SQLite file or a `postgresql://` URL (the thread's checkpointer). SHAPE is
`swarm` (`tests.support.between.PingPong`, pausing before each of bob's turns) or
`supervisor` (`tests.support.between.Supervisor` re-delegating the same task, pausing
before each of the worker's) or `network` (`tests.support.between.Network` guarded by
`guard_tools` and `LoopGuardNode`, pausing before each of the node's steps); `handler-swarm`
and `handler-supervisor` are the first two watched by the callback handler instead of
middleware (`HandlerPingPong`, `HandlerSupervisor`), the handler in the run's config;
`chat-middleware`, `chat-handler` and `chat-node` are the guessing game of
`tests.support.talk.Chat` on that face, pausing before each of bob's turns. MODE is
`sync` (`invoke`) or `async` (`ainvoke`, the async checkpointer). The process builds its
agents and guards afresh, starts the request when the thread is empty, then resumes at
most RESUMES times while the thread has something left to run, and prints the thread's
timeline (`tests.support.agents.timeline`) and the kinds of the events its guards
published, as JSON on its last line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def main(store: str, thread: str, shape: str, mode: str, resumes: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    if mode == "sync":
        with _checkpointer(store) as checkpointer:
            app, kinds, callbacks = _app(shape, checkpointer)
            config = _config(thread, callbacks)
            if not app.get_state(config).values:
                app.invoke(_request(shape), config)
            for _ in range(resumes):
                if not app.get_state(config).next:
                    break
                app.invoke(None, config)
            messages, events = app.get_state(config).values["messages"], kinds()
    else:
        messages, events = asyncio.run(_arun(store, thread, shape, resumes))
    from tests.support.agents import timeline

    print(json.dumps({"timeline": timeline(messages), "events": events}))


async def _arun(store: str, thread: str, shape: str, resumes: int) -> tuple[Any, list[str]]:
    async with _acheckpointer(store) as checkpointer:
        app, kinds, callbacks = _app(shape, checkpointer)
        config = _config(thread, callbacks)
        if not (await app.aget_state(config)).values:
            await app.ainvoke(_request(shape), config)
        for _ in range(resumes):
            if not (await app.aget_state(config)).next:
                break
            await app.ainvoke(None, config)
        return (await app.aget_state(config)).values["messages"], kinds()


def _app(shape: str, checkpointer: Any) -> tuple[Any, Callable[[], list[str]], list[Any]]:
    """The graph of `shape`, the kinds of the events its guards published so far, and the
    callbacks its runs are given."""
    from tests.support.between import (
        HandlerPingPong,
        HandlerSupervisor,
        Network,
        PingPong,
        Supervisor,
    )

    if shape.startswith("chat-"):
        from tests.support.talk import Chat, guessing

        chat = Chat(shape.removeprefix("chat-"), guessing(), checkpointer=checkpointer,  # type: ignore[arg-type]
                    interrupt_before=["bob"])  # fmt: skip
        return chat.app, chat.kinds, chat.config.get("callbacks", [])
    if shape in ("swarm", "handler-swarm"):
        kind = PingPong if shape == "swarm" else HandlerPingPong
        swarm = kind(checkpointer, interrupt_before=["bob"])
        return swarm.app, swarm.kinds, swarm.callbacks
    if shape == "network":
        graph: Network | Supervisor = Network(
            checkpointer=checkpointer, interrupt_before=["loop_guard"]
        )
    else:
        kind_of = Supervisor if shape == "supervisor" else HandlerSupervisor
        graph = kind_of(checkpointer=checkpointer, interrupt_before=["worker"])
    return (
        graph.app,
        lambda: [event.kind for event in graph.events],
        graph.config.get("callbacks", []),
    )


def _request(shape: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    if shape.endswith("supervisor"):
        return {"messages": [HumanMessage("Summarise the research", id="u1")]}
    if shape.startswith("chat-"):
        request = {"messages": [HumanMessage("Guess my number", id="u1")]}
        return {**request, "active_agent": "alice"}
    request = {"messages": [HumanMessage("Plan a trip", id="u1")]}
    return request if shape.endswith("swarm") else {**request, "active_agent": "alice"}


def _config(thread: str, callbacks: list[Any]) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 100, "callbacks": callbacks}


def _checkpointer(store: str) -> contextlib.AbstractContextManager[Any]:
    if store.startswith("postgresql://"):
        from langgraph.checkpoint.postgres import PostgresSaver

        return PostgresSaver.from_conn_string(store)
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver.from_conn_string(store)


def _acheckpointer(store: str) -> contextlib.AbstractAsyncContextManager[Any]:
    if store.startswith("postgresql://"):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        return AsyncPostgresSaver.from_conn_string(store)
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    return AsyncSqliteSaver.from_conn_string(store)


if __name__ == "__main__":
    store, thread, shape, mode, resumes = sys.argv[1:]
    main(store, thread, shape, mode, int(resumes))
