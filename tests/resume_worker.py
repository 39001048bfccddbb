"""Run (or continue) a stubborn agent on a SQLite-checkpointed thread, in its own process.

Usage: python resume_worker.py DATABASE THREAD STEPS [agent|graph]

`agent` is `create_agent` with `LoopGuardMiddleware`; `graph` is a hand-built graph with
guarded tools and `LoopGuardNode`, whose in-memory state a new process rebuilds from the
thread's history. The agent pauses before every tool step; the worker resumes it at most
STEPS times, then prints the thread's timeline as JSON. A second worker on the same
database continues the same thread from where the first one stopped.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path


def main(database: str, thread: str, steps: int, face: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from langchain.agents import create_agent
    from langgraph.checkpoint.sqlite import SqliteSaver

    from loop_guard import LoopGuard, LoopGuardMiddleware
    from loop_guard.testing import ScriptedChatModel, stubborn
    from tests.agents import ToolRuns, ask, build_graph, make_tools, timeline

    checkpointer = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    tools = make_tools(ToolRuns())
    if face == "agent":
        agent = create_agent(
            model,
            tools,
            middleware=[LoopGuardMiddleware()],
            checkpointer=checkpointer,
            interrupt_before=["tools"],
        )
    else:
        agent = build_graph(
            model, tools, LoopGuard(), checkpointer=checkpointer, interrupt_before=["tools"]
        )
    config = {"configurable": {"thread_id": thread}}
    if not agent.get_state(config).values:
        agent.invoke(ask(), config)
    for _ in range(steps):
        if not agent.get_state(config).next:
            break
        agent.invoke(None, config)
    print(json.dumps(timeline(agent.get_state(config).values["messages"])))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "agent")
