"""Run (or continue) a stubborn agent on a SQLite-checkpointed thread, in its own process.

Usage: python resume_worker.py DATABASE THREAD STEPS

The agent pauses before every tool step; the worker resumes it at most STEPS times, then
prints the thread's timeline as JSON. A second worker on the same database continues the
same thread from where the first one stopped.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path


def main(database: str, thread: str, steps: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from langchain.agents import create_agent
    from langgraph.checkpoint.sqlite import SqliteSaver

    from loop_guard import LoopGuardMiddleware
    from tests.agents import ToolRuns, ask, make_tools, timeline
    from tests.scripted import ScriptedChatModel, stubborn

    connection = sqlite3.connect(database, check_same_thread=False)
    agent = create_agent(
        ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"}))),
        make_tools(ToolRuns()),
        middleware=[LoopGuardMiddleware()],
        checkpointer=SqliteSaver(connection),
        interrupt_before=["tools"],
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
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
