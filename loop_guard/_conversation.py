"""Which conversation a LangChain event belongs to, keyed the same way by every face.

A conversation is a LangGraph thread narrowed to the graph a node runs in (a subagent
is a conversation of its own); outside a thread, a top-level run (as the callback
handler sees it), else the request a graph's messages hold. Its state, when kept in a
process, proves it is current against the history before it is used (`session_for`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, final
from uuid import UUID

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from typing_extensions import override

from loop_guard._guard import LoopGuard, Session
from loop_guard._history import (
    Observer,
    RequestStarts,
    handed_over_response,
    request_start,
    up_to_date,
)
from loop_guard._langchain import keys_of
from loop_guard._values import Block, Call, Decision, Stop

Scope = Literal["thread", "run", "request"]


@final
@dataclass(frozen=True, slots=True)
class ConversationKey:
    """Where a conversation lives; its text form is `GuardEvent.conversation`.

    Attributes:
        scope: `'thread'` (a LangGraph thread), `'run'` (a top-level run outside any
            thread, which the handler sees from its start) or `'request'` (a request
            outside any thread: a graph's, known by its user message, or the
            middleware's own).
        id: The thread id, the top-level run id, or the request's id.
        graph: The namespace of the subgraph within it, task ids included (`""` for
            the top-level graph): sibling subagents, an agent run inside a tool and
            parallel runs of one subagent are each a conversation of their own.

    Examples:
        >>> str(ConversationKey("thread", "t-1", "worker:6f1c")), str(ConversationKey("run", "9"))
        ('t-1|worker:6f1c', 'run:9')
    """

    scope: Scope
    id: str
    graph: str = ""

    @override
    def __str__(self) -> str:
        base = self.id if self.scope == "thread" else f"{self.scope}:{self.id}"
        return _in_graph(base, self.graph)

    @property
    def follows_history(self) -> bool:
        """Whether the conversation outlives a run (a thread, a request's messages), so
        that state kept in a process must catch up with what others added."""
        return self.scope != "run"


def thread_of(config: RunnableConfig | None) -> ConversationKey | None:
    """The conversation of a node, tool or hook running with `config` in a thread."""
    if not config:
        return None
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    thread = configurable.get("thread_id", metadata.get("thread_id"))
    if thread is None:
        return None
    namespace = configurable.get("checkpoint_ns")
    if namespace is None:
        namespace = metadata.get("langgraph_checkpoint_ns")
    return ConversationKey("thread", str(thread), graph_of(namespace))


def thread_key(thread: object, namespace: object) -> str:
    """The text of a thread's conversation in the graph of a node's `namespace`: that of
    `ConversationKey("thread", str(thread), graph_of(namespace))`, without making one (a
    hook asks at every model call).

    Examples:
        >>> thread_key("t-1", "worker:6f1c|model:9a2e"), thread_key("t-1", "model:9a2e")
        ('t-1|worker:6f1c', 't-1')
    """
    return _in_graph(str(thread), graph_of(namespace))


def _in_graph(base: str, graph: str) -> str:
    return f"{base}|{graph}" if graph else base


def graph_of(namespace: object) -> str:
    """The graph part of a node's namespace: all but the node's own task.

    A node's namespace is its graph's, then its own task (`"worker:<task>|model:<task>"`):
    the graph part holds for every step of one run of a subgraph, and its task ids tell
    parallel runs apart. (`metadata["checkpoint_ns"]` is not it: it keeps the outermost
    subgraph's.)
    """
    return str(namespace or "").rpartition("|")[0]


class RunTree:
    """The conversations of live callback runs, from their metadata and parents.

    Thread-safe. A run in a thread belongs to the thread (narrowed to its graph); a run
    outside any thread belongs to its top-level run, or to a subgraph within it. A run's
    conversation is worked out when asked for: most runs (a graph's chains) never are.
    """

    def __init__(self) -> None:
        # Each live run: its parent, its metadata when it has any, and the top-level run
        # of a subgraph's run outside a thread (found at its start: ancestors may end
        # before it does).
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()

    def start(
        self, run_id: UUID, parent_run_id: UUID | None, metadata: Mapping[str, Any] | None
    ) -> None:
        """Place a starting run in the tree."""
        with self._lock:
            top = None
            if (
                parent_run_id is not None
                and metadata
                and metadata.get("thread_id") is None
                and graph_of(metadata.get("langgraph_checkpoint_ns"))
            ):  # a subgraph's run outside a thread (an agent run inside a tool)
                top = self._top(parent_run_id)
            self._runs[run_id] = _Run(parent_run_id, metadata or None, top)

    def end(self, run_id: UUID) -> ConversationKey | None:
        """Forget a finished run; the conversation of a top-level run that ended."""
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is not None and run.parent is not None:
            return None
        key = None if run is None else run.conversation()
        return key or ConversationKey("run", str(run_id))

    def conversation_of(self, run_id: UUID | None) -> ConversationKey | None:
        """The conversation a live run belongs to, or `None` for a run never seen."""
        with self._lock:
            while run_id is not None:
                run = self._runs.get(run_id)
                if run is None:
                    return None  # a run this tree never saw
                key = run.conversation()
                if key is not None:
                    return key
                if run.parent is None:
                    return ConversationKey("run", str(run_id))
                run_id = run.parent
        return None

    def _top(self, run_id: UUID) -> UUID:
        while (run := self._runs.get(run_id)) is not None and run.parent is not None:
            run_id = run.parent
        return run_id


class _Run(NamedTuple):
    """A live run of a `RunTree`."""

    parent: UUID | None
    metadata: Mapping[str, Any] | None
    top: UUID | None  # a subgraph's run outside a thread: the top-level run it is in

    def conversation(self) -> ConversationKey | None:
        """The conversation the run's own metadata places it in, if any."""
        metadata = self.metadata
        if metadata is None:
            return None
        namespace = metadata.get("langgraph_checkpoint_ns")
        if metadata.get("thread_id") is not None:
            return ConversationKey("thread", str(metadata["thread_id"]), graph_of(namespace))
        if self.top is not None:
            return ConversationKey("run", str(self.top), graph_of(namespace))
        return None


def conversation_for(
    guard: LoopGuard, config: RunnableConfig | None, messages: Sequence[BaseMessage]
) -> ConversationKey | None:
    """The conversation of a node or tool: the one the handler would name.

    The thread when there is one; else the handler's run, when a handler for this
    guard watches; else the request's user message (not the history's first message,
    which runs often share: a system prompt).
    """
    thread = thread_of(config)
    if thread is not None:
        return thread
    watching = _watching(guard, config)
    if watching is not None:
        handler, callbacks = watching
        return handler.conversation_of(callbacks.parent_run_id)
    start = request_start(messages, _request_starts)
    request_id = None if start is None else messages[start].id
    return None if request_id is None else ConversationKey("request", request_id)


_request_starts = RequestStarts()
"""Where the requests outside any thread begin: every step of a request reads its
history again, one step longer (shared by all guards: it describes histories only)."""


def watched(guard: LoopGuard, config: RunnableConfig | None) -> bool:
    """Whether a callback handler for `guard` watches the run `config` belongs to."""
    return _watching(guard, config) is not None


def _watching(
    guard: LoopGuard, config: RunnableConfig | None
) -> tuple[RunTree, BaseCallbackManager] | None:
    """The callback handler for `guard` watching this run, with the run's manager."""
    callbacks = (config or {}).get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        for handler in callbacks.handlers:
            if isinstance(handler, RunTree) and getattr(handler, "guard", None) is guard:
                return handler, callbacks
    return None


def session_for(
    guard: LoopGuard, key: ConversationKey, history: Sequence[BaseMessage], end: int | None = None
) -> Session:
    """The conversation's session, its state first brought up to date with `history`
    (the messages before `end`, up to what the caller is about to decide; see
    `take_over`)."""
    session = guard.session(str(key))
    if key.follows_history:
        take_over(guard, session, history, end)
    return session


def take_over(
    guard: LoopGuard, session: Session, history: Sequence[BaseMessage], end: int | None = None
) -> None:
    """Bring a session up to date with a history other agents may have worked on (the
    messages before `end`; see `follow_history`), and publish what the results handed
    over to it lead to.

    A handoff's answer is read from the history once the agent it went to has worked,
    so no guard saw the results of the response handed over (`handed_over_response`)
    live: the steer they lead to is for the conversation reading them to publish, once
    (`Session.adopt`). Blocks and stops were published where they were decided.
    """
    handed_over: set[str] | None = None  # worked out at the first call read, if any
    reached: list[Decision] = []

    def observe(call: Call, decisions: Sequence[Decision]) -> None:
        nonlocal handed_over
        if handed_over is None:
            reply = handed_over_response(history if end is None else history[:end])
            handed_over = set() if reply is None else set(keys_of(reply))
        if call.key in handed_over:
            reached.extend(d for d in decisions if not isinstance(d, Block | Stop))

    follow_history(guard, session, history, end, observe=observe)
    session.adopt(reached)
    session.publish()


def follow_history(
    guard: LoopGuard,
    session: Session,
    history: Sequence[BaseMessage],
    end: int | None = None,
    *,
    observe: Observer | None = None,
) -> None:
    """Bring a session's state up to date with the conversation's history (the messages
    before `end`): the history is the truth, the state a cache (`up_to_date`). `observe`
    gets each call read with the decisions it led to."""
    if guard.config.enabled:
        tools = guard.tool_names
        session.catch_up(
            lambda held: up_to_date(guard._engine, held, history, end, tools=tools, observe=observe)
        )
