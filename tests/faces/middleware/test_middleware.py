"""`LoopGuardMiddleware` in real `create_agent` agents; only the chat model is scripted."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
)
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from loop_guard import GuardEvent, LoopCost, LoopGuardConfig, LoopGuardMiddleware, LoopGuardStop
from loop_guard.testing import (
    ScriptedChatModel,
    capture_events,
    obedient,
    sequence,
    stubborn,
    tool_calls_message,
)
from tests.support.agents import (
    LIST_DIR,
    MODES,
    READ_NOTES,
    THREAD,
    Mode,
    ReplyRecorder,
    ToolRuns,
    ask,
    assert_stopped,
    assert_valid_history,
    blocked,
    current_request,
    final_stop,
    make_tools,
    run,
    steers,
)


def build(script: Any, **guard_options: Any) -> tuple[Any, ScriptedChatModel, ToolRuns]:
    runs = ToolRuns()
    model = ScriptedChatModel(script=script)
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[LoopGuardMiddleware(**guard_options)],
        checkpointer=InMemorySaver(),
    )
    return agent, model, runs


@pytest.mark.parametrize("mode", MODES)
def test_stubborn_model_is_steered_blocked_and_stopped(mode: Mode) -> None:
    """The tool runs 4 times, one steer, calls 5-7 blocked, a clean end; twice per thread."""
    agent, model, runs = build(stubborn(READ_NOTES))
    for request in (1, 2):
        messages = run(agent, ask(), THREAD, mode)
        this_request = current_request(messages)
        assert runs.counts["read_file"] == 4 * request
        assert model.calls == 7 * request
        assert len(steers(this_request)) == 1
        assert len(blocked(this_request)) == 3
        calls = [m for m in this_request if isinstance(m, AIMessage) and m.tool_calls]
        assert len(calls) == 7
        # The steer comes right after the 3rd identical result, before the 4th model call.
        steer_index = this_request.index(steers(this_request)[0])
        assert this_request[steer_index - 1].content == "File not found: notes.md"
        assert this_request[steer_index + 1] is calls[3]
        stop = final_stop(messages)
        assert stop is not None
        assert "Stopped by loop_guard" in str(stop.content)
        assert_valid_history(messages)


@pytest.mark.parametrize("mode", MODES)
def test_obedient_model_is_steered_once_and_answers(mode: Mode) -> None:
    """A model that changes course after the steer is never blocked."""
    agent, _model, runs = build(obedient(READ_NOTES))
    messages = run(agent, ask(), THREAD, mode)
    assert runs.counts["read_file"] == 3
    assert len(steers(messages)) == 1
    assert blocked(messages) == []
    assert messages[-1].content == "Giving up on that; here is my answer."
    assert final_stop(messages) is None
    assert_valid_history(messages)


@pytest.mark.parametrize("mode", MODES)
def test_polling_and_varied_args_are_untouched(mode: Mode) -> None:
    """A poll whose result advances, and reads of different files: no steer, no block."""
    turns = [[("job_status", {"job": "build"})]] * 12
    turns += [[("read_file", {"path": f"file{n}.txt"})] for n in range(12)]
    agent, _, runs = build(sequence(*turns))
    messages = run(agent, ask(), THREAD, mode)
    assert runs.counts == {"job_status": 12, "read_file": 12}
    assert steers(messages) == []
    assert blocked(messages) == []
    assert messages[-1].content == "done"


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_unknown_tool_called_repeatedly_is_stopped_without_crashing(mode: Mode) -> None:
    """Calls to a tool that does not exist are answered, counted, blocked and stopped."""
    agent, model, runs = build(stubborn(("open_file", {"path": "notes.md"})))
    messages = run(agent, ask(), THREAD, mode)
    assert sum(runs.counts.values()) == 0
    assert_stopped(messages)
    assert model.calls == 7
    assert_valid_history(messages)


@pytest.mark.parametrize("mode", ["invoke", "astream"])
def test_identical_parallel_siblings_count_as_one_step(mode: Mode) -> None:
    """Three identical calls per response: each response is one step (see How the guard
    decides: batches)."""
    agent, model, runs = build(stubborn(READ_NOTES, READ_NOTES, READ_NOTES))
    messages = run(agent, ask(), THREAD, mode)
    # Four responses run in full; all three siblings of the fifth are blocked at once,
    # which reaches the abort threshold within that single response.
    assert runs.counts["read_file"] == 12
    assert model.calls == 5
    assert_stopped(messages)
    assert_valid_history(messages)


def test_mixed_batch_blocks_only_the_repeat() -> None:
    """A response with the repeated call and a new one: only the repeat is refused."""
    turns = [[READ_NOTES]] * 4 + [[READ_NOTES, LIST_DIR]]
    agent, _, runs = build(sequence(*turns))
    messages = run(agent, ask(), THREAD, "invoke")
    assert runs.counts == {"read_file": 4, "list_dir": 1}
    assert len(blocked(messages)) == 1
    assert messages[-1].content == "done"
    assert_valid_history(messages)


def test_counters_do_not_leak_into_the_next_request() -> None:
    """Two repeats in one request and two in the next never add up to a streak; a third
    user turn making the same call is a repeat across turns (each turn counts once)."""
    turns = [[READ_NOTES], [READ_NOTES]]
    agent, _, _ = build(sequence(*turns))
    for _ in range(2):
        messages = run(agent, ask(), THREAD, "invoke")
        assert steers(messages) == []
    messages = run(agent, ask(), THREAD, "invoke")
    assert ["in 3 of your last turns" in str(m.content) for m in steers(messages)] == [True]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_exit_behavior_error_raises_loop_guard_stop(mode: Mode) -> None:
    """exit_behavior='error' raises once the history is complete: the thread stays valid."""
    agent, _, runs = build(stubborn(READ_NOTES), exit_behavior="error")
    with pytest.raises(LoopGuardStop) as raised:
        run(agent, ask(), THREAD, mode)
    assert raised.value.stop.reason == "abort_threshold"
    assert raised.value.stop.blocks == 3
    assert runs.counts["read_file"] == 4
    assert_valid_history(agent.get_state(THREAD).values["messages"])


def test_use_terminate_ends_at_the_first_fully_blocked_response() -> None:
    """With use_terminate the first block ends the request."""
    agent, model, runs = build(stubborn(READ_NOTES), use_terminate=True)
    messages = run(agent, ask(), THREAD, "invoke")
    assert runs.counts["read_file"] == 4
    assert model.calls == 5
    assert len(blocked(messages)) == 1
    assert final_stop(messages) is not None
    assert_valid_history(messages)


def test_ignore_tools_and_ignore_errors_through_the_agent() -> None:
    """Ignored tools and ignored error results are never counted or blocked."""
    for options in ({"ignore_tools": ["read_file"]}, {"ignore_errors": True}):
        turns = [[READ_NOTES]] * 8
        agent, _, runs = build(sequence(*turns), **options)
        messages = run(agent, ask(), THREAD, "invoke")
        assert runs.counts["read_file"] == 8, options
        assert steers(messages) == [], options
        assert blocked(messages) == [], options


def test_events_reach_on_event_with_the_thread_as_conversation() -> None:
    """Every warning, block and stop is a GuardEvent naming the thread."""
    events: list[GuardEvent] = []
    agent, _, _ = build(stubborn(READ_NOTES), on_event=events.append)
    run(agent, ask(), {"configurable": {"thread_id": "t-events"}}, "invoke")
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert {e.conversation for e in events} == {"t-events"}
    assert events[0].args == {"path": "notes.md"}
    assert [e.streak for e in events] == [3, 4, 4, 4, 4]
    assert [e.blocks for e in events] == [0, 1, 2, 3, 3]


def test_block_event_message_is_the_text_the_model_saw() -> None:
    """GuardEvent.message equals the error ToolMessage content."""
    events: list[GuardEvent] = []
    agent, _, _ = build(stubborn(READ_NOTES), on_event=events.append)
    messages = run(agent, ask(), THREAD, "invoke")
    block_texts = [e.message for e in events if e.kind == "block"]
    assert block_texts == [m.content for m in blocked(messages)]
    assert [e.message for e in events if e.kind == "steer"] == [steers(messages)[0].content]
    assert [e.message for e in events if e.kind == "stop"] == [messages[-1].content]


def test_without_a_thread_id_each_run_is_its_own_conversation() -> None:
    """No checkpointer, no thread: a run starts from its input alone and still stops."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(model, make_tools(runs), middleware=[LoopGuardMiddleware()])
    messages = agent.invoke(ask())["messages"]
    assert runs.counts["read_file"] == 4
    assert final_stop(messages) is not None


def test_one_instance_serves_many_threads_concurrently() -> None:
    """Stubborn and healthy threads through one compiled agent: no cross-talk."""

    def script(messages: Any, index: int) -> AIMessage:
        task = str(messages[0].content)
        if task.startswith("loop"):
            return tool_calls_message(READ_NOTES)
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        if turn < 8:
            return tool_calls_message(("read_file", {"path": f"{task}-{turn}.txt"}))
        return AIMessage(content=f"done {task}")

    runs = ToolRuns()
    model = ScriptedChatModel(script=script)
    agent = create_agent(
        model, make_tools(runs), middleware=[LoopGuardMiddleware()], checkpointer=InMemorySaver()
    )
    results: dict[str, list[Any]] = {}

    def worker(name: str) -> None:
        config = {"configurable": {"thread_id": name}}
        results[name] = agent.invoke(ask(name), config)["messages"]

    names = [f"loop-{n}" if n % 2 else f"ok-{n}" for n in range(16)]
    threads = [threading.Thread(target=worker, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in names:
        messages = results[name]
        assert_valid_history(messages)
        if name.startswith("loop"):
            assert_stopped(messages, name)
        else:
            assert steers(messages) == [], name
            assert messages[-1].content == f"done {name}", name


def test_many_conversations_concurrently_in_one_event_loop() -> None:
    """asyncio: 20 concurrent threads on one agent behave like 20 separate runs."""
    agent, _, _ = build(stubborn(READ_NOTES))

    async def main() -> list[list[Any]]:
        return [
            r["messages"]
            for r in await asyncio.gather(
                *(agent.ainvoke(ask(), {"configurable": {"thread_id": f"a{n}"}}) for n in range(20))
            )
        ]

    for messages in asyncio.run(main()):
        assert_stopped(messages)


@pytest.mark.parametrize(
    ("limit", "ran", "guard_stops"),
    [
        pytest.param(ToolCallLimitMiddleware(run_limit=50), 4, True, id="generous"),
        pytest.param(
            ToolCallLimitMiddleware(run_limit=2, exit_behavior="end"), 2, False, id="tight"
        ),
    ],
)
def test_composes_with_tool_call_limit_middleware(
    limit: ToolCallLimitMiddleware, ran: int, guard_stops: bool
) -> None:
    """With a generous ToolCallLimitMiddleware the guard stops the loop first; a tight one
    still ends the run before the guard needs to."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[LoopGuardMiddleware(), limit],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), THREAD)["messages"]
    assert runs.counts["read_file"] == ran
    if guard_stops:
        assert final_stop(messages) is not None
    else:
        assert steers(messages) == []
    assert_valid_history(messages)


def test_composes_with_summarization_middleware() -> None:
    """Summarising the history mid-loop does not reset or confuse the guard."""
    runs = ToolRuns()
    summarizer = ScriptedChatModel(script=lambda messages, index: AIMessage("summary"))
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[
            SummarizationMiddleware(
                model=summarizer, trigger=("messages", 6), keep=("messages", 2)
            ),
            LoopGuardMiddleware(),
        ],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), THREAD)["messages"]
    assert summarizer.calls >= 1
    assert runs.counts["read_file"] == 4
    assert final_stop(messages) is not None
    assert_valid_history(messages)


@pytest.mark.parametrize("order", ["guard-first", "hitl-first"])
def test_human_in_the_loop_interrupt_and_resume_mid_streak(order: str) -> None:
    """Every call waits for approval; resuming keeps the streak, and the guard still stops."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    guard = LoopGuardMiddleware()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"read_file": True})
    agent = create_agent(
        model,
        make_tools(runs),
        middleware=[guard, hitl] if order == "guard-first" else [hitl, guard],
        checkpointer=InMemorySaver(),
    )
    result = agent.invoke(ask(), THREAD)
    interrupts = 0
    while result.get("__interrupt__"):
        interrupts += 1
        assert interrupts < 20
        result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), THREAD)
    messages = result["messages"]
    assert runs.counts["read_file"] == 4
    assert_stopped(messages)
    assert_valid_history(messages)


def test_guard_state_is_checkpointed_with_the_thread() -> None:
    """The snapshot lives in the thread's state, not on the middleware instance."""
    agent, _, _ = build(sequence([READ_NOTES], [READ_NOTES]))
    agent.invoke(ask(), THREAD)
    snapshot = agent.get_state(THREAD).values["loop_guard"]
    assert snapshot["streak"] == 2
    json.dumps(snapshot)  # JSON-safe


def test_explicit_config_mistakes_raise_at_once() -> None:
    """Bad arguments fail at construction, not in the middle of a run."""
    with pytest.raises(ValueError, match="warn_threshold"):
        LoopGuardMiddleware(warn_threshold=5, block_threshold=5)
    with pytest.raises(ValueError, match="exit_behavior"):
        LoopGuardMiddleware(exit_behavior="explode")  # type: ignore[arg-type]
    assert LoopGuardMiddleware(LoopGuardConfig(block_threshold=9)).guard.config.block_threshold == 9


def test_tool_messages_for_blocks_are_marked() -> None:
    """Block answers carry response_metadata so tools and scans can recognise them."""
    agent, _, _ = build(stubborn(READ_NOTES))
    messages = run(agent, ask(), THREAD, "invoke")
    for message in blocked(messages):
        assert isinstance(message, ToolMessage)
        assert message.response_metadata == {"loop_guard": "blocked"}


@pytest.mark.parametrize("exit_behavior", ["continue", "end"])
@pytest.mark.parametrize("order", ["guard-first", "limit-first"])
def test_tool_call_limit_and_a_partly_refused_reply_answer_each_call_once(
    order: str, exit_behavior: Any
) -> None:
    """`ToolCallLimitMiddleware` answers the calls over its limit after the model, without
    looking for answers already there: the guard answers a refused call only when the
    tool node reaches it, so no call is ever answered twice."""
    from importlib.metadata import version

    from langchain.agents.middleware import ToolCallLimitMiddleware
    from packaging.version import Version

    if exit_behavior == "end" and Version(version("langchain")) < Version("1.3.15"):
        pytest.skip("before langchain 1.3.15, exit_behavior='end' refuses parallel calls")

    @tool
    def ls(path: str) -> str:
        """List a directory."""
        return "same"

    @tool
    def echo(n: int) -> str:
        """Echo a number."""
        return str(n)

    def script(messages: Any, index: int) -> AIMessage:
        if index >= 8:
            return AIMessage("done")
        return tool_calls_message(("echo", {"n": index}), ("ls", {"path": "/"}))

    guard = LoopGuardMiddleware()
    limit = ToolCallLimitMiddleware(tool_name="ls", run_limit=4, exit_behavior=exit_behavior)
    agent = create_agent(
        ScriptedChatModel(script=script),
        [ls, echo],
        middleware=[guard, limit] if order == "guard-first" else [limit, guard],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), THREAD)["messages"]
    assert_valid_history(messages)
    if exit_behavior == "continue":  # with "end", the limit ends the run at the 5th ls
        assert any(m.response_metadata.get("loop_guard") == "blocked" for m in messages)


def test_a_repeated_invalid_structured_answer_is_steered_and_stopped_with_one_answer_each() -> None:
    """`ToolStrategy` answers an invalid structured call itself: the guard counts it (the
    agent's answer is its result), steers and stops the stuck model, and never answers it
    a second time."""
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    model = ScriptedChatModel(
        script=lambda messages, index: tool_calls_message(("Answer", {"value": "not-an-int"}))
    )
    agent = create_agent(
        model,
        make_tools(ToolRuns()),
        response_format=ToolStrategy(Answer),
        middleware=[LoopGuardMiddleware()],
        checkpointer=InMemorySaver(),
    )
    messages = agent.invoke(ask(), {**THREAD, "recursion_limit": 60})["messages"]
    assert_valid_history(messages)
    assert len(steers(messages)) == 1
    assert final_stop(messages) is not None
    assert model.calls == 7


def test_a_valid_structured_answer_is_left_alone() -> None:
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    model = ScriptedChatModel(
        script=lambda messages, index: tool_calls_message(("Answer", {"value": 42}))
    )
    agent = create_agent(
        model,
        make_tools(ToolRuns()),
        response_format=ToolStrategy(Answer),
        middleware=[LoopGuardMiddleware()],
    )
    result = agent.invoke(ask())
    assert result["structured_response"] == Answer(value=42)
    assert model.calls == 1


def _failing(script: Any, fails: Any) -> Any:
    """A script whose model raises a transient error on the calls `fails(messages, index)`
    picks."""

    def failing(messages: Any, index: int) -> AIMessage:
        if fails(messages, index):
            raise ConnectionError("transient")
        return script(messages, index)

    return failing


def _every_other_call(messages: Any, index: int) -> bool:
    return index % 2 == 1


def _re_asks() -> Any:
    """Picks the guard's re-asks: the first call after each refusal (a refusal's id is
    seen again only by the next step's call)."""
    failed: set[str] = set()

    def fails(messages: Any, index: int) -> bool:
        last = messages[-1]
        if (
            isinstance(last, ToolMessage)
            and last.response_metadata.get("loop_guard") == "blocked"
            and last.tool_call_id not in failed
        ):
            failed.add(last.tool_call_id)
            return True
        return False

    return fails


def _once(fail_when: Any) -> Any:
    """Picks the first call for which `fail_when(messages)` holds."""
    failed: list[bool] = []

    def fails(messages: Any, index: int) -> bool:
        if fail_when(messages) and not failed:
            failed.append(True)
            return True
        return False

    return fails


@pytest.mark.parametrize("wrapper", ["retry", "fallback"])
def test_a_model_call_run_again_by_other_middleware_publishes_each_decision_once(
    wrapper: str,
) -> None:
    """`ModelRetryMiddleware` or `ModelFallbackMiddleware` listed before the guard runs its
    `wrap_model_call` again after a failure: the steer decided on the first attempt is
    decided again, and published once (see How the guard decides: reset and scope): one warning
    in `stats`, not two."""
    from langchain.agents.middleware import ModelFallbackMiddleware, ModelRetryMiddleware

    guard = LoopGuardMiddleware()
    steered = lambda messages: any(m.name == "loop_guard" for m in messages)  # noqa: E731
    model = ScriptedChatModel(script=_failing(obedient(READ_NOTES), _once(steered)))
    again: Any = (
        ModelRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
        if wrapper == "retry"
        else ModelFallbackMiddleware(ScriptedChatModel(script=obedient(READ_NOTES)))
    )
    agent = create_agent(
        model, make_tools(ToolRuns()), middleware=[again, guard], checkpointer=InMemorySaver()
    )
    with capture_events(guard.guard) as events:
        messages = agent.invoke(ask(), THREAD)["messages"]
    assert_valid_history(messages)
    assert len(steers(messages)) == 1
    assert [e.kind for e in events] == ["steer"]
    assert guard.guard.stats.steers == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fails", ["every other call", "the re-asks"])
def test_a_failed_re_ask_under_model_retry_ends_with_the_guard_stop(mode: Mode, fails: str) -> None:
    """`ModelRetryMiddleware` around the guard, a provider failing every other call (or on
    each re-ask): a reply refused in full is answered and the model asked again; when that
    call fails, the turn ends with the refusals and the model sees them on the next step.
    Each decision is published once and the run ends at the guard's stop: the retry does
    not repeat the whole turn until its attempts run out and the refusals are lost."""
    from langchain.agents.middleware import ModelRetryMiddleware

    outer = ReplyRecorder()
    guard = LoopGuardMiddleware()
    picks = _every_other_call if fails == "every other call" else _re_asks()
    model = ScriptedChatModel(script=_failing(stubborn(READ_NOTES), picks))
    retry = ModelRetryMiddleware(max_retries=3, initial_delay=0, jitter=False)
    runs = ToolRuns()
    agent = create_agent(
        model, make_tools(runs), middleware=[outer, retry, guard], checkpointer=InMemorySaver()
    )
    with capture_events(guard.guard) as events:
        messages = run(agent, ask(), THREAD, mode)
    assert_valid_history(messages)
    # One model turn per step, its result ending with the model's reply (the refusals
    # of a failed re-ask follow it in the command).
    assert len(outer.replies) == 7
    assert all(isinstance(r, AIMessage) and r.tool_calls and r.name is None for r in outer.replies)
    stop = final_stop(messages)
    assert stop is not None
    assert "Stopped by loop_guard" in str(stop.content)
    assert runs.counts["read_file"] == 4
    assert len(steers(messages)) == 1
    assert len(blocked(messages)) == 3
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert guard.guard.stats.blocks == 3
    # What the loop cost is charged once however often a failed call was retried.
    cost = LoopCost(model_calls=6, tool_runs=3, tool_runs_saved=3)
    assert guard.guard.stats.cost == events[-1].cost == cost
    # 7 replies, as without failures; the failed calls: 6 (every other), 2 (the re-asks
    # after the 1st and 2nd refusal; the 3rd refusal stops the run).
    assert model.calls == (13 if fails == "every other call" else 9)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_failed_re_ask_under_model_fallback_ends_with_the_guard_stop(mode: Mode) -> None:
    """`ModelFallbackMiddleware` around the guard, both models failing on each re-ask: the
    re-ask's failure ends the turn with the refusals; the turn does not go to the fallback
    model, whose own re-ask would fail and end the run with the exception."""
    from langchain.agents.middleware import ModelFallbackMiddleware

    guard = LoopGuardMiddleware()
    model = ScriptedChatModel(script=_failing(stubborn(READ_NOTES), _re_asks()))
    fallback = ScriptedChatModel(script=_failing(stubborn(READ_NOTES), _re_asks()))
    agent = create_agent(
        model,
        make_tools(ToolRuns()),
        middleware=[ModelFallbackMiddleware(fallback), guard],
        checkpointer=InMemorySaver(),
    )
    with capture_events(guard.guard) as events:
        messages = run(agent, ask(), THREAD, mode)
    assert_valid_history(messages)
    assert final_stop(messages) is not None
    assert len(blocked(messages)) == 3
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert guard.guard.stats.blocks == 3
    assert (model.calls, fallback.calls) == (9, 0)  # 7 replies, 2 failed re-asks
