"""The callback handler on real LangGraph graphs: beside wrapped tools in `create_agent`,
alone, with the node, and the memory it keeps per thread and per run."""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardStop,
    guard_tools,
)
from loop_guard.testing import (
    ScriptedChatModel,
    capture_events,
    sequence,
    stubborn,
)
from tests.support.agents import (
    READ_NOTES,
    THREAD,
    Guarded,
    Mode,
    ToolRuns,
    ask,
    blocked,
    build_graph,
    current_request,
    final_stop,
    make_tools,
    needs_async_context,
    run,
)


@pytest.mark.parametrize("mode", ["invoke", pytest.param("ainvoke", marks=needs_async_context)])
def test_create_agent_with_wrapped_tools_and_the_handler(mode: Mode) -> None:
    """Blocks reach the model as error results; the abort stops the next model call."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(model, guard_tools(make_tools(runs), guard), checkpointer=InMemorySaver())
    config = {**THREAD, "callbacks": [LoopGuardCallbackHandler(guard)]}
    with capture_events(guard) as events, pytest.raises(LoopGuardStop) as raised:
        run(agent, ask(), config, mode)
    assert raised.value.stop.reason == "abort_threshold"
    assert runs.counts["read_file"] == 4
    assert model.calls == 7  # the 8th model call was refused, not made
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    messages = agent.get_state(THREAD).values["messages"]
    assert len(blocked(messages)) == 3
    assert "LOOP GUARD: you have called" in str(messages[6].content)  # steer on the 3rd result


def test_handler_alone_observes_and_emits_events() -> None:
    """The handler by itself counts steps (warn events) but blocks nothing."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=sequence(*[[READ_NOTES]] * 4))
    agent = create_agent(model, make_tools(runs), checkpointer=InMemorySaver())
    with capture_events(guard) as events:
        agent.invoke(ask(), {**THREAD, "callbacks": [LoopGuardCallbackHandler(guard)]})
    assert runs.counts["read_file"] == 4
    assert [(e.kind, e.streak, e.conversation) for e in events] == [("steer", 3, "t")]


def test_handler_wrapper_and_node_together_count_each_step_once() -> None:
    """All three pieces combined: every event exactly once."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    graph = build_graph(model, make_tools(runs), guard, checkpointer=InMemorySaver())
    config = {**THREAD, "callbacks": [LoopGuardCallbackHandler(guard)]}
    for mode in ("invoke", "astream"):
        with capture_events(guard) as events:
            messages = run(graph, ask(), config, mode)  # type: ignore[arg-type]
        assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
        assert final_stop(messages) is not None
    assert runs.counts["read_file"] == 8


@pytest.mark.memory
def test_handler_without_a_thread_keys_the_run() -> None:
    """Outside a thread the handler's conversation is the top-level run, freed at its end."""
    guard = LoopGuard()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    graph = build_graph(model, make_tools(ToolRuns()), guard)
    with capture_events(guard) as events:
        graph.invoke(ask(), {"callbacks": [LoopGuardCallbackHandler(guard)]})
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert {e.conversation for e in events} == {events[0].conversation}
    assert events[0].conversation.startswith("run:")
    assert guard._conversations.states == {}  # the finished run's state was released


@pytest.mark.memory
def test_the_handler_keeps_a_thread_across_its_runs_and_frees_a_run_outside_one() -> None:
    """A thread's state outlives the run (a resume keeps what a trimmed history lost),
    one entry per thread; the next request on the thread still starts fresh. A run
    outside any thread is freed when it ends."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    handler = LoopGuardCallbackHandler(guard)
    build_graph(model, make_tools(runs), guard).invoke(ask(), {"callbacks": [handler]})
    assert guard._conversations.states == {}
    runs.counts.clear()
    graph = build_graph(model, make_tools(runs), guard, checkpointer=InMemorySaver())
    config = {**THREAD, "callbacks": [handler]}
    for request in (1, 2):
        messages = graph.invoke(ask(), config)["messages"]
        assert list(guard._conversations.states) == [THREAD["configurable"]["thread_id"]]
        assert runs.counts["read_file"] == 4 * request
        assert len(blocked(current_request(messages))) == 3


def test_the_handler_memory_stays_bounded_with_subagents() -> None:
    """A handler watching a caller that runs a subagent inside a tool, 30 requests: what it
    keeps per conversation stays within the guard's bound, and no run outlives its request,
    not even the model run a stop refused."""
    from tests.faces.multi_agent.test_namespaces import caller_with_subagent

    shared = Guarded("handler")
    shared.guard.max_conversations = 5
    caller, _, _ = caller_with_subagent(
        shared, ["find notes"], pass_config=True, checkpointer=InMemorySaver()
    )
    for n in range(30):
        shared.run(caller, f"go {n}", "invoke")
    handler = shared.handler
    assert len(handler._claimed) <= 5
    assert sum(map(len, handler._claimed.values())) <= 10
    assert handler._runs == {}
