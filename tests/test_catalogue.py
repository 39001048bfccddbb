"""The scenario catalogue (evals/catalogue.py, notes/agent-harnesses.md §7) as tests.

Every scenario runs through `create_agent` with `LoopGuardMiddleware` and through a
hand-built `StateGraph` with `guard_tools` + `LoopGuardNode`: both faces must reach the
catalogue's verdict, with the same events at the same tool calls and the same tool runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from evals.catalogue import SCENARIOS, THREAD, Recorder, Scenario, split, toolbox, via_middleware
from loop_guard import LoopGuard
from loop_guard.testing import ScriptedChatModel

from .agents import assert_valid_history, build_graph, timeline


def via_graph(scenario: Scenario, recorder: Recorder, runs: Counter[str]) -> list[Any]:
    guard = LoopGuard(on_event=recorder.on_event, **scenario.options)
    checkpointer = InMemorySaver()
    messages: list[Any] = []
    for n, part in enumerate(split(scenario.turns, scenario.requests)):
        model = ScriptedChatModel(script=recorder.script(part))
        graph = build_graph(model, toolbox(runs), guard, checkpointer=checkpointer)
        messages = graph.invoke({"messages": [HumanMessage(f"request {n}")]}, THREAD)["messages"]
    return messages


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.key)
def test_catalogue_scenario_through_both_faces(scenario: Scenario) -> None:
    """The catalogue's verdict, reached alike by the middleware and the graph node."""
    results = {}
    for face in (via_middleware, via_graph):
        recorder, runs = Recorder(), Counter[str]()
        messages = face(scenario, recorder, runs)
        assert_valid_history(messages)
        scenario.expect(recorder.events)
        results[face.__name__] = (recorder.events, dict(runs), timeline(messages))
    middleware, graph = results["via_middleware"], results["via_graph"]
    assert middleware[0] == graph[0]
    assert middleware[1] == graph[1]
    assert middleware[2] == graph[2]
