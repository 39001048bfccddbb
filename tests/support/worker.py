"""A stubborn agent on a SQLite-checkpointed thread, driven from its own process.

Usage: python tests/support/worker.py DATABASE THREAD FACE ACTION [STEPS]

FACE is `agent` (`create_agent` with `LoopGuardMiddleware`, whose state is checkpointed) or
`graph` (guarded tools and `LoopGuardNode`, whose in-memory state a new process rebuilds
from the thread's history). ACTION is

- `step`: pause before every tool step and resume at most STEPS times (a new request
  when the thread is empty);
- `request`: run one new request to the end;
- `slow`: like `request`, with tools that take 0.4 s (a process to kill mid-run);
- `continue`: resume whatever the thread left unfinished, to the end.

The worker prints the thread's timeline as JSON on its last line.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any


def main(database: str, thread: str, face: str, action: str, steps: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.sqlite import SqliteSaver

    from loop_guard.testing import ScriptedChatModel, stubborn
    from tests.support.agents import ToolRuns, ask, guarded_agent, make_tools, timeline

    class Slow(ToolRuns):
        def hit(self, name: str) -> None:
            time.sleep(0.4)
            super().hit(name)

    checkpointer = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    tools: list[BaseTool] = make_tools(Slow() if action == "slow" else ToolRuns())
    pause: Any = ["tools"] if action == "step" else None
    agent, _ = guarded_agent(face, model, tools, checkpointer=checkpointer, interrupt_before=pause)
    config = {"configurable": {"thread_id": thread}}
    if action in ("request", "slow") or not agent.get_state(config).values:
        agent.invoke(ask(), config)
    elif action == "continue":
        # A killed run may leave a step whose writes were saved but whose successors were
        # not scheduled yet (`next` looks empty): resuming once picks it up.
        agent.invoke(None, config)
    for _ in range(steps if action == "step" else 1000):
        if not agent.get_state(config).next:
            break
        agent.invoke(None, config)
    print(json.dumps(timeline(agent.get_state(config).values["messages"])))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    main(*arguments[:4], int(arguments[4]) if len(arguments) > 4 else 1000)
