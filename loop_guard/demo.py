"""`loop-guard demo`: watch the guard stop a stubborn agent, offline, in a few seconds.

A scripted model (no API key) keeps reading a file that does not exist. The same agent
runs without the guard (until LangGraph's recursion limit), with `LoopGuardMiddleware`,
and as a hand-built graph with `guard_tools` and `LoopGuardNode`; a healthy agent shows
that legitimate work is left alone, and `exit_behavior="answer"` that a stopped agent can
end with its own answer.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from loop_guard._config import LoopGuardConfig
from loop_guard._guard import LoopGuard
from loop_guard._langchain import (
    BLOCK_MARK,
    DUPLICATE_MARK,
    FINAL_ANSWER_MARK,
    STEER_MARK,
    is_marked,
)
from loop_guard._messages import GUARD_NAME
from loop_guard._readers import Conversation
from loop_guard.graph import LoopGuardNode
from loop_guard.scan import describe_cost, scan_conversation
from loop_guard.testing import ScriptedChatModel, capture_events, sequence, stubborn, with_usage
from loop_guard.tools import guard_tools

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TASK = "Summarise notes.md for me."
UNGUARDED_LIMIT = 200
"""Recursion limit for the unguarded run; `create_agent` itself allows 9,999 steps."""


class ModelError(Exception):
    """The chat model given to the demo failed (its provider rejected the call or could not be
    reached); the provider's own error is its `__cause__`."""


def _model_failures() -> Any:
    """The innermost middleware: what the model call itself raises becomes a `ModelError`,
    told apart from an error of the agent or of the guard around it."""
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def model_failures(request: Any, handler: Any) -> Any:
        try:
            return handler(request)
        except Exception as error:
            raise ModelError(str(error)) from error

    return model_failures


@dataclass
class Outcome:
    """What one run cost."""

    messages: list[BaseMessage]
    model_calls: int
    tool_runs: int
    ended_by: str


class Palette:
    """ANSI colours on a terminal, plain text when piped or with NO_COLOR set."""

    def __init__(self, stream: TextIO) -> None:
        self.enabled = stream.isatty() and "NO_COLOR" not in os.environ

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text


def demo_tools(runs: Counter[str]) -> list[BaseTool]:
    """A file reader (notes.md is missing), a directory listing and a job that progresses."""

    @tool
    def read_file(path: str) -> str:
        """Read a text file."""
        runs["read_file"] += 1
        if path == "notes.md":
            raise ToolException(f"File not found: {path}")
        return f"# {path}\nloop_guard stops agents that repeat themselves."

    read_file.handle_tool_error = True

    @tool
    def list_dir(path: str) -> str:
        """List a directory."""
        runs["list_dir"] += 1
        return "README.md  NOTES.md  src/"

    @tool
    def job_status(job: str) -> str:
        """Check a build job."""
        runs["job_status"] += 1
        return f"job {job}: {min(100, runs['job_status'] * 40)}% done"

    return [read_file, list_dir, job_status]


# Each reply reports its tokens, as a provider's does: what the guard charges a loop.
STUBBORN = with_usage(stubborn(("read_file", {"path": "notes.md"})), 1_150, 50)
ANSWERING = stubborn(
    ("read_file", {"path": "notes.md"}),
    answer="I could not read notes.md: it does not exist. The folder has NOTES.md; shall I "
    "summarise that one?",
)
HEALTHY = sequence(
    [("list_dir", {"path": "."})],
    [("read_file", {"path": "NOTES.md"})],
    [("job_status", {"job": "docs"})],
    [("job_status", {"job": "docs"})],
    [("job_status", {"job": "docs"})],
    answer="NOTES.md says loop_guard stops agents that repeat themselves; the docs job is done.",
)


def run_agent(model: BaseChatModel, middleware: Sequence[Any], limit: int = 10_000) -> Outcome:
    """`create_agent` with the demo tools; counts model calls and tool runs."""
    from langchain.agents import create_agent

    runs: Counter[str] = Counter()
    agent = create_agent(
        model, demo_tools(runs), middleware=list(middleware), checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "demo"}, "recursion_limit": limit}
    ended_by = "the model's answer"
    try:
        agent.invoke({"messages": [HumanMessage(TASK)]}, config)
    except GraphRecursionError:
        ended_by = f"LangGraph's recursion limit ({limit} steps)"
    messages = list(agent.get_state(config).values["messages"])
    if _guard_stopped(messages):
        answered = is_marked(messages[-1], FINAL_ANSWER_MARK)
        ended_by = "loop_guard, with the model's own answer" if answered else "loop_guard"
    return Outcome(messages, _model_calls(model, messages), sum(runs.values()), ended_by)


def run_graph(model: BaseChatModel) -> Outcome:
    """The hand-built graph: model -> guarded ToolNode -> LoopGuardNode."""
    runs: Counter[str] = Counter()
    guard = LoopGuard()
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    tools = guard_tools(demo_tools(runs), guard)
    builder.add_node("tools", ToolNode(tools))
    builder.add_node("loop_guard", LoopGuardNode(guard), destinations=("model", END))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "loop_guard")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "demo"}}
    messages = list(graph.invoke({"messages": [HumanMessage(TASK)]}, config)["messages"])
    ended_by = "loop_guard" if _guard_stopped(messages) else "the model's answer"
    return Outcome(messages, _model_calls(model, messages), sum(runs.values()), ended_by)


# A scripted person, asked twice: let the call run once more, then stop.
PERSON: tuple[tuple[str, dict[str, Any]], ...] = (
    ("approve: run it once more", {"decisions": [{"type": "approve"}]}),
    ("reject: stop now", {"decisions": [{"type": "reject"}]}),
)


def run_asking(model: ScriptedChatModel, out: TextIO, paint: Palette) -> Outcome:
    """The agent with `exit_behavior="ask"`, a scripted person answering its questions."""
    from langchain.agents import create_agent

    from loop_guard.middleware import LoopGuardMiddleware

    runs: Counter[str] = Counter()
    guard = LoopGuardMiddleware(exit_behavior="ask")
    agent = create_agent(model, demo_tools(runs), middleware=[guard], checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "demo"}}
    result = agent.invoke({"messages": [HumanMessage(TASK)]}, config)
    for said, answer in PERSON:
        pending = result.get("__interrupt__")
        if not pending:
            break
        facts = pending[0].value["loop_guard"]
        print(f"        {paint('guard  ? asks', '1;35')}     after {model.calls} model calls: "
              f"{facts['tool']} {facts['streak']} times in a row, {facts['blocks']} calls "
              "blocked; allow it once more, raise the limits, or stop?", file=out)  # fmt: skip
        print(f"        {paint('person', '1')} {said}", file=out)
        result = agent.invoke(Command(resume=answer), config)
    messages = list(result["messages"])
    ended_by = "the person, asked by loop_guard" if _guard_stopped(messages) else "the model"
    return Outcome(messages, _model_calls(model, messages), sum(runs.values()), ended_by)


def _cost_line(middleware: Any) -> str:
    cost = middleware.guard.stats.cost
    return (
        f"{cost.model_calls} model calls, {cost.tool_runs} tool runs and {cost.tokens:,} "
        f"tokens spent in the loop; {cost.tool_runs_saved} tool runs blocked"
    )


def _guard_stopped(messages: Sequence[BaseMessage]) -> bool:
    last = messages[-1] if messages else None
    return isinstance(last, AIMessage) and last.name == GUARD_NAME


def _model_calls(model: BaseChatModel, messages: Sequence[BaseMessage]) -> int:
    if isinstance(model, ScriptedChatModel):
        return model.calls
    return sum(isinstance(m, AIMessage) and m.name != GUARD_NAME for m in messages)


@dataclass(frozen=True)
class ChartRun:
    """One run of the stubborn agent, model call by model call."""

    tool_runs: tuple[int, ...]
    """Tool runs so far after each model call: `tool_runs[0]` after the 1st."""
    model_calls: int
    ended_by: str


@dataclass(frozen=True)
class DemoChart:
    """What the demo's chart shows: both runs, and where the guard stepped in.

    The interventions are the model calls whose tool call the guard's own events name
    (`GuardEvent.call_id`), numbered from 1 like `ChartRun.tool_runs`.
    """

    unguarded: ChartRun
    guarded: ChartRun
    steers: tuple[int, ...]
    blocks: tuple[int, ...]
    stop: int | None


def chart_data() -> DemoChart:
    """Run the stubborn agent without and with `LoopGuardMiddleware`, as the demo does."""
    from loop_guard.middleware import LoopGuardMiddleware

    unguarded = run_agent(ScriptedChatModel(script=STUBBORN), [], limit=UNGUARDED_LIMIT)
    middleware = LoopGuardMiddleware()
    with capture_events(middleware.guard) as events:
        guarded = run_agent(ScriptedChatModel(script=STUBBORN), [middleware])
    made_by = _model_call_of_each_tool_call(guarded.messages)

    def model_calls(kind: str) -> tuple[int, ...]:
        return tuple(
            made_by[event.call_id]
            for event in events
            if event.kind == kind and event.call_id in made_by
        )

    stops = model_calls("stop")
    return DemoChart(
        unguarded=_chart_run(unguarded),
        guarded=_chart_run(guarded),
        steers=model_calls("steer"),
        blocks=model_calls("block"),
        stop=stops[0] if stops else None,
    )


def _model_call_of_each_tool_call(messages: Sequence[BaseMessage]) -> dict[str, int]:
    """Each tool call's id, and the model call (from 1) whose reply made it."""
    replies = [m for m in messages if isinstance(m, AIMessage) and m.name != GUARD_NAME]
    return {
        call["id"]: number
        for number, reply in enumerate(replies, start=1)
        for call in reply.tool_calls
        if call["id"] is not None
    }


def _chart_run(outcome: Outcome) -> ChartRun:
    made_by = _model_call_of_each_tool_call(outcome.messages)
    runs_by_call = Counter(
        made_by[m.tool_call_id]
        for m in outcome.messages
        if isinstance(m, ToolMessage)
        and m.tool_call_id in made_by
        and not is_marked(m, BLOCK_MARK)
        and not is_marked(m, DUPLICATE_MARK)
    )
    cumulative: list[int] = []
    for number in range(1, outcome.model_calls + 1):
        cumulative.append((cumulative[-1] if cumulative else 0) + runs_by_call[number])
    return ChartRun(tuple(cumulative), outcome.model_calls, outcome.ended_by)


GUARDED_COLOUR = "#1f6fb4"
UNGUARDED_COLOUR = "#d1495b"
STEER_COLOUR = "#e69f00"
STOP_COLOUR = "#2d2d2d"


def plot_demo(ax: Axes, chart: DemoChart | None = None) -> DemoChart:
    """Draw the demo on `ax`: tool runs per model call, without and with the guard.

    The guarded run is shown in full, and the runaway for twice as long, with what it
    cost in the end. Needs matplotlib (in the `dev` extra); returns the data drawn.
    """
    chart = chart_data() if chart is None else chart
    guarded, unguarded = chart.guarded, chart.unguarded
    shown = min(unguarded.model_calls, 2 * guarded.model_calls)
    calls = range(1, shown + 1)
    # Drawn over the guarded line, thinner: where the two runs agree, both show.
    ax.plot(
        calls,
        unguarded.tool_runs[:shown],
        color=UNGUARDED_COLOUR,
        linewidth=2,
        marker="o",
        markersize=3.5,
        label="without loop_guard",
        zorder=3,
    )
    limit = "recursion limit" in unguarded.ended_by
    ax.annotate(
        f"unguarded: {unguarded.model_calls} model calls, {unguarded.tool_runs[-1]} tool "
        f"runs\n({'recursion limit' if limit else unguarded.ended_by})",
        xy=(shown + 0.45, unguarded.tool_runs[shown - 1] + 0.45),
        xytext=(shown - 0.6, unguarded.tool_runs[shown - 1] + 1.2),
        ha="right",
        va="center",
        color=UNGUARDED_COLOUR,
        fontweight="bold",
        arrowprops={"arrowstyle": "-|>", "color": UNGUARDED_COLOUR, "linewidth": 1.6},
        annotation_clip=False,
    )
    ax.plot(
        range(1, guarded.model_calls + 1),
        guarded.tool_runs,
        color=GUARDED_COLOUR,
        linewidth=5,
        marker="o",
        markersize=8,
        label="with LoopGuardMiddleware",
        zorder=2,
    )

    def runs_at(call: int) -> int:
        return guarded.tool_runs[call - 1]

    ax.scatter(
        chart.steers,
        [runs_at(call) for call in chart.steers],
        s=220,
        marker="^",
        color=STEER_COLOUR,
        edgecolor="white",
        linewidth=1.2,
        label="steer: told to change course",
        zorder=4,
    )
    for call in chart.steers:
        ax.annotate(
            "steer",
            xy=(call, runs_at(call)),
            xytext=(call - 0.9, runs_at(call) + 2.4),
            color=STEER_COLOUR,
            fontweight="bold",
            ha="center",
            arrowprops={"arrowstyle": "-", "color": STEER_COLOUR},
        )
    ax.scatter(
        chart.blocks,
        [runs_at(call) for call in chart.blocks],
        s=120,
        marker="X",
        color=GUARDED_COLOUR,
        edgecolor="white",
        linewidth=1,
        label="blocked: the call was not run",
        zorder=4,
    )
    if chart.blocks:
        first, last = min(chart.blocks), max(chart.blocks)
        ax.annotate(
            f"calls {first}\N{EN DASH}{last} blocked" if last > first else f"call {first} blocked",
            xy=((first + last) / 2, runs_at(last)),
            xytext=((first + last) / 2 - 0.15, runs_at(last) - 0.9),
            color=GUARDED_COLOUR,
            ha="center",
            va="top",
        )
    if chart.stop is not None:
        ax.vlines(
            chart.stop,
            0,
            runs_at(chart.stop) + 1.5,
            color=STOP_COLOUR,
            linestyle=(0, (4, 3)),
            linewidth=1.4,
            label="stop: the request ended",
            zorder=1,
        )
        ax.annotate(
            f"stop: {guarded.model_calls} model calls,\n{guarded.tool_runs[-1]} tool runs",
            xy=(chart.stop, runs_at(chart.stop)),
            xytext=(chart.stop + 0.3, runs_at(chart.stop) - 1.6),
            color=STOP_COLOUR,
            fontweight="bold",
            ha="left",
            va="center",
        )
    ax.set_xlim(0.4, shown + 0.6)
    ax.set_ylim(0, unguarded.tool_runs[shown - 1] + 2.5)
    ax.set_xticks(list(calls))
    ax.set_xlabel("model call")
    ax.set_ylabel("tool runs (cumulative)")
    ax.set_title("A stubborn agent re-reading a missing file", loc="left", fontweight="bold")
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper left", frameon=False)
    return chart


def print_timeline(outcome: Outcome, paint: Palette, out: TextIO, *, limit: int = 40) -> None:
    """Each model turn, each tool result, and where the guard stepped in."""
    turn = 0
    lines: list[str] = []
    for message in outcome.messages:
        if is_marked(message, FINAL_ANSWER_MARK) and isinstance(message, AIMessage):
            turn += 1
            lines.append(f"turn {turn:>2}  model  {paint(f'✓ {message.content}', '32')}")
        elif is_marked(message, FINAL_ANSWER_MARK):
            lines.append(
                f"        {paint('guard  ■ stopped', '1;31')}  asked the model for its answer, "
                "with no tools"
            )
        elif isinstance(message, AIMessage) and message.name == GUARD_NAME:
            lines.append(f"        {paint('guard  ■ stopped', '1;31')}  {message.content}")
        elif isinstance(message, AIMessage):
            turn += 1
            calls = ", ".join(
                f"{c['name']}({', '.join(f'{k}={v!r}' for k, v in c['args'].items())})"
                for c in message.tool_calls
            )
            said = f"→ {calls}" if calls else paint(f"✓ {message.content}", "32")
            lines.append(f"turn {turn:>2}  model  {said}")
        elif isinstance(message, ToolMessage) and is_marked(message, BLOCK_MARK):
            lines.append(f"        {paint('guard  ⛔ blocked', '31')}  the call was not run")
        elif isinstance(message, ToolMessage):
            text = str(message.content).split("\n\n")[0].replace("\n", " ")
            mark = "✗" if message.status == "error" else "·"
            lines.append(f"        tool   {paint(f'{mark} {text}', '2')}")
            if is_marked(message, STEER_MARK):
                lines.append(f"        {paint('guard  ⚠ steer', '33')}    appended to this result")
        elif isinstance(message, HumanMessage) and message.name == GUARD_NAME:
            lines.append(f"        {paint('guard  ⚠ steer', '33')}    {message.content[:78]}…")
    if len(lines) > limit:
        hidden = len(lines) - limit + 6
        lines = [*lines[: limit - 6], f"        … {hidden} more lines of the same …", *lines[-5:]]
    for line in lines:
        print(line, file=out)
    print(
        f"        {outcome.model_calls} model calls, {outcome.tool_runs} tool runs, "
        f"ended by {outcome.ended_by}",
        file=out,
    )


def run_demo(out: TextIO = sys.stdout, model: BaseChatModel | None = None) -> int:
    """Run the whole demo; returns the process exit status."""
    from loop_guard.middleware import LoopGuardMiddleware

    logging.getLogger("loop_guard").addHandler(logging.NullHandler())  # the timeline says it all
    paint = Palette(out)

    def heading(text: str) -> None:
        print(f"\n{paint(text, '1;36')}", file=out)

    if model is not None:
        heading(f"Your model, guarded by LoopGuardMiddleware — task: {TASK!r}")
        print_timeline(run_agent(model, [LoopGuardMiddleware(), _model_failures()]), paint, out)
        return 0

    heading("1. A stubborn agent WITHOUT loop_guard (create_agent, scripted model)")
    unguarded = run_agent(ScriptedChatModel(script=STUBBORN), [], limit=UNGUARDED_LIMIT)
    print_timeline(unguarded, paint, out, limit=12)

    heading("2. The same agent with LoopGuardMiddleware — one line: middleware=[...]")
    middleware = LoopGuardMiddleware()
    guarded = run_agent(ScriptedChatModel(script=STUBBORN), [middleware])
    print_timeline(guarded, paint, out)
    print(f"        What the loop cost (guard.stats.cost): {_cost_line(middleware)}", file=out)

    heading("3. The same agent as a hand-built graph: guard_tools + LoopGuardNode")
    graph = run_graph(ScriptedChatModel(script=STUBBORN))
    print_timeline(graph, paint, out)

    heading("4. A healthy agent with LoopGuardMiddleware: polling that progresses is untouched")
    healthy = run_agent(ScriptedChatModel(script=HEALTHY), [LoopGuardMiddleware()])
    print_timeline(healthy, paint, out)

    heading('5. The stubborn agent, LoopGuardMiddleware(exit_behavior="answer"): its own answer')
    answered = run_agent(
        ScriptedChatModel(script=ANSWERING), [LoopGuardMiddleware(exit_behavior="answer")]
    )
    print_timeline(answered, paint, out)

    heading('6. The stubborn agent, LoopGuardMiddleware(exit_behavior="ask"): a person decides')
    asked = run_asking(ScriptedChatModel(script=STUBBORN), out, paint)
    print(
        f"        {asked.model_calls} model calls, {asked.tool_runs} tool runs, "
        f"ended by {asked.ended_by}",
        file=out,
    )

    heading("Totals")
    saved_calls = unguarded.model_calls - guarded.model_calls
    saved_runs = unguarded.tool_runs - guarded.tool_runs
    scanned = scan_conversation(LoopGuardConfig(), Conversation("unguarded", unguarded.messages))
    print(
        f"Without the guard the stubborn agent made {unguarded.model_calls} model calls and "
        f"{unguarded.tool_runs} tool runs before {unguarded.ended_by} stopped it\n"
        f"(create_agent's own limit is 9,999 steps: about 5,000 model calls).\n"
        f"With loop_guard: {guarded.model_calls} model calls and {guarded.tool_runs} tool runs. "
        + paint(f"Saved {saved_calls} model calls and {saved_runs} tool runs.", "1;32")
        + "\nThe scan of the unguarded run measures the same (loop-guard scan):\n"
        + textwrap.indent(describe_cost(scanned.cost), "  ")
        + f"\nThe healthy agent: {healthy.model_calls} model calls, nothing steered or blocked.",
        file=out,
    )
    interventions = sum(
        isinstance(m, ToolMessage) and is_marked(m, BLOCK_MARK) for m in healthy.messages
    ) + sum(isinstance(m, HumanMessage) and m.name == GUARD_NAME for m in healthy.messages)
    stopped = (
        guarded.ended_by == "loop_guard"
        and answered.ended_by.startswith("loop_guard,")
        and asked.ended_by.startswith("the person")
    )
    return 0 if interventions == 0 and stopped else 1
