"""One guard shared by several agents of one thread: each agent is a conversation of its own.

A LangGraph thread can hold several agents: sibling subgraphs of a parent graph (a
supervisor and a worker), or an agent a tool invokes (the task-tool subagent pattern,
also run twice at once by parallel tool calls). They share the thread id, not their
streaks: a stuck worker must be stopped alone, its stop must not reach the agent that
called it nor a sibling that runs after it, and the events of each must say which
conversation they belong to.

Every face is covered with one shared guard: `LoopGuardMiddleware` (one instance in every
agent), `guard_tools` + `LoopGuardNode` (hand-built graphs), `guard_tools` +
`LoopGuardCallbackHandler` (`create_agent` agents). Only the chat models are scripted.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Sequence
from typing import Annotated, Any
from uuid import UUID

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardStop,
)
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import Script, ScriptedChatModel, stubborn, tool_calls_message
from tests.support.agents import (
    FACES,
    LIST_DIR,
    MODES,
    READ_NOTES,
    Face,
    Guarded,
    Mode,
    ToolRuns,
    assert_valid_history,
    current_request,
    faces_and_modes,
    make_tools,
)

# Sync and async runs on each face; async handler runs need Python 3.11's run context.
FACES_MODES = faces_and_modes(FACES, MODES[:2], "handler")
THREAD = "t"
STOPPED = [("steer", "read_file"), *[("block", "read_file")] * 3, ("stop", "read_file")]
STEERED = [("steer", "list_dir")]


def told_to_stop(messages: Sequence[BaseMessage]) -> bool:
    """Whether the guard steered: a steer message, or a steer inside a tool result."""
    return any(
        (isinstance(m, HumanMessage) and m.name == GUARD_NAME)
        or (isinstance(m, ToolMessage) and "LOOP GUARD" in str(m.content))
        for m in messages
    )


def ran(messages: Sequence[BaseMessage], tool: str) -> list[ToolMessage]:
    """The answers of `tool` calls (run or refused) in these messages."""
    return [m for m in messages if isinstance(m, ToolMessage) and m.name == tool]


def stops(messages: Sequence[BaseMessage]) -> list[AIMessage]:
    return [m for m in messages if isinstance(m, AIMessage) and m.name == GUARD_NAME]


# --- sibling subgraphs ------------------------------------------------------------------


def supervisor_script() -> Script:
    """Lists the directory until steered and hands over; once the worker has read, checks
    a job once and answers. Each request lists a path of its own (the request's text)."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        request = current_request(messages)
        if not ran(request, "read_file"):
            if told_to_stop(request):
                return AIMessage("over to the worker")
            users = [m for m in messages if isinstance(m, HumanMessage) and m.name != GUARD_NAME]
            return tool_calls_message(("list_dir", {"path": str(users[-1].content)}))
        last = messages[-1]
        if isinstance(last, ToolMessage) and last.name == "job_status":
            return AIMessage("supervisor done")
        return tool_calls_message(("job_status", {"job": "report"}))

    return script


def stuck() -> Script:
    """Reads the file the request names, forever: each request loops on a call of its
    own, so a request never looks like a return to the one before."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        users = [m for m in messages if isinstance(m, HumanMessage) and m.name != GUARD_NAME]
        return tool_calls_message(("read_file", {"path": f"{users[-1].content}.md"}))

    return script


def answer_after(tool: str, args: dict[str, Any], answer: str) -> Script:
    """Calls the tool once, then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage) and last.name == tool:
            return AIMessage(answer)
        return tool_calls_message((tool, args))

    return script


def siblings(
    guarded: Guarded, supervisor: Script, worker: Script, *, back_to_supervisor: bool
) -> tuple[Any, ToolRuns]:
    """A parent graph with two agents as sibling subgraph nodes, one saver on the parent.

    supervisor -> worker -> END; or, with `back_to_supervisor`, back to the supervisor,
    which ends the request once the worker has read (the worker's tool is `read_file`).
    """
    runs = ToolRuns()
    supervisor_agent, _ = guarded.agent(supervisor, make_tools(runs))
    worker_agent, _ = guarded.agent(worker, make_tools(runs))

    def route(state: MessagesState) -> str:
        return END if ran(current_request(state["messages"]), "read_file") else "worker"

    builder = StateGraph(MessagesState)
    builder.add_node("supervisor", supervisor_agent)
    builder.add_node("worker", worker_agent)
    builder.add_edge(START, "supervisor")
    if back_to_supervisor:
        builder.add_conditional_edges("supervisor", route, ["worker", END])
        builder.add_edge("worker", "supervisor")
    else:
        builder.add_edge("supervisor", "worker")
        builder.add_edge("worker", END)
    return builder.compile(checkpointer=InMemorySaver()), runs


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_a_stuck_worker_is_stopped_alone(face: Face, mode: Mode) -> None:
    """The worker is stopped after its own 4 runs; the supervisor, run again after it,
    works on (it is not stopped, nothing escapes the parent), and the next request on
    the thread goes the same way. The two agents' events are two conversations.

    Through the handler too: it ends the worker's subgraph at its stop, in place of the
    worker's next model call, and no `LoopGuardStop` escapes the parent.
    """
    guarded = Guarded(face)
    parent, runs = siblings(guarded, supervisor_script(), stuck(), back_to_supervisor=True)
    for request in (1, 2):
        since = len(guarded.events)
        messages = guarded.run(parent, f"request-{request}", mode)
        assert isinstance(messages[-1], AIMessage)
        assert messages[-1].content == "supervisor done"  # not a stop
        assert len(stops(current_request(messages))) == 1  # the worker's
        assert_valid_history(messages)
        assert runs.counts["job_status"] == request  # the supervisor's second turn ran
        assert runs.counts["list_dir"] == 3 * request
        assert runs.counts["read_file"] == 4 * request
        conversations = guarded.conversations(since)
        assert sorted(conversations.values()) == sorted([STEERED, STOPPED]), conversations


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_a_worker_does_not_inherit_its_siblings_stop(face: Face, mode: Mode) -> None:
    """The supervisor is stuck and stopped; the worker that runs after it is a new
    conversation: its call runs and it answers, nothing escapes the parent, and the next
    request on the thread goes the same way (no abort before its tool runs; through the
    handler, the supervisor's stop does not end the run before the worker)."""
    guarded = Guarded(face)
    worker = answer_after("job_status", {"job": "j"}, "worker done")
    parent, runs = siblings(guarded, stuck(), worker, back_to_supervisor=False)
    for request in (1, 2):
        since = len(guarded.events)
        messages = guarded.run(parent, f"request-{request}", mode)
        assert runs.counts["read_file"] == 4 * request
        assert runs.counts["job_status"] == request
        assert isinstance(messages[-1], AIMessage)
        assert messages[-1].content == "worker done"
        assert len(stops(current_request(messages))) == 1  # the supervisor's
        assert_valid_history(messages)
        assert list(guarded.conversations(since).values()) == [STOPPED]


# --- an agent invoked inside a tool (the task-tool subagent pattern) -------------------


def caller_script(*tasks: str) -> Script:
    """Lists the directory until steered, then hands every task to the subagent in one
    response (parallel tool calls when there are several), then answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        request = current_request(messages)
        if ran(request, "delegate"):
            return AIMessage("caller done")
        if told_to_stop(request):
            return tool_calls_message(*(("delegate", {"task": task}) for task in tasks))
        return tool_calls_message(LIST_DIR)

    return script


def delegate_tool(subagent: Any, *, pass_config: bool) -> BaseTool:
    """The task tool: runs the subagent on the task and returns its last message.

    A stop the subagent raises (the handler's way to end it) is its answer too.
    """

    def answer(output: dict[str, Any]) -> str:
        return str(output["messages"][-1].content)

    def delegate(task: str, config: RunnableConfig) -> str:
        try:
            output = subagent.invoke(
                {"messages": [HumanMessage(task)]}, config if pass_config else None
            )
        except LoopGuardStop as stop:
            return str(stop)
        return answer(output)

    async def adelegate(task: str, config: RunnableConfig) -> str:
        try:
            output = await subagent.ainvoke(
                {"messages": [HumanMessage(task)]}, config if pass_config else None
            )
        except LoopGuardStop as stop:
            return str(stop)
        return answer(output)

    return StructuredTool.from_function(
        func=delegate, coroutine=adelegate, name="delegate", description="Hand over a task."
    )


def caller_with_subagent(
    guarded: Guarded, tasks: Sequence[str], *, pass_config: bool, checkpointer: Any = None
) -> tuple[Any, ToolRuns, ScriptedChatModel]:
    """A caller whose `delegate` tool runs a stuck subagent (one guard)."""
    runs = ToolRuns()
    subagent, sub_model = guarded.agent(stubborn(READ_NOTES), make_tools(runs))
    tools = [*make_tools(runs), delegate_tool(subagent, pass_config=pass_config)]
    caller, _ = guarded.agent(caller_script(*tasks), tools, checkpointer=checkpointer)
    return caller, runs, sub_model


def assert_caller_went_on(messages: Sequence[BaseMessage], delegations: int) -> None:
    """The caller got each subagent's stop as a task result, and answered itself."""
    assert_valid_history(messages)
    results = ran(messages, "delegate")
    assert len(results) == delegations
    assert all(str(result.content).startswith("Stopped by loop_guard") for result in results)
    assert isinstance(messages[-1], AIMessage)
    assert messages[-1].content == "caller done"  # not stopped
    assert not stops(messages)


@pytest.mark.parametrize("pass_config", [True, False], ids=["config", "no-config"])
@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_a_subagent_run_inside_a_tool_is_a_conversation_of_its_own(
    face: Face, mode: Mode, pass_config: bool
) -> None:
    """The subagent is stopped after its own 4 runs; its stop is the tool's result, and
    the caller goes on and answers. The caller's events are the thread's; the
    subagent's are one conversation of their own, whether or not the tool passed its
    config on (LangGraph hands it on anyway)."""
    guarded = Guarded(face)
    caller, runs, sub_model = caller_with_subagent(
        guarded, ["find notes"], pass_config=pass_config, checkpointer=InMemorySaver()
    )
    messages = guarded.run(caller, "go", mode)
    assert_caller_went_on(messages, delegations=1)
    assert runs.counts["list_dir"] == 3
    assert runs.counts["read_file"] == 4
    assert sub_model.calls == 7
    conversations = guarded.conversations()
    assert conversations.get(THREAD) == STEERED, conversations
    assert sorted(conversations.values()) == sorted([STEERED, STOPPED]), conversations


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_parallel_runs_of_one_subagent_are_apart(face: Face, mode: Mode) -> None:
    """Two parallel tool calls run the same stuck subagent at once: each run is stopped
    after its own 4 runs, in a conversation of its own, and the caller answers."""
    guarded = Guarded(face)
    caller, runs, sub_model = caller_with_subagent(
        guarded, ["find notes", "find todos"], pass_config=True, checkpointer=InMemorySaver()
    )
    messages = guarded.run(caller, "go", mode)
    assert_caller_went_on(messages, delegations=2)
    assert runs.counts["read_file"] == 8
    assert sub_model.calls == 14
    conversations = guarded.conversations()
    assert conversations.get(THREAD) == STEERED, conversations
    assert sorted(conversations.values()) == sorted([STEERED, STOPPED, STOPPED]), conversations


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_a_subagent_run_inside_a_tool_outside_a_thread_is_apart(face: Face, mode: Mode) -> None:
    """Without a thread (no checkpointer) the subagent's run is still a conversation of
    its own, not the caller's top-level run: through the handler too, its stop does not
    stop the caller after the delegation (no `LoopGuardStop` out of the caller)."""
    guarded = Guarded(face)
    caller, runs, sub_model = caller_with_subagent(guarded, ["find notes"], pass_config=True)
    messages = guarded.run(caller, "go", mode, thread=False)
    assert_caller_went_on(messages, delegations=1)
    assert runs.counts["read_file"] == 4
    assert sub_model.calls == 7
    conversations = guarded.conversations()
    assert sorted(conversations.values()) == sorted([STEERED, STOPPED]), conversations


def test_a_subgraph_run_keeps_its_conversation_when_a_parent_run_ends_first() -> None:
    """Outside a thread, a subgraph's run belongs to the top-level run it started in,
    even once a run between them has ended."""
    top, tool_run, subgraph = (UUID(int=n) for n in (1, 2, 3))
    handler = LoopGuardCallbackHandler(LoopGuard())
    handler.start(top, None, {})
    handler.start(tool_run, top, {"langgraph_checkpoint_ns": "tools:x"})
    handler.start(subgraph, tool_run, {"langgraph_checkpoint_ns": "tools:x|agent:y|model:z"})
    expected = f"run:{top}|tools:x|agent:y"
    assert str(handler.conversation_of(subgraph)) == expected
    handler.end(tool_run)
    assert str(handler.conversation_of(subgraph)) == expected


# --- a Send fan-out: branches running one guarded agent -------------------------------


class FanOut(TypedDict):
    """The parent's state: the tasks to fan out, and each branch's answer."""

    tasks: list[str]
    results: Annotated[list[str], operator.add]


@pytest.mark.parametrize(("face", "mode"), FACES_MODES)
def test_a_stuck_send_branch_ends_alone_and_its_siblings_finish(face: Face, mode: Mode) -> None:
    """Three `Send` branches run one guarded agent; the one whose task is stuck is
    stopped after its own 4 runs and answers with the stop, the healthy ones answer as
    usual, and the parent's `invoke` completes. Through the handler too: the stuck
    branch's `LoopGuardStop` never escapes the parent to fail the whole map step."""
    guarded = Guarded(face)
    runs = ToolRuns()

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        task = str(messages[0].content)
        if task == "stuck":
            return tool_calls_message(READ_NOTES)
        return answer_after("list_dir", {"path": task}, f"{task} done")(messages, index)

    agent, _ = guarded.agent(script, make_tools(runs))

    def branch(state: dict[str, Any]) -> dict[str, Any]:
        output = agent.invoke({"messages": [HumanMessage(state["task"])]})
        return {"results": [f"{state['task']}: {output['messages'][-1].content}"]}

    async def abranch(state: dict[str, Any]) -> dict[str, Any]:
        output = await agent.ainvoke({"messages": [HumanMessage(state["task"])]})
        return {"results": [f"{state['task']}: {output['messages'][-1].content}"]}

    builder = StateGraph(FanOut)
    builder.add_node("branch", RunnableLambda(branch, afunc=abranch))
    fan_out = [Send("branch", {"task": task}) for task in ("a", "stuck", "b")]
    builder.add_conditional_edges(START, lambda state: fan_out, ["branch"])
    builder.add_edge("branch", END)
    parent = builder.compile(checkpointer=InMemorySaver())
    config: dict[str, Any] = {"configurable": {"thread_id": THREAD}}
    if face == "handler":
        config["callbacks"] = [guarded.handler]
    payload = {"tasks": ["a", "stuck", "b"]}
    if mode == "invoke":
        output = parent.invoke(payload, config)
    else:
        output = asyncio.run(parent.ainvoke(payload, config))
    results = dict(result.split(": ", 1) for result in output["results"])
    assert results["a"] == "a done"
    assert results["b"] == "b done"
    assert results["stuck"].startswith("Stopped by loop_guard")
    assert runs.counts["read_file"] == 4
    assert runs.counts["list_dir"] == 2
    assert list(guarded.conversations().values()) == [STOPPED]
