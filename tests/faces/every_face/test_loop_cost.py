"""What a loop cost, through every face: the same numbers from the events, `stats` and
the scan, sync and async, under retries, across worker processes and threads."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_to_dict,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.errors import GraphRecursionError

from loop_guard import GuardEvent, LoopCost, LoopGuardConfig, LoopGuardMiddleware, LoopGuardStop
from loop_guard._readers import Conversation
from loop_guard.scan import print_table, scan_conversation
from loop_guard.testing import ScriptedChatModel, stubborn, with_usage
from tests.support.agents import ToolRuns, ask, guarded_agent, make_tools, needs_async_context

READ = ("read_file", {"path": "a.txt"})
USAGE = {"input_tokens": 90, "output_tokens": 10, "total_tokens": 100}
# Default thresholds, a model that never changes course: 7 replies, 4 runs, 3 blocks.
# The 1st reply is no repeat; the 2nd and 3rd are charged at the steer, the 4th as it
# comes, each blocked one's reply is a model call spent and a tool run saved.
KINDS_AND_COSTS = [
    ("steer", LoopCost(2, 2, 200)),
    ("block", LoopCost(3, 3, 300, tool_runs_saved=1)),
    ("block", LoopCost(4, 3, 400, tool_runs_saved=2)),
    ("block", LoopCost(5, 3, 500, tool_runs_saved=3)),
    ("stop", LoopCost(6, 3, 600, tool_runs_saved=3)),
]
FACES = ["middleware", "graph", "handler"]


def run_loop(face: str, mode: str, thread: str = "t", checkpointer: Any = None) -> list[GuardEvent]:
    events: list[GuardEvent] = []
    model = ScriptedChatModel(script=with_usage(stubborn(READ), 90, 10))
    agent, extra = guarded_agent(
        face, model, on_event=events.append,
        checkpointer=checkpointer or InMemorySaver(),
    )  # fmt: skip
    config = {"configurable": {"thread_id": thread}, **extra}
    try:
        if mode == "invoke":
            agent.invoke(ask(), config)
        else:
            asyncio.run(agent.ainvoke(ask(), config))
    except LoopGuardStop:  # the handler's way to end a stopped request
        pass
    assert model.calls == 7
    return events


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mode", ["invoke", pytest.param("ainvoke", marks=needs_async_context)])
def test_every_event_tells_what_the_loop_cost_so_far(face: str, mode: str) -> None:
    events = run_loop(face, mode)
    assert [(e.kind, e.cost) for e in events] == KINDS_AND_COSTS


def test_the_stats_add_up_the_threads_run_at_once() -> None:
    """Four threads looping at once through one middleware: four times one loop's cost."""
    middleware = LoopGuardMiddleware()
    model = ScriptedChatModel(script=with_usage(stubborn(READ), 90, 10))
    from langchain.agents import create_agent

    agent = create_agent(
        model, make_tools(ToolRuns()), middleware=[middleware], checkpointer=InMemorySaver()
    )
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: agent.invoke(ask(), {"configurable": {"thread_id": f"t{n}"}}),
                      range(4)))  # fmt: skip
    one = KINDS_AND_COSTS[-1][1]
    assert middleware.guard.stats.cost == one + one + one + one
    assert middleware.guard.stats.by_tool["read_file"]["tokens"] == 2400


@pytest.mark.parametrize("face", ["middleware", "graph"])
def test_a_thread_moved_to_another_process_keeps_its_cost(face: str, tmp_path: Path) -> None:
    """A new guard (another worker) picks the thread up from its checkpoint: the loop's
    cost goes on from what the history shows, not from nothing."""
    with SqliteSaver.from_conn_string(str(tmp_path / "t.db")) as saver:
        events: list[GuardEvent] = []
        model = ScriptedChatModel(script=with_usage(stubborn(READ), 90, 10))
        config = {"configurable": {"thread_id": "t"}, "recursion_limit": 7}
        first, _ = guarded_agent(face, model, checkpointer=saver)
        with pytest.raises(GraphRecursionError):
            first.invoke(ask(), config)  # 4 replies ran, the steer is delivered
        second, _ = guarded_agent(face, model, on_event=events.append, checkpointer=saver)
        second.invoke(None, {"configurable": {"thread_id": "t"}})
    assert events, "the second worker decided the rest of the loop"
    assert [(e.kind, e.cost) for e in events] == KINDS_AND_COSTS[-len(events) :]


def recorded(tool: str, args: dict[str, Any], results: list[str]) -> list[BaseMessage]:
    """A recorded request: one call of `tool` per result, each reply reporting its usage."""
    messages: list[BaseMessage] = [HumanMessage(f"call {tool}")]
    for n, result in enumerate(results):
        call = {"name": tool, "args": args, "id": f"c{n}", "type": "tool_call"}
        messages.append(AIMessage("", id=f"ai-{n}", usage_metadata=dict(USAGE), tool_calls=[call]))
        messages.append(ToolMessage(result, tool_call_id=f"c{n}"))
    assert json.loads(json.dumps(messages_to_dict(messages)))  # the shape scan files hold
    return messages


def test_the_scan_reports_the_cost_and_what_a_stop_saved() -> None:
    """A recorded loop the guard would have stopped: its cost up to the stop as live, and
    what the recording spent after it as saved."""
    messages = recorded("read_file", {"path": "a.txt"}, ["same"] * 12)
    report = scan_conversation(LoopGuardConfig(), Conversation("loop", messages))
    # The replay blocks the 5th to 7th calls (their recorded results are not counted)
    # and stops at the 7th: the 8th to 12th replies and their runs are saved.
    assert report.cost == LoopCost(6, 3, 600, tool_runs_saved=3 + 5, model_calls_saved=5,
                                   tokens_saved=500)  # fmt: skip
    assert report.to_json()["cost"]["model_calls_saved"] == 5
    # The events say the same as the live guard's.
    assert [(f.event.kind, f.event.cost) for f in report.findings] == KINDS_AND_COSTS


def test_the_scan_of_a_healthy_conversation_costs_nothing() -> None:
    messages = recorded("job_status", {"job": "7"}, [f"{n * 10}% done" for n in range(10)])
    report = scan_conversation(LoopGuardConfig(), Conversation("poll", messages))
    assert report.cost == LoopCost()
    assert not report.findings


def test_the_scan_table_ends_with_the_totals() -> None:
    messages = recorded("read_file", {"path": "a.txt"}, ["same"] * 4)
    out = io.StringIO()
    print_table([scan_conversation(LoopGuardConfig(), Conversation("loop", messages))], out)
    assert "spent in loops: 3 model calls, 3 tool runs, 300 tokens\n" in out.getvalue()
    assert "saved by the guard: nothing\n" in out.getvalue()


def test_the_scan_of_a_run_the_guard_stopped_saves_nothing_more() -> None:
    """A recording of a guarded run: the guard's own stop message is no model call the
    stop saved."""
    events: list[GuardEvent] = []
    model = ScriptedChatModel(script=with_usage(stubborn(READ), 90, 10))
    agent, _ = guarded_agent("middleware", model, on_event=events.append)
    messages = agent.invoke(ask(), {"configurable": {"thread_id": "t"}})["messages"]
    report = scan_conversation(LoopGuardConfig(), Conversation("guarded", messages))
    # Compaction, off in this run, would have sent the repeated blocks once.
    assert report.cost.chars_kept_out > 0
    spent = dataclasses.replace(report.cost, chars_kept_out=0, tokens_kept_out=0)
    assert spent == events[-1].cost == KINDS_AND_COSTS[-1][1]
