"""A long-lived worker: one guarded agent on a PostgreSQL checkpointer, driven over pipes.

Usage: python tests/support/workers_process.py URL FACE MODE

A LangGraph deployment runs each step of a thread on whichever worker is free, and a
worker lives on between the steps it runs. This program is such a worker: it builds its
agent (and so its guard's in-process memory) once, then serves commands until told to
quit, so a test can hand one thread back and forth between two of them mid-request.

FACE is how the guard is attached (`tests.support.agents.guarded_agent`): `agent`
(`create_agent` with `LoopGuardMiddleware`, its state checkpointed), `graph` (`guard_tools`
+ `ToolNode` + `LoopGuardNode`) or `handler` (`guard_tools` and a `LoopGuardCallbackHandler`
in the run config, no node: a stopped request ends with `LoopGuardStop`). Every agent
pauses before its tool step.

MODE is `sync` (`PostgresSaver`, `invoke`) or `async` (`AsyncPostgresSaver`, `ainvoke`,
one event loop for the life of the process).

Commands, one JSON object per line on stdin, each with a `thread`:

- `{"op": "start"}`: a new request (`tests.support.agents.ask()`), up to the first pause;
- `{"op": "step", "n": N}`: resume at most N times, stopping early once the thread has
  nothing left to run or the guard aborted the run;
- `{"op": "finish"}`: resume until then (at most 100 times);
- `{"op": "quit"}`: answer and exit.

Every command is answered with one JSON line: `timeline` (`tests.support.agents.timeline` of the
thread's messages), `next` (the thread's pending nodes), `runs` (tool bodies run during
this command, by tool), `model_calls` (made during this command), `resumes`, and `aborted`
(the command ended with `LoopGuardStop`). A failure is answered with `error` (its
traceback) and the worker serves on. The first line, once the agent is built, is
`{"ready": true}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

FINISH_LIMIT = 100  # resumes: far more than a guarded request needs, a backstop otherwise


def main(url: str, face: str, mode: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    # Only answers go to the real stdout; anything a library prints goes to stderr.
    answers: TextIO = sys.stdout
    sys.stdout = sys.stderr
    with contextlib.ExitStack() as stack:
        worker = Worker(url, face, mode, stack)
        _answer(answers, {"ready": True})
        for line in sys.stdin:
            if not line.strip():
                continue
            command: dict[str, Any] = json.loads(line)
            try:
                reply = worker.serve(command)
            except Exception:
                reply = {"error": traceback.format_exc()}
            _answer(answers, reply)
            if command["op"] == "quit":
                break


def _answer(out: TextIO, reply: dict[str, Any]) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


class Worker:
    """One agent, its guard and its tool counters, kept for the life of the process."""

    def __init__(self, url: str, face: str, mode: str, stack: contextlib.ExitStack) -> None:
        from langchain_core.tools import BaseTool

        from loop_guard.testing import ScriptedChatModel, stubborn
        from tests.support.agents import ToolRuns, guarded_agent, make_tools

        self.mode = mode
        self.loop: asyncio.AbstractEventLoop | None = None
        checkpointer: Any
        if mode == "async":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            loop = self.loop = asyncio.new_event_loop()
            stack.callback(loop.close)
            saver = AsyncPostgresSaver.from_conn_string(url)
            checkpointer = loop.run_until_complete(saver.__aenter__())
            stack.callback(lambda: loop.run_until_complete(saver.__aexit__(None, None, None)))
        elif mode == "sync":
            from langgraph.checkpoint.postgres import PostgresSaver

            checkpointer = stack.enter_context(PostgresSaver.from_conn_string(url))
        else:
            raise ValueError(f"unknown mode {mode!r}")

        self.runs = ToolRuns()
        self.model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
        tools: list[BaseTool] = make_tools(self.runs)
        self.agent: Any
        self.agent, extra = guarded_agent(
            face, self.model, tools, checkpointer=checkpointer, interrupt_before=["tools"]
        )
        self.callbacks: list[Any] = extra.get("callbacks", [])

    def serve(self, command: dict[str, Any]) -> dict[str, Any]:
        """Run one command on its thread; what the thread looks like afterwards."""
        from loop_guard import LoopGuardStop
        from tests.support.agents import ask, timeline

        op = command["op"]
        thread = str(command.get("thread", ""))
        config: dict[str, Any] = {"configurable": {"thread_id": thread}}
        if self.callbacks:
            config["callbacks"] = self.callbacks
        runs_before = Counter(self.runs.counts)
        calls_before = self.model.calls
        resumes = 0
        aborted = False
        try:
            if op == "start":
                self._run(ask(), config)
            elif op in ("step", "finish"):
                limit = int(command.get("n", 1)) if op == "step" else FINISH_LIMIT
                while resumes < limit and self._state(config).next:
                    resumes += 1
                    self._run(None, config)
            elif op == "quit":
                return {"bye": True}
            else:
                raise ValueError(f"unknown op {op!r}")
        except LoopGuardStop:
            aborted = True
        state = self._state(config)
        runs = Counter(self.runs.counts)
        runs.subtract(runs_before)
        return {
            "timeline": timeline(state.values.get("messages", [])),
            "next": list(state.next),
            "runs": {name: count for name, count in runs.items() if count},
            "model_calls": self.model.calls - calls_before,
            "resumes": resumes,
            "aborted": aborted,
        }

    def _run(self, payload: Any, config: dict[str, Any]) -> None:
        """`ainvoke` on the process's one event loop in async mode, `invoke` otherwise."""
        if self.loop is not None:
            self.loop.run_until_complete(self.agent.ainvoke(payload, config))
        else:
            self.agent.invoke(payload, config)

    def _state(self, config: dict[str, Any]) -> Any:
        if self.loop is not None:
            return self.loop.run_until_complete(self.agent.aget_state(config))
        return self.agent.get_state(config)


if __name__ == "__main__":
    main(*sys.argv[1:4])
