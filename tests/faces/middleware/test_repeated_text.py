"""A reply that keeps repeating its own text, through real agents: the middleware cuts it
(stopping a streaming generation early), steers the model and stops it if it goes on; the
callback handler counts it; the scan reports it. Look-alikes pass untouched."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelFallbackMiddleware,
    ModelRetryMiddleware,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

import loop_guard._turn as turn_module
from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardConfig,
    LoopGuardMiddleware,
    LoopGuardStop,
    guard_tools,
)
from loop_guard._messages import REPLY
from loop_guard._repeated_text import find_repetition
from loop_guard._reply_watch import REPEATED_TEXT_MARK, Cutter
from loop_guard.marks import GUARD_NAME
from loop_guard.scan import Conversation, scan_conversation
from loop_guard.testing import (
    ScriptedChatModel,
    asked_to_answer,
    capture_events,
    steered,
    tool_calls_message,
)
from tests.support import slow_except
from tests.support.agents import MODES, Mode, assert_valid_history, needs_async_context
from tests.support.texts import DIVIDERS, LOOPS, NOT_LOOPS, Text


def sampled(texts: list[Text], modes: list[str]) -> list[Any]:
    """Every text in the first mode and the first text in the others in the quick suite,
    every pair in the whole."""
    pairs = itertools.product(texts, modes)
    return slow_except(pairs, lambda pair: pair[1] == modes[0] or pair[0] is texts[0])


def named(value: Any) -> str | None:
    """A text's id is its name; a mode's, itself."""
    return getattr(value, "name", None)


PREFIX = "The build log shows one failing test, test_parse_dates. "
CHANT = "Let me check the log file again to be sure. "
CHANTING = PREFIX + CHANT * 2000  # about 90,000 characters: until the output limit
ANSWER = "The failing test is test_parse_dates; the fix is in dates.py."
CHUNK = 4  # characters per streamed chunk, about a token


@tool
def read_log(name: str) -> str:
    """Read a log file."""
    return f"log {name}: 1 failed, 41 passed"


def chants_until_steered(messages: Sequence[BaseMessage], index: int) -> AIMessage:
    return AIMessage(ANSWER if steered(messages) else CHANTING)


def always_chants(messages: Sequence[BaseMessage], index: int) -> AIMessage:
    return AIMessage(ANSWER if asked_to_answer(messages) else CHANTING)


def run(
    agent: Runnable[Any, Any], config: dict[str, Any], mode: Mode, text: str = "Why?"
) -> tuple[list[BaseMessage], int]:
    """Run the agent; the final messages and how many AI chunks the caller was streamed
    (0 when it did not stream)."""
    payload = {"messages": [HumanMessage(text)]}
    if mode == "invoke":
        return list(agent.invoke(payload, config)["messages"]), 0
    if mode == "ainvoke":
        return list(asyncio.run(agent.ainvoke(payload, config))["messages"]), 0
    streamed = 0
    last: dict[str, Any] = {}
    if mode == "stream":
        for kind, chunk in agent.stream(payload, config, stream_mode=["messages", "values"]):
            streamed += kind == "messages"
            last = chunk if kind == "values" else last
        return list(last["messages"]), streamed

    async def consume() -> tuple[list[BaseMessage], int]:
        streamed, last = 0, {}
        async for kind, chunk in agent.astream(payload, config, stream_mode=["messages", "values"]):
            streamed += kind == "messages"
            last = chunk if kind == "values" else last
        return list(last["messages"]), streamed

    return asyncio.run(consume())


def guarded(
    script: Any,
    middleware: LoopGuardMiddleware[Any, Any] | None = None,
    *,
    inner: Sequence[Any] = (),
    **kwargs: Any,
) -> tuple[ScriptedChatModel, LoopGuardMiddleware[Any, Any], Runnable[Any, Any]]:
    """A streaming scripted model's agent, guarded (`inner`: middleware inside the guard)."""
    model = ScriptedChatModel(script=script, chunk_chars=CHUNK)
    middleware = middleware or LoopGuardMiddleware()
    agent = create_agent(model, [read_log], middleware=[middleware, *inner], **kwargs)
    return model, middleware, agent


def cut_replies(messages: Sequence[BaseMessage]) -> list[AIMessage]:
    return [
        m
        for m in messages
        if isinstance(m, AIMessage) and m.response_metadata.get("loop_guard") == REPEATED_TEXT_MARK
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_chanting_reply_is_cut_and_the_model_steered(mode: Mode) -> None:
    model, middleware, agent = guarded(chants_until_steered)
    with capture_events(middleware.guard) as events:
        messages, streamed = run(agent, {}, mode)
    assert [(e.kind, e.tool, e.reason) for e in events] == [("steer", REPLY, "repeated_text")]
    (cut,) = cut_replies(messages)
    assert cut.text.startswith(PREFIX + CHANT.strip())
    assert cut.text.count(CHANT.strip()) == 1  # one copy kept, then the note
    assert "[loop_guard: cut here" in cut.text
    assert isinstance(messages[-2], HumanMessage)
    assert messages[-2].name == GUARD_NAME
    assert messages[-1].text == ANSWER
    assert model.calls == 2
    assert_valid_history(messages)
    if mode in ("stream", "astream"):
        # The generation stopped about 1,000 characters into the repetition: a few hundred
        # of the reply's 22,500 chunks were generated, and no more were streamed.
        whole = len(CHANTING) // CHUNK
        assert model.chunks < (len(PREFIX) + 1000 + 2 * len(CHANT) + 64) // CHUNK + 5
        assert streamed < model.chunks + 20
        assert model.chunks < whole / 50


def test_without_the_guard_the_whole_reply_is_generated() -> None:
    """What the cut saves, counted the same way: every chunk of the reply."""
    model = ScriptedChatModel(script=chants_until_steered, chunk_chars=CHUNK)
    agent = create_agent(model, [read_log])
    messages, _ = run(agent, {}, "stream")
    assert messages[-1].text == CHANTING
    assert model.chunks == len(CHANTING) // CHUNK + 1  # the pieces, then the last chunk


# Before Python 3.11 an async call cannot read its run's config from the context
# (`get_config` raises), so whether it streams is unknown and it is watched, to be safe.
ASYNC_UNKNOWN = sys.version_info < (3, 11)


@pytest.mark.internals(reason="counts the cutters attached by patching their class")
@pytest.mark.parametrize(
    ("mode", "watched"),
    [("invoke", 0), ("ainvoke", 2 if ASYNC_UNKNOWN else 0), ("stream", 2)],
)
def test_only_a_reply_that_streams_is_watched_as_it_streams(
    mode: Mode, watched: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model call that does not stream (no `stream_mode="messages"`) gets no cutter:
    its reply is read whole once finished, and cut all the same."""
    attached: list[Cutter] = []

    class CountedCutter(Cutter):
        def __enter__(self) -> Cutter:
            attached.append(self)
            return super().__enter__()

    monkeypatch.setattr(turn_module, "Cutter", CountedCutter)
    model, _, agent = guarded(chants_until_steered)
    messages, _ = run(agent, {}, mode)
    assert len(attached) == watched
    assert len(cut_replies(messages)) == 1
    assert messages[-1].text == ANSWER
    if mode == "stream":
        assert model.chunks < len(CHANTING) // CHUNK / 50  # cut as it streamed


@pytest.mark.parametrize("mode", MODES)
def test_a_model_that_keeps_chanting_is_stopped(mode: Mode) -> None:
    model, middleware, agent = guarded(always_chants)
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, mode)
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert model.calls == 4  # the abort threshold's blocks after the steer, then no more
    assert len(cut_replies(messages)) == 4
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert "kept repeating the same text" in last.text
    assert_valid_history(messages)
    stats = middleware.guard.stats
    assert (stats.steers, stats.blocks, stats.stops, stats.calls) == (1, 3, 1, 0)
    assert stats.cost.model_calls == 4


@pytest.mark.parametrize(("text", "mode"), sampled(NOT_LOOPS, ["stream", "ainvoke"]), ids=named)
def test_look_alikes_pass_untouched(text: Text, mode: Mode) -> None:
    model, middleware, agent = guarded(lambda messages, index: AIMessage(text.text))
    model.chunk_chars = 16
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, mode)
    assert events == []
    assert messages[-1].text == text.text
    assert model.calls == 1


@pytest.mark.parametrize(("text", "mode"), sampled(LOOPS, ["stream", "ainvoke"]), ids=named)
def test_every_loop_of_the_catalogue_is_cut_after_its_prefix(text: Text, mode: Mode) -> None:
    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        return AIMessage(ANSWER if steered(messages) else text.text)

    model, middleware, agent = guarded(script)
    model.chunk_chars = 16
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, mode)
    assert [e.kind for e in events] == ["steer"]
    (cut,) = cut_replies(messages)
    assert cut.text.startswith(text.prefix.rstrip())
    assert len(cut.text) < len(text.text)
    assert messages[-1].text == ANSWER
    if mode == "stream":
        # Stopped by the loop's `cut_by` characters of repetition, give or take a unit, a
        # check and a few chunks: the rest was never generated.
        found = find_repetition(text.text)
        assert found is not None
        assert model.chunks * 16 <= len(text.prefix) + text.cut_by + 2 * found.period + 64 + 48


def test_a_cut_reply_keeps_its_tool_call_and_is_steered_after_it() -> None:
    """Text and a call in one reply: the text is cut, the call runs, and the steer comes
    before the next model call, after the call's result."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        if index == 0:
            reply = tool_calls_message(("read_log", {"name": "build"}))
            return reply.model_copy(update={"content": CHANTING})
        return AIMessage(ANSWER)

    _, middleware, agent = guarded(script)
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, "invoke")
    assert [e.kind for e in events] == ["steer"]
    kinds = [(type(m).__name__, m.name) for m in messages]
    assert kinds == [
        ("HumanMessage", None),
        ("AIMessage", None),
        ("ToolMessage", "read_log"),
        ("HumanMessage", GUARD_NAME),
        ("AIMessage", None),
    ]
    assert messages[1].tool_calls[0]["args"] == {"name": "build"}
    assert len(messages[1].text) < len(PREFIX) + 2 * len(CHANT) + 200


def test_a_stop_can_end_with_the_models_own_answer() -> None:
    model, _, agent = guarded(always_chants, LoopGuardMiddleware(exit_behavior="answer"))
    messages, _ = run(agent, {}, "stream")
    assert messages[-1].text == ANSWER
    assert messages[-1].name == GUARD_NAME
    assert model.calls == 5


def test_a_stop_raises_with_exit_behavior_error() -> None:
    _, _, agent = guarded(always_chants, LoopGuardMiddleware(exit_behavior="error"))
    with pytest.raises(LoopGuardStop, match="kept repeating the same text"):
        run(agent, {}, "invoke")


def test_with_exit_behavior_ask_a_text_stop_ends_the_request() -> None:
    """There is no call to ask a person about: the request ends as with 'end'."""
    model, _, agent = guarded(
        always_chants, LoopGuardMiddleware(exit_behavior="ask"), checkpointer=InMemorySaver()
    )
    messages, _ = run(agent, {"configurable": {"thread_id": "ask"}}, "invoke")
    assert messages[-1].name == GUARD_NAME
    assert model.calls == 4


@pytest.mark.parametrize("inner", ["retry", "fallback"])
@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_cut_is_no_failure_to_retry_or_fall_back_from(inner: str, mode: Mode) -> None:
    """Middleware between the guard and the model takes the cut for control flow."""
    fallback = ScriptedChatModel(script=lambda messages, index: AIMessage("fallback"))
    extra = (
        [ModelRetryMiddleware(max_retries=3, initial_delay=0)]
        if inner == "retry"
        else [ModelFallbackMiddleware(fallback)]
    )
    model, middleware, agent = guarded(chants_until_steered, inner=extra)
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, mode)
    assert model.calls == 2
    assert fallback.calls == 0
    assert [e.kind for e in events] == ["steer"]
    assert messages[-1].text == ANSWER


def test_threads_at_once_are_cut_and_steered_each_on_its_own() -> None:
    model, middleware, agent = guarded(chants_until_steered, checkpointer=InMemorySaver())
    barrier = threading.Barrier(4)

    def one(thread: int) -> list[BaseMessage]:
        barrier.wait()
        mode: Mode = "stream" if thread % 2 else "invoke"
        return run(agent, {"configurable": {"thread_id": f"t{thread}"}}, mode)[0]

    with capture_events(middleware.guard) as events, ThreadPoolExecutor(4) as pool:
        histories = list(pool.map(one, range(4)))
    assert sorted(e.conversation for e in events) == ["t0", "t1", "t2", "t3"]
    for messages in histories:
        assert len(cut_replies(messages)) == 1
        assert messages[-1].text == ANSWER
    assert model.calls == 8


def test_a_thread_resumed_in_another_process_goes_on_up_the_ladder(tmp_path: Path) -> None:
    """The cut replies are in the checkpoint: a fresh middleware (another worker) resuming
    the thread blocks the request's second one instead of steering it afresh."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        reply = tool_calls_message(("read_log", {"name": f"part-{index}"}))
        return reply.model_copy(update={"content": CHANTING}) if index < 2 else AIMessage(ANSWER)

    config = {"configurable": {"thread_id": "moved"}}
    database = tmp_path / "threads.sqlite"
    with SqliteSaver.from_conn_string(str(database)) as saver:
        first = LoopGuardMiddleware()
        _, _, agent = guarded(script, first, checkpointer=saver, interrupt_before=["tools"])
        with capture_events(first.guard) as events:
            run(agent, config, "invoke")
        assert [e.kind for e in events] == ["steer"]
    with SqliteSaver.from_conn_string(str(database)) as saver:
        second = LoopGuardMiddleware()  # nothing in memory: the checkpoint is the truth
        model = ScriptedChatModel(script=lambda m, i: script(m, i + 1), chunk_chars=CHUNK)
        agent = create_agent(model, [read_log], middleware=[second], checkpointer=saver)
        with capture_events(second.guard) as events:
            messages = agent.invoke(None, config)["messages"]
            messages = agent.invoke(None, config)["messages"]
    assert [e.kind for e in events] == ["block"]
    assert len(cut_replies(messages)) == 2
    assert messages[-1].text == ANSWER


# The callback handler: counts what it sees, stops the stream when the request stops.


def test_the_handler_counts_a_streamed_chanting_reply() -> None:
    guard = LoopGuard()
    handler = LoopGuardCallbackHandler(guard)
    model = ScriptedChatModel(script=chants_until_steered, chunk_chars=CHUNK)
    agent = create_agent(model, guard_tools([read_log], guard))
    with capture_events(guard) as events:
        messages, _ = run(agent, {"callbacks": [handler]}, "stream")
    assert [(e.kind, e.reason) for e in events] == [("steer", "repeated_text")]
    assert messages[-1].text == CHANTING  # it cannot cut a reply without ending the run
    assert model.chunks == len(CHANTING) // CHUNK + 1


@pytest.mark.parametrize(
    ("text", "mode"), sampled(LOOPS + NOT_LOOPS, ["stream", "invoke"]), ids=named
)
def test_the_handler_reads_the_catalogue_as_the_middleware_does(text: Text, mode: Mode) -> None:
    guard = LoopGuard()
    model = ScriptedChatModel(script=lambda messages, index: AIMessage(text.text), chunk_chars=16)
    agent = create_agent(model, guard_tools([read_log], guard))
    with capture_events(guard) as events:
        run(agent, {"callbacks": [LoopGuardCallbackHandler(guard)]}, mode)
    assert [(e.kind, e.reason) for e in events] == (
        [("steer", "repeated_text")] if text.loop else []
    )


@pytest.mark.parametrize(
    "mode",
    ["stream", pytest.param("astream", marks=[needs_async_context, pytest.mark.slow]), "invoke"],
)
def test_the_handler_stops_a_stream_when_the_request_stops(mode: Mode) -> None:
    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        reply = tool_calls_message(("read_log", {"name": f"part-{index}"}))
        return reply.model_copy(update={"content": CHANTING})

    guard = LoopGuard(LoopGuardConfig(abort_threshold=2))
    handler = LoopGuardCallbackHandler(guard)
    model = ScriptedChatModel(script=script, chunk_chars=CHUNK)
    agent = create_agent(model, guard_tools([read_log], guard))
    with capture_events(guard) as events, pytest.raises(LoopGuardStop):
        run(agent, {"callbacks": [handler]}, mode)
    assert [e.kind for e in events] == ["steer", "block", "block", "stop"]
    if mode != "invoke":  # the last reply's stream was stopped, the others ran out
        whole = len(CHANTING) // CHUNK + 1
        assert whole * 2 < model.chunks < whole * 3


# The scan.


def test_the_scan_reports_a_recorded_chanting_reply() -> None:
    messages = [
        HumanMessage("Why does the build fail?", id="user-1"),
        AIMessage("", tool_calls=[{"name": "read_log", "args": {"name": "b"}, "id": "c1"}]),
        _tool_answer("c1"),
        AIMessage(CHANTING),
        HumanMessage("Go on.", id="user-2"),
        AIMessage(CHANTING),
    ]
    report = scan_conversation(LoopGuardConfig(), Conversation("recorded", messages))
    found = [(f.call_index, f.event.kind, f.event.reason) for f in report.findings]
    assert found == [(1, "steer", "repeated_text"), (1, "steer", "repeated_text")]
    assert report.cost.model_calls == 2
    assert scan_conversation(LoopGuardConfig.pi(), Conversation("r", messages)).findings == []


def test_the_scan_leaves_recorded_dividers_alone_and_cuts_an_emoji_runaway() -> None:
    """Replies of a 1,000-character rule each (layout) give no finding; a reply of 1,100
    party emoji is still a runaway."""
    rules = [AIMessage(rule * 1000) for rule in DIVIDERS]
    messages = [HumanMessage("Draw the report", id="u1"), *rules]
    assert scan_conversation(LoopGuardConfig(), Conversation("rules", messages)).findings == []
    runaway = [HumanMessage("Celebrate", id="u1"), AIMessage("🎉" * 1100)]
    [found] = scan_conversation(LoopGuardConfig(), Conversation("emoji", runaway)).findings
    assert found.event.reason == "repeated_text"


def _tool_answer(call_id: str) -> ToolMessage:
    return ToolMessage("log b: 1 failed", tool_call_id=call_id, name="read_log")


# What is not the agent's reply, and what a cut keeps.


def test_a_model_other_middleware_calls_is_not_cut() -> None:
    """A helper model called inside the guarded model call (a rewriter, a tool selector)
    is not the agent's reply: its repetition is none of the guard's business."""
    helper = ScriptedChatModel(
        script=lambda messages, index: AIMessage("Rewrite: the user asks why. " * 200),
        chunk_chars=8,
    )

    class Rewriter(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            helper.invoke([HumanMessage("Rewrite the question.")])
            return handler(request)

    model, middleware, agent = guarded(
        lambda messages, index: AIMessage(ANSWER), inner=[Rewriter()]
    )
    with capture_events(middleware.guard) as events:
        messages, _ = run(agent, {}, "stream")
    assert events == []
    assert model.calls == 1
    assert messages[-1].text == ANSWER


def test_a_cut_keeps_reasoning_and_tool_use_blocks() -> None:
    """Providers need a reply's thinking blocks back with its tool calls: only the text is
    cut."""
    thinking = {"type": "thinking", "thinking": "The log first.", "signature": "c2lnbmVk"}

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        if index:
            return AIMessage(ANSWER)
        reply = tool_calls_message(("read_log", {"name": "build"}))
        content = [thinking, {"type": "text", "text": CHANTING}, {"type": "text", "text": "!"}]
        return reply.model_copy(update={"content": content})

    _, _, agent = guarded(script)
    messages, _ = run(agent, {}, "invoke")
    (cut,) = cut_replies(messages)
    assert isinstance(cut.content, list)
    assert cut.content[0] == thinking
    assert len(cut.content) == 2  # the text after the cut is the repetition's
    assert cut.content[1]["text"].startswith(PREFIX + CHANT.strip())
    assert "[loop_guard: cut here" in cut.content[1]["text"]
    assert cut.tool_calls[0]["name"] == "read_log"


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_a_final_answer_that_repeats_itself_is_cut_too(mode: Mode) -> None:
    model, _, agent = guarded(
        lambda messages, index: AIMessage(CHANTING), LoopGuardMiddleware(exit_behavior="answer")
    )
    messages, _ = run(agent, {}, mode)
    last = messages[-1]
    assert last.name == GUARD_NAME
    assert last.text.startswith(PREFIX + CHANT.strip())
    assert "[loop_guard: cut here" in last.text
    assert len(last.text) < len(PREFIX) + 2 * len(CHANT) + 200
    assert model.calls == 5
