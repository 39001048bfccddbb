"""The scenario catalogue (evals/catalogue.py, notes/agent-harnesses.md §7) as tests.

Every scenario runs through `create_agent` with `LoopGuardMiddleware`, through a
hand-built `StateGraph` with `guard_tools` + `LoopGuardNode`, and through one with
`guard_tools` + `LoopGuardCallbackHandler`, sync and async: every face must reach the
catalogue's verdict, with the same events at the same tool calls and the same tool runs
(the middleware and the node also with the same messages).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from evals.catalogue import SCENARIOS, THREAD, Recorder, Scenario, split, toolbox, via_middleware
from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardStop
from loop_guard.testing import ScriptedChatModel
from tests.support import slow_except
from tests.support.agents import assert_valid_history, build_graph, timeline


def via_graph(
    scenario: Scenario,
    recorder: Recorder,
    runs: Counter[str],
    *,
    sync: bool = True,
    handler: bool = False,
) -> list[Any]:
    """`guard_tools` + `LoopGuardNode` in a hand-built graph; with `handler`, no node but
    the handler on the run."""
    guard = LoopGuard(on_event=recorder.on_event, **scenario.options)
    checkpointer = InMemorySaver()

    def graph(model: ScriptedChatModel) -> Any:
        return build_graph(model, toolbox(runs), guard, checkpointer=checkpointer, node=not handler)

    config = {**THREAD, "callbacks": [LoopGuardCallbackHandler(guard)]} if handler else THREAD
    return _requests(scenario, recorder, graph, config, sync)


def via_handler(
    scenario: Scenario, recorder: Recorder, runs: Counter[str], *, sync: bool = True
) -> list[Any]:
    """model -> ToolNode(guarded tools) -> model, with the handler on the run (no node)."""
    return via_graph(scenario, recorder, runs, sync=sync, handler=True)


def _requests(
    scenario: Scenario, recorder: Recorder, make: Any, config: Any, sync: bool
) -> list[Any]:
    """Each request of the scenario through a graph `make` builds on its model; the final
    messages (the checkpointed ones when the handler ended a stopped run by raising)."""
    messages: list[Any] = []
    for n, part in enumerate(split(scenario.turns, scenario.requests)):
        graph = make(ScriptedChatModel(script=recorder.script(part)))
        payload = {"messages": [HumanMessage(scenario.question(n))]}
        try:
            if sync:
                messages = graph.invoke(payload, config)["messages"]
            else:
                messages = asyncio.run(graph.ainvoke(payload, config))["messages"]
        except LoopGuardStop:
            messages = list(graph.get_state(THREAD).values["messages"])
    return messages


TOOLS = {tool.name for tool in toolbox(Counter())}


def _faces(scenario: Scenario) -> tuple[Any, ...]:
    """The faces a scenario runs through: the handler sees only calls of tools that run,
    so not one naming a tool that does not exist (the node and the middleware do)."""
    named = {name for turn in scenario.turns for name, _ in turn}
    handler = (via_handler,) if named <= TOOLS else ()
    return (via_middleware, via_graph, *handler)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.key)
def test_catalogue_scenario_through_every_face(scenario: Scenario) -> None:
    """The catalogue's verdict, reached alike by the middleware, the graph node and the
    handler."""
    results = {}
    for face in _faces(scenario):
        recorder, runs = Recorder(), Counter[str]()
        messages = face(scenario, recorder, runs)
        scenario.expect(recorder.events)
        if face is not via_handler:  # the handler's stop leaves the stopped reply open
            assert_valid_history(messages)
        results[face.__name__] = (recorder.events, dict(runs), timeline(messages))
    middleware, graph = results["via_middleware"], results["via_graph"]
    handler = results.get("via_handler", middleware)
    assert middleware[0] == graph[0] == handler[0]
    assert middleware[1] == graph[1] == handler[1]
    assert middleware[2] == graph[2]


# The first scenario of each group (A-E) runs async in the quick suite, every one in the whole.
_FIRSTS = {next(s for s in SCENARIOS if s.key[0] == group).key for group in "ABCDE"}


@pytest.mark.parametrize(
    "scenario", slow_except(SCENARIOS, lambda s: s.key in _FIRSTS), ids=lambda s: s.key
)
def test_catalogue_scenario_async(scenario: Scenario) -> None:
    """Every face, run with `ainvoke`, decides as it does with `invoke`."""
    for face in _faces(scenario):
        decided = []
        for sync in (True, False):
            recorder, runs = Recorder(), Counter[str]()
            face(scenario, recorder, runs, sync=sync)
            decided.append((recorder.events, dict(runs)))
        assert decided[0] == decided[1], face.__name__
