"""Soak: one guard, many conversations, for a while; nothing leaks, nothing drifts.

    python benchmarks/run.py soak    # two minutes a face; with --quick, two small rounds

Rounds of conversations run at once — OS threads and asyncio tasks on one guard (the
graph face) or one compiled agent (the middleware face). Stubborn conversations must end
after exactly 7 model calls with 3 blocks; healthy ones must finish untouched. After
each round the retained memory is sampled. Per face it reports rounds, conversations,
deviations, guard errors and the retained memory's growth per round; the soak fails (its
target is missed) if any conversation deviates, if any guard error event appears, or if
memory keeps growing round after round. The graph face runs without thread ids, so each
request is a conversation of its own that only the guard's `max_conversations` bound
releases: the soak sets it to 200 and checks that memory levels off there.
`tests/deploy/test_soak.py` runs a few small rounds of each face as part of the test suite.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    GUARD_NAME,
    GuardEvent,
    LoopGuard,
    LoopGuardMiddleware,
    LoopGuardNode,
    guard_tools,
)
from loop_guard.demo import demo_tools
from loop_guard.testing import ScriptedChatModel, tool_calls_message

THREADS, TASKS = 8, 64
BOUND = 200  # the graph face's max_conversations


def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
    """Stubborn when the task says so, else a few distinct reads and an answer."""
    task = str(messages[0].content)
    turn = sum(isinstance(m, AIMessage) for m in messages)
    if task.startswith("stubborn"):
        return tool_calls_message(("read_file", {"path": "notes.md"}))
    if turn < 4:
        return tool_calls_message(("read_file", {"path": f"{task}-{turn}.md"}))
    return AIMessage(content="done")


def build(face: str, events: list[GuardEvent]) -> tuple[Any, LoopGuard]:
    model = ScriptedChatModel(script=script)
    tools = demo_tools(Counter())
    if face == "middleware":
        middleware = LoopGuardMiddleware(on_event=events.append)
        return create_agent(model, tools, middleware=[middleware]), middleware.guard
    guard = LoopGuard(on_event=events.append, max_conversations=BOUND)
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode(guard_tools(tools, guard, deliver_steer=False)))
    builder.add_node("loop_guard", LoopGuardNode(guard), destinations=("model", END))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "loop_guard")
    return builder.compile(), guard


def check(task: str, messages: Sequence[BaseMessage]) -> str | None:
    """What is wrong with a finished conversation, if anything."""
    blocked = sum(
        isinstance(m, ToolMessage) and m.response_metadata.get("loop_guard") == "blocked"
        for m in messages
    )
    stopped = isinstance(messages[-1], AIMessage) and messages[-1].name == GUARD_NAME
    calls = sum(isinstance(m, AIMessage) and m.name != GUARD_NAME for m in messages)
    if task.startswith("stubborn") and (blocked, stopped, calls) != (3, True, 7):
        return f"{task}: blocked={blocked} stopped={stopped} model calls={calls}"
    if task.startswith("healthy") and (blocked or stopped or messages[-1].content != "done"):
        return f"{task}: touched (blocked={blocked}, stopped={stopped})"
    return None


def run_round(runnable: Any, round_number: int, tasks_per_round: int) -> list[str]:
    tasks = [
        f"{'stubborn' if n % 2 else 'healthy'}-{round_number}-{n}"
        for n in range(tasks_per_round + THREADS)
    ]
    results: dict[str, Sequence[BaseMessage]] = {}

    def in_thread(task: str) -> None:
        results[task] = runnable.invoke({"messages": [HumanMessage(task)]})["messages"]

    async def in_loop() -> None:
        batch = tasks[:tasks_per_round]
        outs = await asyncio.gather(
            *(runnable.ainvoke({"messages": [HumanMessage(t)]}) for t in batch)
        )
        results.update({t: o["messages"] for t, o in zip(batch, outs, strict=True)})

    threads = [threading.Thread(target=in_thread, args=(t,)) for t in tasks[tasks_per_round:]]
    for thread in threads:
        thread.start()
    asyncio.run(in_loop())
    for thread in threads:
        thread.join()
    return [problem for t in tasks if (problem := check(t, results[t])) is not None]


@dataclass
class Report:
    """What one face's soak found."""

    face: str
    rounds: int = 0
    conversations: int = 0
    problems: list[str] = field(default_factory=list)
    errors: int = 0
    samples: list[int] = field(default_factory=list)  # retained bytes after each round
    growth: float = 0.0  # bytes per round, first third of the run to the last
    held: int = 0  # conversations the guard holds at the end

    @property
    def levelled(self) -> bool:
        """Memory may rise until the conversation bound is reached, then must level off."""
        return self.held < BOUND or self.growth < 16 * 1024

    @property
    def ok(self) -> bool:
        return not self.problems and self.errors == 0 and self.levelled

    def summary(self) -> str:
        return (
            f"{self.face}: {self.rounds} rounds, {self.conversations} conversations, "
            f"{len(self.problems)} deviations, {self.errors} guard errors, retained memory "
            f"{self.samples[0] / 1024:.0f} KiB -> {self.samples[-1] / 1024:.0f} KiB "
            f"({self.growth / 1024:+.1f} KiB per round), guard holds {self.held} conversations"
        )


def soak(face: str, seconds: float, tasks_per_round: int, min_rounds: int) -> Report:
    events: list[GuardEvent] = []
    runnable, guard = build(face, events)
    report = Report(face)
    tracemalloc.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline or report.rounds < min_rounds:
        report.rounds += 1
        found = run_round(runnable, report.rounds, tasks_per_round)
        report.problems += [f"round {report.rounds}: {problem}" for problem in found]
        events.clear()  # keep only what the guard itself retains
        gc.collect()
        report.samples.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    report.errors = guard.stats.errors
    # Growth between the first and the last third of the run, per round.
    samples, rounds = report.samples, report.rounds
    third = max(1, len(samples) // 3)
    early, late = sum(samples[:third]) / third, sum(samples[-third:]) / third
    report.growth = (late - early) / max(1, rounds - third)
    report.conversations = rounds * (tasks_per_round + THREADS)
    report.held = len(guard._conversations.states)
    return report


def run(scale: Any) -> Any:
    """Each face soaked: two minutes a face, or (quick) the test suite's two small rounds."""
    from _harness import Section, Target  # here: the test suite imports this module alone

    logging.getLogger("loop_guard").addHandler(logging.NullHandler())  # the table says it
    out = Section("soak", "Soak: many conversations at once on one guard", __doc__.split("\n\n")[2])
    out.columns = ["face", "what it found"]
    for face in ("graph", "middleware"):
        if scale.quick:
            report = soak(face, 0, tasks_per_round=8, min_rounds=2)
        else:
            report = soak(face, 120.0, tasks_per_round=TASKS, min_rounds=6)
        out.rows.append([face, report.summary()])
        out.notes += report.problems[:3]
        deviated = float(not report.ok)
        out.targets.append(Target.at_most(f"{face}: deviations, errors or growth", 0, deviated))
    return out
