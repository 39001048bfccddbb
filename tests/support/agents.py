"""Shared pieces for end-to-end tests: counted tools, guarded agents, run modes, history
checks, and the one-shot worker process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import pytest
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardNode,
    guard_tools,
)
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import Script, ScriptedChatModel

# The three ways a guard is attached, as the multi-agent and interrupt tests name them.
Face = Literal["middleware", "node", "handler"]
FACES: tuple[Face, ...] = ("middleware", "node", "handler")

Mode = Literal["invoke", "ainvoke", "stream", "astream"]
MODES: tuple[Mode, ...] = ("invoke", "ainvoke", "stream", "astream")

# The run config of the one thread most tests drive.
THREAD: dict[str, Any] = {"configurable": {"thread_id": "t"}}

needs_async_context = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason=(
        "LangGraph: async nodes and hooks get no run context before Python 3.11 (no "
        "context for asyncio tasks): create_agent's model call has no callbacks, "
        "interrupt() and custom events find no config"
    ),
)


def _release(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version(package).split(".")[:3] if part.isdigit())


interrupt_in_async_tool = pytest.mark.skipif(
    sys.version_info < (3, 11) and _release("langchain-core") < (1, 4, 8),
    reason=(
        "langchain-core before 1.4.8 runs an async tool outside its run's context before "
        "Python 3.11: interrupt() in the tool finds no config"
    ),
)


def faces_and_modes(faces: Sequence[str], modes: Sequence[str], needs_context: str) -> list[Any]:
    """Each (face, mode), the async runs of face `needs_context` marked `needs_async_context`."""
    return [
        pytest.param(face, mode, marks=needs_async_context)
        if face == needs_context and mode.startswith("a")
        else (face, mode)
        for face in faces
        for mode in modes
    ]


class ToolRuns:
    """Counts how often each tool body really ran (thread-safe)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def hit(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1


class ReplyRecorder(AgentMiddleware[Any, Any]):
    """A middleware wrapping the model call from outside the guard (listed before it): keeps
    the reply each call hands back last in its `result`, sync and async."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: list[BaseMessage] = []

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        response = handler(request)
        self.replies.append(response.result[-1])
        return response

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        self.replies.append(response.result[-1])
        return response


# The calls to the `make_tools` toolbox that scripted models repeat: a read of notes.md
# (which fails unless the toolbox was given notes) and a listing.
READ_NOTES: tuple[str, dict[str, Any]] = ("read_file", {"path": "notes.md"})
LIST_DIR: tuple[str, dict[str, Any]] = ("list_dir", {"path": "."})


def make_tools(runs: ToolRuns, *, notes: str | None = None) -> list[BaseTool]:
    """A small toolbox: a read (of notes.md, which fails unless `notes` are its contents), a
    listing, a poll whose result advances."""
    progress: Counter[str] = Counter()

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        runs.hit("read_file")
        if path == "notes.md":
            if notes is None:
                raise ToolException("File not found: notes.md")
            return notes
        return f"contents of {path}"

    read_file.handle_tool_error = True  # the failure reaches the model as an error result

    @tool
    def list_dir(path: str) -> str:
        """List a directory."""
        runs.hit("list_dir")
        return "README.md\nsrc/"

    @tool
    def job_status(job: str) -> str:
        """Poll a job."""
        runs.hit("job_status")
        progress[job] += 1
        return f"job {job}: {progress[job] * 10}% done"

    return [read_file, list_dir, job_status]


def run(
    agent: Runnable[Any, Any], payload: Any, config: dict[str, Any], mode: Mode
) -> list[BaseMessage]:
    """Run the agent in one of the four modes; return the final messages."""
    if mode == "invoke":
        return list(agent.invoke(payload, config)["messages"])
    if mode == "ainvoke":
        return list(asyncio.run(agent.ainvoke(payload, config))["messages"])
    if mode == "stream":
        last: dict[str, Any] = {}
        for chunk in agent.stream(payload, config, stream_mode="values"):
            last = chunk
        return list(last["messages"])

    async def consume() -> list[BaseMessage]:
        last: dict[str, Any] = {}
        async for chunk in agent.astream(payload, config, stream_mode="values"):
            last = chunk
        return list(last["messages"])

    return asyncio.run(consume())


def ask(text: str = "Summarise notes.md") -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def current_request(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages since the last user message (guard messages are not user messages)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and message.name != GUARD_NAME:
            return list(messages[index + 1 :])
    return list(messages)


def steers(messages: Sequence[BaseMessage]) -> list[HumanMessage]:
    return [m for m in messages if isinstance(m, HumanMessage) and m.name == GUARD_NAME]


def blocked(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [
        m
        for m in messages
        if isinstance(m, ToolMessage) and m.status == "error" and "was blocked" in str(m.content)
    ]


def final_stop(messages: Sequence[BaseMessage]) -> AIMessage | None:
    last = messages[-1]
    if isinstance(last, AIMessage) and last.name == GUARD_NAME:
        return last
    return None


def assert_stopped(messages: Sequence[BaseMessage], name: str = "") -> None:
    """The default ladder run to its end: one steer, three blocked calls, the guard's stop."""
    assert len(steers(messages)) == 1, name
    assert len(blocked(messages)) == 3, name
    assert final_stop(messages) is not None, name


def assert_valid_history(messages: Sequence[BaseMessage]) -> None:
    """Every tool call is answered exactly once, right after its AI message."""
    pending: list[str] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in pending, f"unexpected answer {message.tool_call_id}"
            pending.remove(message.tool_call_id)
            continue
        assert not pending, f"tool calls left unanswered: {pending}"
        if isinstance(message, AIMessage):
            pending = [call["id"] for call in message.tool_calls if call["id"]]
    assert not pending, f"tool calls left unanswered: {pending}"


def timeline(messages: Sequence[BaseMessage]) -> list[str]:
    """A compact, id-free description of a history, for comparing two runs.

    Tool results are listed in their calls' order, whatever order they were added in.
    """
    out: list[str] = []
    order: dict[str, int] = {}
    answers: list[tuple[int, str]] = []

    def flush() -> None:
        out.extend(text for _, text in sorted(answers))
        answers.clear()

    for message in messages:
        if isinstance(message, ToolMessage):
            answers.append((order.get(message.tool_call_id, len(order)), _describe(message)))
            continue
        flush()
        if isinstance(message, AIMessage):
            order = {call["id"] or "": n for n, call in enumerate(message.tool_calls)}
        out.append(_describe(message))
    flush()
    return out


def _describe(message: BaseMessage) -> str:
    if isinstance(message, AIMessage):
        calls = ",".join(f"{c['name']}{sorted(c['args'].items())}" for c in message.tool_calls)
        return f"ai[{message.name or ''}]:{calls or message.content}"
    if isinstance(message, ToolMessage):
        return f"tool:{message.status}:{message.content}"
    return f"{message.type}[{message.name or ''}]:{message.content}"


def build_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    guard: LoopGuard,
    *,
    checkpointer: Any = None,
    deliver_steer: bool | None = None,
    handle_tool_errors: bool = False,
    interrupt_before: list[str] | None = None,
    node: bool | LoopGuardNode = True,
    model_node: Callable[[MessagesState], dict[str, Any]] | None = None,
    wrapped: bool = True,
) -> Any:
    """model -> ToolNode(guarded tools) -> LoopGuardNode -> model | END, the one hand-built
    graph of the tests. `node=False` leaves the node out (tools -> model: a handler on the run
    then guards it); a `LoopGuardNode` given is the node; `model_node` replaces the model's
    node (one that trims or rewrites what the model is sent); `wrapped=False` gives the
    ToolNode the tools unwrapped."""
    errors = {"handle_tool_errors": True} if handle_tool_errors else {}
    builder = StateGraph(MessagesState)
    if model_node is None:
        builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    else:
        builder.add_node("model", model_node)
    guarded = guard_tools(tools, guard, deliver_steer=deliver_steer) if wrapped else list(tools)
    builder.add_node("tools", ToolNode(guarded, **errors))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    if node is False:
        builder.add_edge("tools", "model")
    else:
        guard_node = LoopGuardNode(guard) if node is True else node
        builder.add_node("loop_guard", guard_node, destinations=("model", END))
        builder.add_edge("tools", "loop_guard")
    return builder.compile(checkpointer=checkpointer, interrupt_before=interrupt_before)


def guarded_agent(
    face: str,
    model: BaseChatModel,
    tools: Sequence[BaseTool] | None = None,
    *,
    on_event: Callable[[GuardEvent], object] | None = None,
    checkpointer: Any = None,
    interrupt_before: list[str] | None = None,
    **options: Any,
) -> tuple[Any, dict[str, Any]]:
    """An agent guarded by a new guard (given `options`), attached the way `face` does it,
    and what its run config needs (the handler's callbacks):

    - `middleware` (`agent` in the worker scripts): `create_agent` with `LoopGuardMiddleware`;
    - `graph`: `guard_tools` + `ToolNode` + `LoopGuardNode` (`build_graph`);
    - `handler`: `create_agent` with `guard_tools` and a `LoopGuardCallbackHandler` in the
      run config, no node (a stopped request ends with `LoopGuardStop`).

    `tools` default to `make_tools` counting into a `ToolRuns` of its own.
    """
    from langchain.agents import create_agent  # the `agents` extra, for these faces only

    if tools is None:
        tools = make_tools(ToolRuns())

    if face in ("middleware", "agent"):
        agent = create_agent(
            model,
            list(tools),
            middleware=[LoopGuardMiddleware(on_event=on_event, **options)],
            checkpointer=checkpointer,
            interrupt_before=interrupt_before,
        )
        return agent, {}
    guard = LoopGuard(on_event=on_event, **options)
    if face == "graph":
        graph = build_graph(
            model, tools, guard, checkpointer=checkpointer, interrupt_before=interrupt_before
        )
        return graph, {}
    if face == "handler":
        agent = create_agent(
            model,
            guard_tools(tools, guard),
            checkpointer=checkpointer,
            interrupt_before=interrupt_before,
        )
        return agent, {"callbacks": [LoopGuardCallbackHandler(guard)]}
    raise ValueError(f"unknown face {face!r}")


class Guarded:
    """One guard shared by every agent a test builds, attached the way `face` does it."""

    def __init__(self, face: Face) -> None:
        self.face = face
        self.events: list[GuardEvent] = []
        if face == "middleware":
            self.middleware = LoopGuardMiddleware(on_event=self.events.append)
        else:
            self.guard = LoopGuard(on_event=self.events.append)
            self.handler = LoopGuardCallbackHandler(self.guard)

    @property
    def callbacks(self) -> dict[str, Any]:
        """What a run config needs: the handler's callbacks on the `handler` face."""
        return {"callbacks": [self.handler]} if self.face == "handler" else {}

    def agent(
        self,
        script: Script,
        tools: Sequence[BaseTool],
        *,
        checkpointer: Any = None,
        name: str | None = None,
    ) -> tuple[Any, ScriptedChatModel]:
        """An agent guarded by the shared guard; a subgraph inherits its parent's saver."""
        from langchain.agents import create_agent  # the `agents` extra, for these faces only

        model = ScriptedChatModel(script=script)
        if self.face == "middleware":
            agent = create_agent(
                model, tools, middleware=[self.middleware], checkpointer=checkpointer, name=name
            )
        elif self.face == "node":
            agent = build_graph(model, tools, self.guard, checkpointer=checkpointer)
        else:
            agent = create_agent(
                model, guard_tools(tools, self.guard), checkpointer=checkpointer, name=name
            )
        return agent, model

    def run(self, graph: Any, text: str, mode: Mode, *, thread: bool = True) -> list[BaseMessage]:
        """One request, on thread `t` unless `thread` is false; the final messages."""
        config = THREAD if thread else {}
        return run(graph, ask(text), {**config, **self.callbacks}, mode)

    def conversations(self, since: int = 0) -> dict[str, list[tuple[str, str]]]:
        """The events from index `since` on, grouped by conversation, in order."""
        grouped: dict[str, list[tuple[str, str]]] = {}
        for event in self.events[since:]:
            grouped.setdefault(event.conversation, []).append((event.kind, event.tool))
        return grouped


def record_unguarded_loops(checkpointer: Any, threads: Sequence[str]) -> None:
    """An unguarded agent reading a missing file until the recursion limit, in each of
    `threads` of `checkpointer`: looping threads for the scan to find."""
    from langchain.agents import create_agent  # the `agents` extra, for these faces only
    from langgraph.errors import GraphRecursionError

    from loop_guard.testing import ScriptedChatModel, stubborn

    agent = create_agent(
        ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"}))),
        make_tools(ToolRuns()),
        checkpointer=checkpointer,
    )
    for thread in threads:
        with pytest.raises(GraphRecursionError):
            agent.invoke(ask(), {"configurable": {"thread_id": thread}, "recursion_limit": 30})


WORKER = Path(__file__).with_name("worker.py")


def run_worker(database: Path, face: str, action: str, steps: int = 1000) -> list[str]:
    """Drive thread `t` of a SQLite database from a new process; its final timeline."""
    done = subprocess.run(
        [sys.executable, str(WORKER), str(database), "t", face, action, str(steps)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))
