"""`guard_tools` over eight kinds of tool in a real LangGraph `ToolNode` graph.

Only the chat model is scripted. A wrapped tool must behave exactly like the tool it
wraps until the guard refuses a call; a refusal is an error result, never a crash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, ToolRuntime, tools_condition
from langgraph.types import Command
from pydantic import BaseModel

from loop_guard import LoopGuard, LoopGuardStop, guard_tools
from loop_guard.testing import ScriptedChatModel
from tests.support.agents import ToolRuns

BLOCKED = "LOOP GUARD: this call was blocked"
MODES = ("invoke", "ainvoke")


def plain(runs: ToolRuns) -> BaseTool:
    @tool
    def read_plain(path: str) -> str:
        """Read a file."""
        runs.hit("body")
        return f"plain:{path}"

    return read_plain


def async_only(runs: ToolRuns) -> BaseTool:
    @tool
    async def read_async(path: str) -> str:
        """Read a file, asynchronously."""
        runs.hit("body")
        return f"async:{path}"

    return read_async


def sync_and_async(runs: ToolRuns) -> BaseTool:
    def read(path: str) -> str:
        runs.hit("body")
        return f"both-sync:{path}"

    async def aread(path: str) -> str:
        runs.hit("body")
        return f"both-async:{path}"

    return StructuredTool.from_function(
        func=read, coroutine=aread, name="read_both", description="Read a file."
    )


def injected_state(runs: ToolRuns) -> BaseTool:
    @tool
    def read_state(path: str, state: Annotated[dict, InjectedState]) -> str:
        """Read a file for the user's question."""
        runs.hit("body")
        return f"{path} for {state['messages'][0].content}"

    return read_state


def tool_runtime(runs: ToolRuns) -> BaseTool:
    @tool
    def read_runtime(path: str, runtime: ToolRuntime) -> str:
        """Read a file for the user's question."""
        runs.hit("body")
        return f"{path} for {runtime.state['messages'][0].content}"

    return read_runtime


def command(runs: ToolRuns) -> BaseTool:
    @tool
    def read_command(path: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Read a file into the state."""
        runs.hit("body")
        message = ToolMessage(f"command:{path}", tool_call_id=tool_call_id, name="read_command")
        return Command(update={"messages": [message], "note": f"read {path}"})

    return read_command


def artifact(runs: ToolRuns) -> BaseTool:
    @tool(response_format="content_and_artifact")
    def read_artifact(path: str) -> tuple[str, dict]:
        """Read a file; the raw lines are the artifact."""
        runs.hit("body")
        return f"artifact:{path}", {"path": path, "lines": [1, 2, 3]}

    return read_artifact


class PathArgs(BaseModel):
    path: str


class CustomRead(BaseTool):
    name: str = "read_custom"
    description: str = "Read a file."
    args_schema: type[BaseModel] = PathArgs
    runs: Any

    def _run(self, path: str) -> str:
        self.runs.hit("body")
        return f"custom-sync:{path}"

    async def _arun(self, path: str) -> str:
        self.runs.hit("body")
        return f"custom-async:{path}"


KINDS: dict[str, Callable[[ToolRuns], BaseTool]] = {
    "plain": plain,
    "async_only": async_only,
    "sync_and_async": sync_and_async,
    "injected_state": injected_state,
    "tool_runtime": tool_runtime,
    "command": command,
    "artifact": artifact,
    "custom": lambda runs: CustomRead(runs=runs),
}
# The content each kind answers with for path "x", by mode: the async path must run.
EXPECTED = {
    "plain": ("plain:x", "plain:x"),
    "async_only": (None, "async:x"),
    "sync_and_async": ("both-sync:x", "both-async:x"),
    "injected_state": ("x for question", "x for question"),
    "tool_runtime": ("x for question", "x for question"),
    "command": ("command:x", "command:x"),
    "artifact": ("artifact:x", "artifact:x"),
    "custom": ("custom-sync:x", "custom-async:x"),
}
RUNNABLE = [(k, m) for k in KINDS for m in MODES if EXPECTED[k][MODES.index(m)] is not None]
STATELESS = [(k, m) for k, m in RUNNABLE if k not in ("injected_state", "tool_runtime")]


class State(MessagesState):
    note: str  # written by the `Command` tool


def repeating(name: str, turns: int | None) -> Callable[[Any, int], AIMessage]:
    """A model that makes the same call `turns` times (forever if None), then answers."""

    def script(messages: Any, index: int) -> AIMessage:
        if turns is not None and index >= turns:
            return AIMessage(content="done")
        call = {"name": name, "args": {"path": "x"}, "id": f"call_{index}", "type": "tool_call"}
        return AIMessage(content="", tool_calls=[call])

    return script


def build_graph(tool_: BaseTool, turns: int | None, checkpointer: Any = None) -> tuple[Any, Any]:
    model = ScriptedChatModel(script=repeating(tool_.name, turns))
    graph = StateGraph(State)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([tool_]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer), model


async def run(graph: Any, mode: str, config: Any = None) -> dict[str, Any]:
    payload = {"messages": [HumanMessage("question")]}
    if mode == "invoke":
        return graph.invoke(payload, config)
    return await graph.ainvoke(payload, config)


STATE_KEY = "loop_guard_state"  # docs/deploying.md: the record in `response_metadata`


def without_ids(state: dict[str, Any]) -> dict[str, Any]:
    """The final state, message ids left out (they are fresh in every run), and the
    guard's record of its state, which a wrapped tool's message carries in addition."""
    dumps = [m.model_dump(exclude={"id"}) for m in state["messages"]]
    for dump in dumps:
        dump.get("response_metadata", {}).pop(STATE_KEY, None)
    return {**state, "messages": dumps}


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def wrapped(kind: str, runs: ToolRuns) -> BaseTool:
    [guarded] = guard_tools([KINDS[kind](runs)], LoopGuard())
    return guarded


def tool_call(name: str, call_id: str) -> dict[str, Any]:
    return {"name": name, "args": {"path": "x"}, "id": call_id, "type": "tool_call"}


@pytest.mark.parametrize("kind", KINDS)
def test_model_facing_schema_is_unchanged(kind):
    """The model sees the wrapped tool exactly as it would see the original."""
    original = KINDS[kind](ToolRuns())
    [guarded] = guard_tools([original], LoopGuard())
    assert convert_to_openai_tool(guarded) == convert_to_openai_tool(original)
    assert (guarded.name, guarded.description) == (original.name, original.description)


@pytest.mark.parametrize(("kind", "mode"), RUNNABLE)
async def test_wrapped_tool_answers_like_the_original(kind, mode):
    """One call through a ToolNode gives the same tool message and state as unwrapped."""
    original_runs, wrapped_runs = ToolRuns(), ToolRuns()
    expected = await run(build_graph(KINDS[kind](original_runs), turns=1)[0], mode)
    actual = await run(build_graph(wrapped(kind, wrapped_runs), turns=1)[0], mode)
    assert without_ids(actual) == without_ids(expected)
    [message] = tool_messages(actual)
    [reference] = tool_messages(expected)
    assert message.content == EXPECTED[kind][MODES.index(mode)]
    for field in ("content", "artifact", "status", "name", "tool_call_id"):
        assert getattr(message, field) == getattr(reference, field), field
    assert message.status == "success"
    assert message.tool_call_id == "call_0"
    if kind == "artifact":
        assert message.artifact == {"path": "x", "lines": [1, 2, 3]}
    if kind == "command":
        assert actual["note"] == "read x"
    assert wrapped_runs.counts["body"] == original_runs.counts["body"] == 1


async def test_async_only_tool_fails_under_sync_invoke_like_the_original():
    """An async-only tool under graph.invoke raises the same error wrapped or not."""
    errors = []
    for tool_ in (async_only(ToolRuns()), wrapped("async_only", ToolRuns())):
        with pytest.raises(NotImplementedError) as caught:
            await run(build_graph(tool_, turns=1)[0], "invoke")
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]


@pytest.mark.parametrize(("kind", "mode"), RUNNABLE)
async def test_stubborn_model_gets_three_blocked_results(kind, mode):
    """The body runs 4 times; identical calls 5-7 get a blocked error result, no crash."""
    runs = ToolRuns()
    state = await run(build_graph(wrapped(kind, runs), turns=7)[0], mode)
    assert runs.counts["body"] == 4
    results = tool_messages(state)
    assert [m.tool_call_id for m in results] == [f"call_{i}" for i in range(7)]
    assert [m.status for m in results] == ["success"] * 4 + ["error"] * 3
    for message in results[:4]:
        assert str(message.content).startswith(EXPECTED[kind][MODES.index(mode)])
    for message in results[4:]:
        assert str(message.content).startswith(BLOCKED)
        assert message.name == results[0].name
    assert state["messages"][-1].content == "done"


@pytest.mark.parametrize(("kind", "mode"), RUNNABLE)
async def test_stubborn_model_on_a_thread_stops_at_the_eighth_call(kind, mode):
    """Without a LoopGuardNode the model is called after the 3rd block; call 8 stops."""
    runs = ToolRuns()
    graph, model = build_graph(wrapped(kind, runs), turns=None, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"{kind}-{mode}"}}
    with pytest.raises(LoopGuardStop) as caught:
        await run(graph, mode, config)
    assert caught.value.stop.reason == "abort_threshold"
    assert runs.counts["body"] == 4
    assert model.calls == 8
    saved = graph.get_state(config).values
    results = tool_messages(saved)
    assert [m.status for m in results] == ["success"] * 4 + ["error"] * 3
    assert all(str(m.content).startswith(BLOCKED) for m in results[4:])
    assert saved["messages"][-1].tool_calls[0]["id"] == "call_7"


@pytest.mark.parametrize(("kind", "mode"), STATELESS)
async def test_direct_tool_call_is_blocked_the_fifth_time(kind, mode):
    """A fifth identical tool call on one thread is blocked without running the tool."""
    runs = ToolRuns()
    guarded = wrapped(kind, runs)
    original = KINDS[kind](ToolRuns())
    config = {"configurable": {"thread_id": "t"}}

    async def call(tool_: BaseTool, call_id: str) -> Any:
        if mode == "invoke":
            return tool_.invoke(tool_call(guarded.name, call_id), config)
        return await tool_.ainvoke(tool_call(guarded.name, call_id), config)

    for n in range(1, 5):
        output, reference = await call(guarded, f"c{n}"), await call(original, f"c{n}")
        assert type(output) is type(reference)
        assert repr(output) == repr(reference) or n == 3  # the 3rd carries the steer
    assert runs.counts["body"] == 4
    for n in range(5, 8):
        blocked = await call(guarded, f"c{n}")
        assert isinstance(blocked, ToolMessage)
        assert blocked.status == "error"
        assert blocked.tool_call_id == f"c{n}"
        assert str(blocked.content).startswith(BLOCKED)
    assert runs.counts["body"] == 4
    with pytest.raises(LoopGuardStop):
        await call(guarded, "c8")
    assert runs.counts["body"] == 4


@pytest.mark.parametrize(("kind", "mode"), [(k, m) for k, m in STATELESS if k != "command"])
async def test_direct_call_without_config_just_runs_the_tool(kind, mode):
    """Outside any conversation the guard stays out of the way: every call runs."""
    runs = ToolRuns()
    guarded, original = wrapped(kind, runs), KINDS[kind](ToolRuns())
    for _ in range(8):
        if mode == "invoke":
            output, reference = guarded.invoke({"path": "x"}), original.invoke({"path": "x"})
        else:
            output = await guarded.ainvoke({"path": "x"})
            reference = await original.ainvoke({"path": "x"})
        assert output == reference
    assert runs.counts["body"] == 8


def failing(error: ValueError) -> BaseTool:
    @tool
    def read_broken(path: str) -> str:
        """Read a file that cannot be read."""
        raise error

    return read_broken


async def call_failing(tool_: BaseTool, where: str, mode: str) -> Any:
    config = {"configurable": {"thread_id": "t"}}
    if where == "graph":
        return await run(build_graph(tool_, turns=1)[0], mode, config)
    if mode == "invoke":
        return tool_.invoke(tool_call(tool_.name, "c1"), config)
    return await tool_.ainvoke(tool_call(tool_.name, "c1"), config)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["direct", "graph"])
async def test_plain_exception_propagates_unchanged(where, mode):
    """A ValueError from the tool body escapes exactly as it does from the unwrapped tool."""
    for guard in (None, LoopGuard()):
        error = ValueError("disk on fire")
        tool_ = failing(error) if guard is None else guard_tools([failing(error)], guard)[0]
        with pytest.raises(ValueError, match="disk on fire") as caught:
            await call_failing(tool_, where, mode)
        assert caught.value is error
