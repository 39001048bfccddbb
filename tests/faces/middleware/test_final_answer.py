"""A stopped request can end with the model's own answer, given with no tools
(`LoopGuardMiddleware(exit_behavior="answer")`, `LoopGuardNode(model=...)`); when that call
fails or the reply calls a tool, it ends with the guard's message."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelCallLimitMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from loop_guard import LoopGuard, LoopGuardMiddleware, LoopGuardNode
from loop_guard.marks import FINAL_ANSWER_MARK, GUARD_NAME
from loop_guard.testing import (
    ScriptedChatModel,
    asked_to_answer,
    capture_events,
    stubborn,
    tool_calls_message,
)
from tests.support.agents import (
    MODES,
    READ_NOTES,
    Mode,
    ToolRuns,
    ask,
    assert_valid_history,
    build_graph,
    final_stop,
    make_tools,
    run,
    timeline,
)

ANSWER = "I could not read notes.md: it does not exist. Check the path."
KINDS = ["steer", "block", "block", "block", "stop"]


answers_when_stopped = stubborn(READ_NOTES, answer=ANSWER)
calls_even_when_stopped = stubborn(READ_NOTES)


def fails_when_stopped(messages: Sequence[BaseMessage], index: int) -> AIMessage:
    if asked_to_answer(messages):
        msg = "provider overloaded"
        raise RuntimeError(msg)
    return tool_calls_message(READ_NOTES)


class Requests(AgentMiddleware):
    """Listed after the guard: sees every model request the guard sends, as sent."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[ModelRequest[Any]] = []

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse]
    ) -> ModelResponse:
        self.seen.append(request)
        return handler(request)

    async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> ModelResponse:
        self.seen.append(request)
        return await handler(request)


def build(
    script: Callable[[Sequence[BaseMessage], int], AIMessage],
    exit_behavior: Any = "answer",
    *,
    checkpointer: Any = None,
    extra: Sequence[AgentMiddleware] = (),
) -> tuple[Any, ScriptedChatModel, ToolRuns, LoopGuardMiddleware, Requests]:
    model, runs, requests = ScriptedChatModel(script=script), ToolRuns(), Requests()
    guard = LoopGuardMiddleware(exit_behavior=exit_behavior)
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[*extra, guard, requests],
        checkpointer=checkpointer or InMemorySaver(),
    )
    return agent, model, runs, guard, requests


@pytest.mark.parametrize("mode", MODES)
def test_a_stopped_request_ends_with_the_models_answer_given_without_tools(mode: Mode) -> None:
    """The model is asked once more, with no tools; its reply ends the run, marked as the
    guard's. The stop itself is the same as with the default end."""
    agent, model, runs, guard, requests = build(answers_when_stopped)
    with capture_events(guard.guard) as events:
        messages = run(agent, ask(), {"configurable": {"thread_id": "t"}}, mode)
    answer = final_stop(messages)
    assert answer is not None
    assert answer.text == ANSWER
    assert answer.response_metadata["loop_guard"] == FINAL_ANSWER_MARK
    asked = messages[-2]
    assert isinstance(asked, HumanMessage)
    assert asked.name == GUARD_NAME
    assert asked.response_metadata["loop_guard"] == FINAL_ANSWER_MARK
    assert "`read_file`" in asked.text
    assert_valid_history(messages)
    assert runs.counts["read_file"] == 4
    assert [event.kind for event in events] == KINDS
    final = requests.seen[-1]
    assert (final.tools, final.tool_choice, final.response_format) == ([], None, None)
    assert all(request.tools for request in requests.seen[:-1])

    ended, ended_model, ended_runs, _, _ = build(answers_when_stopped, "end")
    ended_messages = run(ended, ask(), {"configurable": {"thread_id": "t"}}, mode)
    assert model.calls == ended_model.calls + 1
    assert ended_runs.counts == runs.counts
    assert timeline(messages[:-2]) == timeline(
        ended_messages[:-1]
    )  # the same run up to the stop's last words


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_final_reply_that_calls_a_tool_ends_with_the_guards_message(mode: Mode) -> None:
    """No tool runs after a stop: a reply still calling one is dropped for today's end."""
    agent, model, runs, _, _ = build(calls_even_when_stopped)
    messages = run(agent, ask(), {"configurable": {"thread_id": "t"}}, mode)
    ended, ended_model, _, _, _ = build(calls_even_when_stopped, "end")
    ended_messages = run(ended, ask(), {"configurable": {"thread_id": "t"}}, mode)
    stop = final_stop(messages)
    assert stop is not None
    assert "loop_guard" not in stop.response_metadata
    assert stop.text.startswith("Stopped by loop_guard")
    assert timeline(messages) == timeline(ended_messages)
    assert model.calls == ended_model.calls + 1
    assert runs.counts["read_file"] == 4
    assert_valid_history(messages)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_failed_final_call_ends_with_the_guards_message(
    mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    """The model failing when asked for its answer never fails the user's run."""
    agent, _, runs, _, _ = build(fails_when_stopped)
    with caplog.at_level(logging.WARNING, logger="loop_guard"):
        messages = run(agent, ask(), {"configurable": {"thread_id": "t"}}, mode)
    stop = final_stop(messages)
    assert stop is not None
    assert stop.text.startswith("Stopped by loop_guard")
    assert not any(isinstance(m, HumanMessage) and "stopped" in m.text for m in messages)
    assert runs.counts["read_file"] == 4
    assert_valid_history(messages)
    assert any("final answer" in record.getMessage() for record in caplog.records)


def test_the_final_answer_counts_as_one_model_call_for_the_call_limit() -> None:
    """`ModelCallLimitMiddleware` counts the extra call: the answer costs one call more."""

    def thread_count(exit_behavior: str) -> int:
        agent, _, _, _, _ = build(
            answers_when_stopped, exit_behavior, extra=[ModelCallLimitMiddleware(thread_limit=50)]
        )
        config = {"configurable": {"thread_id": "t"}}
        messages = run(agent, ask(), config, "invoke")
        assert final_stop(messages) is not None
        return int(agent.get_state(config).values["thread_model_call_count"])

    assert thread_count("answer") == thread_count("end") + 1


def test_the_thread_goes_on_after_a_final_answer_on_sqlite(tmp_path: Path) -> None:
    """The answer is checkpointed; the next request on the thread starts fresh and is
    guarded again, in a new agent on the same database."""
    database = str(tmp_path / "threads.sqlite")
    config = {"configurable": {"thread_id": "t"}}
    with SqliteSaver.from_conn_string(database) as saver:
        agent, *_ = build(answers_when_stopped, checkpointer=saver)
        run(agent, ask(), config, "invoke")
    with SqliteSaver.from_conn_string(database) as saver:
        agent, _, runs, _, _ = build(answers_when_stopped, checkpointer=saver)
        messages = run(agent, ask("Try notes.md again"), config, "invoke")
    answers = [m for m in messages if isinstance(m, AIMessage) and m.name == GUARD_NAME]
    assert [m.response_metadata["loop_guard"] for m in answers] == [FINAL_ANSWER_MARK] * 2
    assert runs.counts["read_file"] == 4  # the second request is stopped after as many runs
    assert_valid_history(messages)


def test_an_unknown_exit_behavior_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'answer'"):
        LoopGuardMiddleware(exit_behavior="reply")  # type: ignore[arg-type]


def guarded_graph(model: ScriptedChatModel, runs: ToolRuns, *, answer: bool) -> Any:
    """The README's graph, its node given the model for the final answer or not."""
    guard = LoopGuard()
    node = LoopGuardNode(guard, model=model) if answer else LoopGuardNode(guard)
    return build_graph(model, make_tools(runs), guard, checkpointer=InMemorySaver(), node=node)


@pytest.mark.parametrize("mode", MODES)
def test_the_node_given_a_model_ends_a_stopped_request_with_its_answer(mode: Mode) -> None:
    model, runs = ScriptedChatModel(script=answers_when_stopped), ToolRuns()
    config = {"configurable": {"thread_id": "t"}}
    messages = run(guarded_graph(model, runs, answer=True), ask(), config, mode)
    answer = final_stop(messages)
    assert answer is not None
    assert answer.text == ANSWER
    assert answer.response_metadata["loop_guard"] == FINAL_ANSWER_MARK
    assert asked_to_answer(messages[:-1])
    assert_valid_history(messages)
    assert runs.counts["read_file"] == 4

    ended_model, ended_runs = ScriptedChatModel(script=answers_when_stopped), ToolRuns()
    ended = run(guarded_graph(ended_model, ended_runs, answer=False), ask(), config, mode)
    assert timeline(messages[:-2]) == timeline(ended[:-1])
    assert model.calls == ended_model.calls + 1
    assert ended_runs.counts == runs.counts


@pytest.mark.parametrize(
    "script", [calls_even_when_stopped, fails_when_stopped], ids=["calls", "fails"]
)
def test_the_nodes_model_failing_or_calling_a_tool_ends_with_the_guards_message(
    script: Callable[[Sequence[BaseMessage], int], AIMessage],
) -> None:
    model, runs = ScriptedChatModel(script=script), ToolRuns()
    messages = run(
        guarded_graph(model, runs, answer=True),
        ask(),
        {"configurable": {"thread_id": "t"}},
        "invoke",
    )
    stop = final_stop(messages)
    assert stop is not None
    assert stop.text.startswith("Stopped by loop_guard")
    assert not asked_to_answer(messages[:-1])
    assert runs.counts["read_file"] == 4
    assert_valid_history(messages)


def test_the_node_refuses_a_model_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="model must be a chat model"):
        LoopGuardNode(LoopGuard(), model="openai:gpt-5.5")  # type: ignore[arg-type]
