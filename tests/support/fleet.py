"""A fleet of generated threads written straight into a LangGraph checkpointer.

No graph runs: each thread's messages are built by hand and written as one checkpoint, the
way a checkpointer stores a finished run, so that a scan or a report can be tried on many
thousands of threads in seconds. The threads go round a fixed set of kinds, loops and
healthy work; `FleetTruth` says which threads are of which kind.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE

USAGE = {"input_tokens": 1_000, "output_tokens": 50, "total_tokens": 1_050}
"""The tokens every reply reports."""

TOOLS = ("read_file", "write_file", "search_docs", "run_tests", "get_job_status", "query_db",
         "ask_worker")  # fmt: skip
"""The tools the fleet's agents have (an unknown tool is none of them)."""


@dataclass(slots=True)
class FleetTruth:
    """The thread ids a fleet holds, by kind (a key of `LOOPS` or `HEALTHY`)."""

    threads: dict[str, list[str]] = field(default_factory=dict)

    @property
    def looping(self) -> list[str]:
        """The threads the guard should step in on."""
        return [t for kind in LOOPS for t in self.threads.get(kind, [])]

    @property
    def healthy(self) -> list[str]:
        """The threads the guard should leave alone."""
        return [t for kind in HEALTHY for t in self.threads.get(kind, [])]

    def __len__(self) -> int:
        return sum(len(ids) for ids in self.threads.values())


# Validated once, copied per message with its own fields: validation is most of a thread's
# build time, and the copies serialize exactly as messages built field by field.
_REPLY = AIMessage("", usage_metadata=USAGE)
_ANSWER = ToolMessage("", tool_call_id="")


class _Thread:
    """One thread's messages, built reply by reply from its own random generator."""

    def __init__(self, thread_id: str, rng: random.Random, *, reuse_ids: bool = False) -> None:
        self.id, self.rng, self.reuse_ids = thread_id, rng, reuse_ids
        self.messages: list[BaseMessage] = []
        self.replies = 0

    def ask(self, text: str) -> None:
        self.messages.append(HumanMessage(text, id=f"{self.id}-h"))

    def call(self, tool: str, args: dict[str, Any], result: str, *, error: bool = False) -> None:
        """One reply with one tool call, and the tool's answer."""
        n = self.replies
        self.replies += 1
        call_id = "call_0" if self.reuse_ids else f"call_{self.rng.getrandbits(64):016x}"
        call = {"name": tool, "args": args, "id": call_id, "type": "tool_call"}
        self.messages.append(
            _REPLY.model_copy(update={"tool_calls": [call], "id": f"{self.id}-a{n}"})
        )
        answer = {"content": result, "tool_call_id": call_id, "name": tool, "id": f"{self.id}-t{n}",
                  "status": "error" if error else "success"}  # fmt: skip
        self.messages.append(_ANSWER.model_copy(update=answer))

    def answer(self, text: str) -> None:
        """The reply that ends the run."""
        self.messages.append(AIMessage(text, id=f"{self.id}-a{self.replies}", usage_metadata=USAGE))


def _repeat(thread: _Thread) -> None:
    """The same call, the same result, 8 to 20 times."""
    path = f"notes/{thread.rng.randrange(1000)}.md"
    thread.ask(f"Summarise {path}")
    for _ in range(thread.rng.randint(8, 20)):
        thread.call("read_file", {"path": path}, f"File not found: {path}")


def _cycle(thread: _Thread) -> None:
    """Two calls in turn, each with the same result every time: A, B, A, B, ..."""
    module = f"src/mod{thread.rng.randrange(1000)}.c"
    thread.ask("Fix the build")
    for _ in range(thread.rng.randint(4, 8)):
        thread.call(
            "read_file", {"path": module}, f"int main(void) {{ return undeclared; }} // {module}"
        )
        thread.call("run_tests", {"cmd": "make"}, f"{module}:1: error: 'undeclared' undeclared")


def _interleaved(thread: _Thread) -> None:
    """The same call and result again and again, another call between each: A, x1, A, x2, ..."""
    key = f"feature_{thread.rng.randrange(1000)}"
    thread.ask(f"Turn on {key} everywhere")
    for n in range(thread.rng.randint(4, 6)):
        thread.call("query_db", {"sql": f"SELECT value FROM flags WHERE key = '{key}'"}, "0 rows")
        path = f"services/svc{n}/config.yaml"
        thread.call("read_file", {"path": path}, f"# {path}\nflags: []\nreplicas: {n + 2}\n")


def _returned(thread: _Thread) -> None:
    """Steered away from a call, the model comes back to it after other work."""
    query = f"release notes v{thread.rng.randint(1, 9)}.{thread.rng.randrange(20)}"
    args = {"query": query}
    thread.ask(f"What changed in {query}?")
    for _ in range(3):
        thread.call("search_docs", args, "No documents match.")
    thread.call("read_file", {"path": "CHANGELOG.md"}, "# Changelog\n\nNothing yet.\n")
    thread.call("read_file", {"path": "docs/index.md"}, "# Docs\n\nSee the changelog.\n")
    for _ in range(thread.rng.randint(2, 4)):
        thread.call("search_docs", args, "No documents match.")


def _same_error(thread: _Thread) -> None:
    """A broken tool: the same error whatever its args."""
    thread.ask("How many orders shipped last week?")
    host = f"db-{thread.rng.randrange(100)}.internal:5432"
    for n in range(thread.rng.randint(5, 8)):
        sql = f"SELECT count(*) FROM orders WHERE week = {n + 1}"
        thread.call("query_db", {"sql": sql}, f"Error: connection refused ({host})", error=True)


def _unknown_tool(thread: _Thread) -> None:
    """Calls to a tool the agent does not have, answered as LangGraph's `ToolNode` answers."""
    thread.ask("Find the latest pricing page")
    tools = ", ".join(TOOLS)
    error = INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
        requested_tool="web_search", available_tools=tools
    )
    for n in range(thread.rng.randint(5, 8)):
        thread.call("web_search", {"q": f"pricing page {n}"}, error, error=True)


def _polling(thread: _Thread) -> None:
    """The same call, a result that moves on each time: healthy."""
    job = f"job-{thread.rng.randrange(10_000)}"
    thread.ask(f"Wait for {job} and report")
    steps = thread.rng.randint(8, 15)
    for n in range(1, steps):
        done = n * 100 // steps
        thread.call("get_job_status", {"job_id": job}, f"{job}: running, {done}% complete")
    thread.call("get_job_status", {"job_id": job}, f"{job}: succeeded")
    thread.answer(f"{job} succeeded.")


def _varied(thread: _Thread) -> None:
    """Different calls, different results: healthy."""
    thread.ask("Add a docstring to every module")
    base = thread.rng.randrange(1000)
    for n in range(thread.rng.randint(4, 8)):
        path = f"pkg/module_{base + n}.py"
        thread.call("read_file", {"path": path}, f"def f{n}():\n    return {n}\n")
        body = f'"""Module {n}."""\ndef f{n}():\n    return {n}\n'
        thread.call("write_file", {"path": path, "content": body}, f"wrote {len(body)} bytes")
    thread.answer("Done.")


def _reused_ids(thread: _Thread) -> None:
    """A stubborn repeat from a provider that numbers its tool calls per reply: `call_0`."""
    _repeat(thread)


def _subgraph(thread: _Thread) -> None:
    """A stubborn repeat of a call to a worker (the worker's own run: `_worker`)."""
    task = f"triage ticket T-{thread.rng.randrange(10_000)}"
    thread.ask(f"Have the worker {task}")
    for _ in range(thread.rng.randint(8, 12)):
        thread.call("ask_worker", {"task": task}, "The worker could not finish.")


def _worker(thread: _Thread) -> None:
    """What a subgraph thread's worker did, in its own checkpoint namespace: healthy."""
    thread.ask("Triage the ticket")
    thread.call("read_file", {"path": "tickets/latest.json"}, '{"title": "Login fails"}')
    thread.call("search_docs", {"query": "login fails"}, "See runbook: auth.md")
    thread.answer("Could not reproduce.")


LOOPS: dict[str, Callable[[_Thread], None]] = {
    "repeat": _repeat,
    "cycle": _cycle,
    "interleaved": _interleaved,
    "returned": _returned,
    "same_error": _same_error,
    "unknown_tool": _unknown_tool,
    "reused_ids": _reused_ids,
    "subgraph": _subgraph,
}
"""The kinds of thread the guard should step in on, and how each is built."""

HEALTHY: dict[str, Callable[[_Thread], None]] = {"polling": _polling, "varied": _varied}
"""The kinds of thread the guard should leave alone."""

KINDS = ("repeat", "cycle", "interleaved", "returned", "same_error", "unknown_tool", "polling",
         "varied", "reused_ids", "subgraph")  # fmt: skip
"""The order the threads go round: thread `i` is of kind `KINDS[i % len(KINDS)]`."""

_BUILD = {**LOOPS, **HEALTHY}


def _put(
    saver: BaseCheckpointSaver[Any],
    thread_id: str,
    messages: list[BaseMessage],
    namespace: str = "",
    parent: str | None = None,
) -> str:
    """Write one checkpoint holding `messages`; its id."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": messages}
    checkpoint["channel_versions"] = {"messages": 1}
    parents = {} if parent is None else {"": parent}
    saver.put(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": namespace}},
        checkpoint,
        {"source": "loop", "step": len(messages), "parents": parents},
        {"messages": 1},
    )
    return checkpoint["id"]


def write_fleet(saver: BaseCheckpointSaver[Any], threads: int, *, seed: int = 0) -> FleetTruth:
    """Write `threads` threads, one checkpoint each (two for a subgraph thread).

    The same `threads` and `seed` give the same fleet; a smaller fleet is the start of a
    larger one. A SQLite or PostgreSQL saver writes them all in one transaction.
    """
    truth = FleetTruth({kind: [] for kind in KINDS})
    with _one_transaction(saver):
        for index in range(threads):
            kind = KINDS[index % len(KINDS)]
            thread_id = f"{kind}-{index:06d}"
            rng = random.Random(seed * 1_000_003 + index)
            thread = _Thread(thread_id, rng, reuse_ids=kind == "reused_ids")
            _BUILD[kind](thread)
            root = _put(saver, thread_id, thread.messages)
            if kind == "subgraph":
                worker = _Thread(f"{thread_id}-worker", rng)
                _worker(worker)
                # Written after the root: the thread's latest checkpoint is the worker's.
                _put(saver, thread_id, worker.messages, f"worker:{rng.getrandbits(32):08x}", root)
            truth.threads[kind].append(thread_id)
    return truth


def _one_transaction(saver: BaseCheckpointSaver[Any]) -> AbstractContextManager[object]:
    """Where the saver's connection allows it, one transaction for every write."""
    if isinstance(saver, SqliteSaver):
        return _sqlite_batch(saver)
    conn = getattr(saver, "conn", None)
    transaction = getattr(conn, "transaction", None)  # a psycopg connection
    return transaction() if callable(transaction) else nullcontext()


@contextmanager
def _sqlite_batch(saver: SqliteSaver) -> Iterator[None]:
    """SqliteSaver commits after every write; its commits wait for the batch's."""
    conn = saver.conn
    saver.conn = _Uncommitted(conn)  # type: ignore[assignment]
    try:
        with conn:
            yield
    finally:
        saver.conn = conn


class _Uncommitted:
    """A SQLite connection whose `commit` waits for the batch's."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def commit(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def sqlite_fleet(path: Path, threads: int, seed: int = 0) -> FleetTruth:
    """A new SQLite checkpoint database at `path` holding a fleet."""
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        return write_fleet(saver, threads, seed=seed)
    finally:
        conn.close()


def postgres_fleet(url: str, threads: int, seed: int = 0) -> FleetTruth:
    """A fleet in the PostgreSQL database at `url`, replacing every checkpoint it held."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        conn.execute("TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes")
        return write_fleet(saver, threads, seed=seed)
