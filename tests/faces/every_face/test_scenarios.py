"""One table of scripted conversations, run through the middleware and through the graph
node: both faces must make the same decisions, and the decisions must be the expected ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent
from loop_guard.testing import Script, ScriptedChatModel, obedient, sequence, stubborn
from tests.support.agents import (
    LIST_DIR,
    READ_NOTES,
    ToolRuns,
    ask,
    assert_valid_history,
    guarded_agent,
    make_tools,
    timeline,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    script: Script
    events: list[str]
    runs: dict[str, int]
    options: dict[str, Any] = field(default_factory=dict)


STOP = ["steer", "block", "block", "block", "stop"]

SCENARIOS = [
    Scenario("stubborn", stubborn(READ_NOTES), STOP, {"read_file": 4}),
    Scenario("obedient", obedient(READ_NOTES), ["steer"], {"read_file": 3}),
    Scenario(
        "stops by itself after four",
        sequence(*[[READ_NOTES]] * 4),
        ["steer"],
        {"read_file": 4},
    ),
    Scenario(
        "polling with progress",
        sequence(*[[("job_status", {"job": "b"})]] * 15),
        [],
        {"job_status": 15},
    ),
    Scenario(
        "ping-pong between two files is a cycle",
        sequence(*[[("read_file", {"path": f"f{n % 2}"})] for n in range(12)]),
        STOP,
        {"read_file": 8},
    ),
    Scenario(
        "alternating files in pi mode",
        sequence(*[[("read_file", {"path": f"f{n % 2}"})] for n in range(12)]),
        [],
        {"read_file": 12},
        {"detect_cycles": False, "detect_interleaved": False},
    ),
    Scenario(
        "two passes over the same files",
        sequence(*[[("read_file", {"path": f"f{n % 5}"})] for n in range(10)]),
        [],
        {"read_file": 10},
    ),
    Scenario(
        "fan-out over equal content",
        sequence(*[[("list_dir", {"path": f"d{n}"}) for n in range(6)]] * 2),
        [],
        {"list_dir": 12},
    ),
    Scenario(
        "identical parallel siblings",
        stubborn(READ_NOTES, READ_NOTES, READ_NOTES),
        STOP,
        {"read_file": 12},
    ),
    Scenario(
        "repeat hidden before a different last call",
        sequence(*[[READ_NOTES, LIST_DIR]] * 7),
        ["steer", "block", "block", "block", "stop"],
        {"read_file": 4, "list_dir": 4},  # side by side, each a loop of its own
    ),
    Scenario(
        "unknown tool",
        stubborn(("open_file", {"path": "notes.md"})),
        STOP,
        {},
    ),
    Scenario(
        "terminate on a fully blocked batch",
        stubborn(READ_NOTES),
        ["steer", "block", "stop"],
        {"read_file": 4},
        {"use_terminate": True},
    ),
    Scenario(
        "ignored tool",
        sequence(*[[READ_NOTES]] * 9),
        [],
        {"read_file": 9},
        {"ignore_tools": ["read_file"]},
    ),
    Scenario(
        "stricter thresholds",
        stubborn(READ_NOTES),
        ["steer", "block", "stop"],
        {"read_file": 2},
        {"warn_threshold": 2, "block_threshold": 3, "abort_threshold": 1},
    ),
]


def via(face: str, scenario: Scenario) -> tuple[list[BaseMessage], list[str], ToolRuns]:
    events: list[GuardEvent] = []
    runs = ToolRuns()
    model = ScriptedChatModel(script=scenario.script)
    agent, _ = guarded_agent(
        face,
        model,
        make_tools(runs),
        on_event=events.append,
        checkpointer=InMemorySaver(),
        **scenario.options,
    )
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "s"}})["messages"]
    return messages, [e.kind for e in events], runs


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_middleware_and_graph_node_decide_alike(scenario: Scenario) -> None:
    """Same events, same tool runs, same history (ids aside) through both faces."""
    agent_messages, agent_events, agent_runs = via("middleware", scenario)
    graph_messages, graph_events, graph_runs = via("graph", scenario)
    assert agent_events == scenario.events
    assert graph_events == scenario.events
    assert dict(agent_runs.counts) == scenario.runs
    assert dict(graph_runs.counts) == scenario.runs
    assert timeline(agent_messages) == timeline(graph_messages)
    assert_valid_history(agent_messages)
    assert_valid_history(graph_messages)
