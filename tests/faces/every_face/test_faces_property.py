"""Random conversations through every face, each against one uninterrupted run of itself.

A scenario is a script of tool-call batches, keyed by the model's call index so that the
model asks for the same calls whatever the history shows, and a set of disruptions that a
production thread meets:

- approval pauses before every tool batch (`interrupt_before=["tools"]`), each resumed with
  `invoke(None)`;
- a fresh guard on some of those resumes and at some user turns (another worker process
  taking the thread: a new `LoopGuard`, middleware or handler on the same checkpointer);
- a provider that reuses tool-call ids (`call_0`, `call_1`, ... in every reply);
- a history trimmed before every model call (`RemoveMessage` for all but the newest
  messages, user messages kept);
- parallel calls, several requests on one thread, sync and async runs.

Under any of them a face must decide as it does when the same script runs once, in one
process, without them: the same tool runs, the same events in the same order (published
once, whichever guard made them), the same stop. Without trimming the histories must also
match, message for message (ids aside), and stay valid.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState
from langgraph.runtime import Runtime
from typing_extensions import override

from loop_guard import (
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardStop,
)
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import ScriptedChatModel, ToolCallSpec, tool_calls_message
from tests.support.agents import ToolRuns, assert_valid_history, build_graph, make_tools, timeline

CALLS: list[ToolCallSpec] = [
    ("read_file", {"path": "notes.md"}),  # fails the same way every time
    ("read_file", {"path": "a.md"}),
    ("read_file", {"path": "b.md"}),
    ("list_dir", {"path": "."}),
    ("job_status", {"job": "b"}),  # a poll whose result advances
]
POLL = 4
KEEP = 6  # trimming keeps the user messages and the newest KEEP others


@dataclass(frozen=True)
class Scenario:
    """What the model asks for, and what disrupts the run."""

    requests: tuple[tuple[tuple[int, ...], ...], ...]  # per request, batches of CALLS indexes
    pauses: bool
    fresh_guards: tuple[bool, ...]  # whether the next resume or request gets a new guard
    reused_ids: bool
    trimmed: bool
    asynchronous: bool

    def fresh_guard(self, resume: int) -> bool:
        return self.fresh_guards[resume % len(self.fresh_guards)]


@st.composite
def batches(draw: st.DrawFn) -> tuple[tuple[int, ...], ...]:
    """Random batches around a stuck stretch: one call, or a short cycle, repeated."""
    call = st.integers(0, len(CALLS) - 1)
    # At most one poll a batch: two racing polls of one job would swap their results.
    batch = (
        st.lists(call, min_size=1, max_size=3)
        .filter(lambda calls: calls.count(POLL) <= 1)
        .map(tuple)
    )
    before = draw(st.lists(batch, max_size=3))
    lap = draw(st.lists(batch, min_size=1, max_size=2))
    laps = draw(st.integers(0, 9))
    after = draw(st.lists(batch, max_size=3))
    return tuple(before + lap * laps + after)


scenarios = st.builds(
    Scenario,
    requests=st.lists(batches(), min_size=1, max_size=2).map(tuple),
    pauses=st.booleans(),
    fresh_guards=st.lists(st.booleans(), min_size=1, max_size=4).map(tuple),
    reused_ids=st.booleans(),
    trimmed=st.booleans(),
    asynchronous=st.booleans(),
)


class Model:
    """The scenario's script: its batches in order, then an answer, per request.

    It keeps its own place in the request, since trimming hides earlier replies from the
    history; a new user message (never trimmed) moves it to the next request's batches,
    so a request the guard stopped early leaves the rest of its batches unused.
    """

    def __init__(self, scenario: Scenario, *, reused_ids: bool) -> None:
        self.scenario = scenario
        self.reused_ids = reused_ids
        self.request = -1
        self.turn = 0

    def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        request = sum(1 for m in messages if _is_user(m)) - 1
        if request != self.request:
            self.request, self.turn = request, 0
        batches = self.scenario.requests[request]
        self.turn += 1
        if self.turn > len(batches):
            return AIMessage(content=f"done {request}")
        message = tool_calls_message(*(CALLS[n] for n in batches[self.turn - 1]))
        if self.reused_ids:
            calls = [{**call, "id": f"call_{n}"} for n, call in enumerate(message.tool_calls)]
            message = message.model_copy(update={"tool_calls": calls})
        return message


def _is_user(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) and message.name != GUARD_NAME


def trim(messages: Sequence[BaseMessage]) -> list[RemoveMessage]:
    """Removals keeping every user message and the newest KEEP others."""
    others = [m for m in messages if not _is_user(m)]
    cut = max(len(others) - KEEP, 0)
    while cut < len(others) and isinstance(others[cut], ToolMessage):
        cut += 1  # never keep an answer without its call
    return [RemoveMessage(id=m.id) for m in others[:cut] if m.id]


class Trim(AgentMiddleware[AgentState[Any], Any]):
    """Trims the history before every model call, as a context-window middleware does."""

    @override
    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        removals = trim(state["messages"])
        return {"messages": removals} if removals else None

    @override
    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return self.before_model(state, runtime)


Build = Callable[..., tuple[Runnable[Any, Any], dict[str, Any]]]


def build_face(
    face: str,
    model: ScriptedChatModel,
    tools: list[BaseTool],
    on_event: Callable[[GuardEvent], object],
    checkpointer: Any,
    *,
    pauses: bool,
    trimmed: bool,
) -> tuple[Runnable[Any, Any], dict[str, Any]]:
    """An agent guarded by `face`, the model node trimming first: `create_agent` with the
    middleware, or model -> tools (wrapped) [-> LoopGuardNode] -> model, where without the
    node a handler on the run guards it."""
    pause = ["tools"] if pauses else None
    if face == "middleware":
        middleware: list[AgentMiddleware[Any, Any, Any]] = [LoopGuardMiddleware(on_event=on_event)]
        if trimmed:
            middleware.insert(0, Trim())
        agent = create_agent(
            model, tools, middleware=middleware, checkpointer=checkpointer, interrupt_before=pause
        )
        return agent, {}
    guard = LoopGuard(on_event=on_event)

    def call_model(state: MessagesState) -> dict[str, Any]:
        removals = trim(state["messages"]) if trimmed else []
        removed = {removal.id for removal in removals}
        reply = model.invoke([m for m in state["messages"] if m.id not in removed])
        return {"messages": [*removals, reply]}

    node = face == "node"
    graph = build_graph(
        model,
        tools,
        guard,
        checkpointer=checkpointer,
        interrupt_before=pause,
        node=node,
        model_node=call_model,
    )
    return graph, {} if node else {"callbacks": [LoopGuardCallbackHandler(guard)]}


FACES: dict[str, Build] = {
    "middleware": functools.partial(build_face, "middleware"),
    "wrapped tools + node": functools.partial(build_face, "node"),
    "wrapped tools + handler": functools.partial(build_face, "handler"),
}


@dataclass
class Outcome:
    """What a scenario's run did: tool runs, events, and how each request ended."""

    runs: dict[str, int]
    events: list[tuple[str, str | None]]
    ends: list[str]
    messages: list[BaseMessage]


def _invoke(agent: Runnable[Any, Any], payload: Any, config: Any, asynchronous: bool) -> str:
    """Run once; "raised" when the handler ended the request by raising."""
    try:
        if asynchronous:
            asyncio.run(agent.ainvoke(payload, config))
        else:
            agent.invoke(payload, config)
    except LoopGuardStop:
        return "raised"
    return "ran"


def drive(face: str, scenario: Scenario, *, disrupted: bool) -> Outcome:
    """Run the scenario's requests on one thread; with its disruptions, or without."""
    checkpointer = InMemorySaver()
    events: list[GuardEvent] = []
    runs = ToolRuns()
    tools = make_tools(runs)
    model = ScriptedChatModel(script=Model(scenario, reused_ids=disrupted and scenario.reused_ids))
    pauses = disrupted and scenario.pauses
    options = {"pauses": pauses, "trimmed": disrupted and scenario.trimmed}
    handovers = itertools.count()

    def worker() -> tuple[Runnable[Any, Any], dict[str, Any]]:
        agent, extra = FACES[face](model, tools, events.append, checkpointer, **options)
        return agent, {"configurable": {"thread_id": "t"}, "recursion_limit": 500, **extra}

    agent, config = worker()
    ends: list[str] = []
    for request in range(len(scenario.requests)):
        payload: Any = {"messages": [HumanMessage(f"request {request}")]}
        while True:
            end = _invoke(agent, payload, config, scenario.asynchronous)
            if end == "raised" or not (pauses and agent.get_state(config).next):
                break
            payload = None  # approve the paused batch
            if disrupted and scenario.fresh_guard(next(handovers)):
                agent, config = worker()
        ends.append(end)
        if disrupted and scenario.fresh_guard(next(handovers)):
            agent, config = worker()
    messages = list(agent.get_state(config).values["messages"])
    kinds = [(event.kind, event.reason) for event in events if event.kind != "error"]
    faults = [event for event in events if event.kind == "error"]
    assert not faults, f"the guard failed: {faults}"
    return Outcome(dict(runs.counts), kinds, ends, messages)


STEER = "\n\nLOOP GUARD: "


def decisions(messages: Sequence[BaseMessage]) -> list[str]:
    """The history's timeline with each steer as one `steer` line after its batch's answers.

    Where a steer is delivered is no decision: in its own message, or appended to whichever
    answer of a parallel batch finished first (the handler, or a node new to the process).
    """
    out: list[str] = []
    steered = False
    for line in timeline(messages):
        if line.startswith("tool:"):
            text, _, steer = line.partition(STEER)
            steered = steered or bool(steer)
            out.append(text)
            continue
        if steered:
            out.append("steer")
            steered = False
        out.append("steer" if line.startswith(f"human[{GUARD_NAME}]") else line)
    if steered:
        out.append("steer")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("face", FACES)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenario=scenarios)
def test_a_disrupted_thread_decides_as_one_uninterrupted_run(face: str, scenario: Scenario) -> None:
    """Pauses, fresh workers, reused ids and trims change no decision, on every face."""
    # What earlier requests add (a call returning in each user turn) comes from the
    # history the model is shown: a trim that cuts them cuts that too, by design.
    assume(not (scenario.trimmed and len(scenario.requests) > 1))
    whole = drive(face, scenario, disrupted=False)
    disrupted = drive(face, scenario, disrupted=True)
    assert disrupted.runs == whole.runs
    assert disrupted.events == whole.events
    assert disrupted.ends == whole.ends
    if not scenario.trimmed:
        assert decisions(disrupted.messages) == decisions(whole.messages)
    if "raised" not in disrupted.ends:
        assert_valid_history(disrupted.messages)
