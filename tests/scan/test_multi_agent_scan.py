"""The offline scan and the fleet report of multi-agent threads: a real `langgraph-swarm`
whose agents hand a task back and forth, recorded unguarded into SQLite. Each finding names
the agent that made its call, and a loop of more than one agent's calls is a loop between
agents; a single agent's thread says nothing of agents. Only the chat models are scripted.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphRecursionError
from langgraph_swarm import create_handoff_tool, create_swarm

from loop_guard.testing import Script, ScriptedChatModel, sequence, stubborn, tool_calls_message
from tests.support.agents import ToolRuns, ask, make_tools
from tests.support.browser import ReportPage, artifacts, chromium, measured, need_chromium
from tests.support.cli import run_cli
from tests.support.talk import DONE, NUMBER, Lines, bounce, guessing, review, speakers


def record_swarm(
    database: Path, thread: str, alice: Script, bob: Script, *, recursion_limit: int = 40
) -> None:
    """A swarm of alice and bob, unguarded, each with a handoff to the other and the file
    tools, run until it ends or reaches the recursion limit."""
    tools = make_tools(ToolRuns())

    def agent(name: str, other: str, script: Script) -> Any:
        handoff = create_handoff_tool(agent_name=other)
        return create_agent(ScriptedChatModel(script=script), [handoff, *tools], name=name)

    saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    agents = [agent("alice", "bob", alice), agent("bob", "alice", bob)]
    app = create_swarm(agents, default_active_agent="alice").compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": recursion_limit}
    with contextlib.suppress(GraphRecursionError):  # an unguarded loop runs to the limit
        app.invoke({"messages": [HumanMessage("Plan a trip")]}, config)


def record_ping_pong(database: Path, thread: str = "ping-pong", recursion_limit: int = 40) -> None:
    """Alice and bob hand the task to each other, whatever they are told."""
    alice, bob = stubborn(("transfer_to_bob", {})), stubborn(("transfer_to_alice", {}))
    record_swarm(database, thread, alice, bob, recursion_limit=recursion_limit)


def record_single_agent(database: Path, thread: str = "alone") -> None:
    """One unnamed agent, unguarded, reading the same file until the recursion limit."""
    saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    agent = create_agent(
        ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"}))),
        make_tools(ToolRuns()),
        checkpointer=saver,
    )
    with pytest.raises(GraphRecursionError):
        agent.invoke(ask(), {"configurable": {"thread_id": thread}, "recursion_limit": 30})


@pytest.fixture
def swarm_db(tmp_path: Path) -> Path:
    database = tmp_path / "swarm.sqlite"
    record_ping_pong(database)
    return database


def test_a_handoff_ping_pong_is_a_loop_between_agents(swarm_db: Path) -> None:
    """The scan steers, blocks and stops the recorded ping-pong; each finding names the
    agent whose call it is about, and every one is part of a loop between alice and bob."""
    status, out, _ = run_cli("scan", "--json", str(swarm_db))
    assert status == 1
    [report] = json.loads(out)
    kinds = [finding["kind"] for finding in report["findings"]]
    assert (kinds[0], kinds[-1]) == ("steer", "stop")
    assert "block" in kinds
    for finding in report["findings"]:
        caller = "alice" if finding["tool"] == "transfer_to_bob" else "bob"
        assert finding["agent"] == caller
        assert finding["agents"] == ["alice", "bob"]
    assert {finding["agent"] for finding in report["findings"]} == {"alice", "bob"}

    status, text, _ = run_cli("scan", str(swarm_db))
    assert status == 1
    assert "swarm.sqlite:ping-pong  loop between alice, bob" in text
    assert re.search(r"steer \(cycle\) +transfer_to_alice \{\}  by bob", text)
    assert re.search(r"block \(cycle\) +transfer_to_bob \{\}  by alice", text)


def test_a_loop_only_steered_is_between_the_agents_whose_calls_it_repeats(
    tmp_path: Path,
) -> None:
    """Recorded only until the steer (bob's call): the cycle it is about began with alice's
    call, so the loop is between alice and bob."""
    database = tmp_path / "swarm.sqlite"
    record_ping_pong(database, recursion_limit=8)
    _, out, _ = run_cli("scan", "--json", str(database))
    [report] = json.loads(out)
    [steer] = report["findings"]
    assert (steer["kind"], steer["agent"], steer["agents"]) == ("steer", "bob", ["alice", "bob"])


def test_one_agent_looping_alone_in_a_swarm_is_no_loop_between_agents(tmp_path: Path) -> None:
    """Alice hands the task to bob, who reads the same file 8 times, then hands it back, and
    alice answers: bob's loop."""

    def bob(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        call = ("read_file", {"path": "notes.md"}) if index < 8 else ("transfer_to_alice", {})
        return tool_calls_message(call)

    database = tmp_path / "swarm.sqlite"
    record_swarm(database, "bob-alone", sequence([("transfer_to_bob", {})]), bob)
    status, out, _ = run_cli("scan", "--json", str(database))
    assert status == 1
    [report] = json.loads(out)
    assert report["findings"]
    assert {finding["agent"] for finding in report["findings"]} == {"bob"}
    assert not [finding for finding in report["findings"] if "agents" in finding]
    _, text, _ = run_cli("scan", str(database))
    assert "between" not in text


@pytest.mark.parametrize(
    ("lines", "answer"), [(guessing, NUMBER), (review, DONE)], ids=["guessing", "review"]
)
def test_agents_taking_turns_with_new_words_are_no_loop(
    lines: Callable[[], tuple[Lines, Lines]], answer: str, tmp_path: Path
) -> None:
    """A guessing game and review rounds recorded unguarded: each agent writes new words
    beside its handoff, so the scan finds nothing, though the handoffs themselves are
    the same call with the same answer every lap."""
    database = tmp_path / "chat.sqlite"
    record_swarm(database, "chat", *speakers(lines(), answer))
    status, out, _ = run_cli("scan", "--json", str(database))
    [report] = json.loads(out)
    assert report["findings"] == []
    assert status == 0


def test_the_same_words_bounced_beside_handoffs_are_a_loop_between_agents(
    tmp_path: Path,
) -> None:
    """The same two lines handed back and forth, recorded unguarded: steered at bob's 3rd
    handoff (the 3rd lap closes), blocked from the 5th lap, stopped within the 6th."""
    database = tmp_path / "chat.sqlite"
    record_swarm(database, "bounce", *speakers(bounce(), NUMBER))
    status, out, _ = run_cli("scan", "--json", str(database))
    assert status == 1
    [report] = json.loads(out)
    kinds = [finding["kind"] for finding in report["findings"]]
    assert kinds == ["steer", "block", "block", "block", "stop"]
    steer = report["findings"][0]
    assert (steer["agent"], steer["agents"]) == ("bob", ["alice", "bob"])
    assert steer["call"] <= 2 * 3  # 1-based: bob's 3rd handoff
    assert report["findings"][-1]["call"] <= 2 * 6


def test_a_single_agents_thread_says_nothing_of_agents(tmp_path: Path) -> None:
    database = tmp_path / "agent.sqlite"
    record_single_agent(database)
    status, out, _ = run_cli("scan", "--json", str(database))
    assert status == 1
    [report] = json.loads(out)
    assert report["findings"]
    assert not [f for f in report["findings"] if {"agent", "agents"} & f.keys()]
    _, text, _ = run_cli("scan", str(database))
    findings = [line for line in text.splitlines() if line.startswith("  call ")]
    assert findings
    assert not [line for line in findings if " by " in line]
    assert "between" not in text


def test_the_report_counts_loops_between_agents_and_tells_each_calls_agent(
    swarm_db: Path,
) -> None:
    """One swarm and one single agent: one thread looped between agents; the swarm's
    timeline says whose each call was, the single agent's names none."""
    record_single_agent(swarm_db)
    status, out, _ = run_cli("report", str(swarm_db), "--json", "-", "--jobs", "1")
    assert status == 0
    numbers = json.loads(out)
    assert (numbers["threads"], numbers["between_agents"]) == (2, 1)
    worst = {entry["thread"]: entry for entry in numbers["worst"]}
    swarm, alone = worst["swarm.sqlite:ping-pong"], worst["swarm.sqlite:alone"]
    callers = [
        run["agent"] for run in swarm["agents"] for _ in range(run["first"], run["last"] + 1)
    ]
    assert callers == ["alice", "bob"] * (swarm["calls"] // 2)
    assert {event["agent"] for event in swarm["events"]} == {"alice", "bob"}
    assert alone["agents"] == []
    assert {event["agent"] for event in alone["events"]} == {None}


# Run in the page by the browser test: the colour each agent's ticks are drawn in, and the
# agents its legend names, for every timeline.
MEASURE = """
const measured = [...document.querySelectorAll(".threads > li")].map((row) => ({
  thread: row.querySelector("h3").textContent,
  legend: [...row.querySelectorAll('[aria-label="Calls by agent"] li')].map((li) => ({
    agent: li.textContent,
    colour: getComputedStyle(li.querySelector("rect")).fill,
  })),
  ticks: [...row.querySelectorAll('svg[data-chart="timeline"] path.ticks')].map((path) => ({
    colour: getComputedStyle(path).stroke,
    count: (path.getAttribute("d").match(/M/g) || []).length,
  })),
}));
"""


@pytest.mark.slow
def test_the_reports_page_shows_each_calls_agent_in_a_browser(
    swarm_db: Path, tmp_path: Path
) -> None:
    """In headless Chromium, the swarm's timeline draws alice's and bob's calls in two
    colours its legend names; the single agent's is drawn in one, with no legend."""
    need_chromium()
    record_single_agent(swarm_db)
    page = tmp_path / "report.html"
    assert run_cli("report", str(swarm_db), "-o", str(page), "--jobs", "1")[0] == 0
    text = " ".join(ReportPage(page.read_text(encoding="utf-8")).text)
    assert "Threads with a loop between agents (the calls of more than one agent): 1." in text
    drawn = measured(page.read_text(encoding="utf-8"), MEASURE, tmp_path)
    rows = {row["thread"]: row for row in drawn}
    swarm, alone = rows["swarm.sqlite:ping-pong"], rows["swarm.sqlite:alone"]
    legend = {item["agent"]: item["colour"] for item in swarm["legend"]}
    assert set(legend) == {"alice", "bob"}
    assert legend["alice"] != legend["bob"]
    ticks = {tick["colour"]: tick["count"] for tick in swarm["ticks"]}
    assert ticks == {legend["alice"]: 20, legend["bob"]: 20}
    assert alone["legend"] == []
    assert len(alone["ticks"]) == 1
    shot = artifacts("report") / "agents.png"
    shot.unlink(missing_ok=True)
    taken = chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400",
                     page.as_uri())  # fmt: skip
    assert taken.returncode == 0, taken.stderr[-2000:]


def test_the_report_counts_only_the_bounced_words_as_a_loop_between_agents(
    tmp_path: Path,
) -> None:
    """A guessing game, review rounds and the same words bounced, recorded unguarded in one
    database: the fleet report finds one thread that looped, between alice and bob."""
    database = tmp_path / "chats.sqlite"
    record_swarm(database, "guessing", *speakers(guessing(), NUMBER))
    record_swarm(database, "review", *speakers(review(), DONE))
    record_swarm(database, "bounce", *speakers(bounce(), NUMBER))
    status, out, _ = run_cli("report", str(database), "--json", "-", "--jobs", "1")
    assert status == 0
    numbers = json.loads(out)
    assert (numbers["threads"], numbers["between_agents"]) == (3, 1)
    assert [entry["thread"] for entry in numbers["worst"]] == ["chats.sqlite:bounce"]
