"""Repeats shown once in what the model is sent (`compact_repeats`), never in the history.

The model records every list of messages it is sent. Each list must begin with exactly the
list sent before it (a provider's cached prefix stays valid), a repeated 4 KB result must be
sent once, and every tool call must keep its answer.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    ModelRequest,
    SummarizationMiddleware,
)
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_to_dict,
    trim_messages,
)
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from loop_guard import LoopCost, LoopGuardMiddleware, compact_repeats
from loop_guard._state import RequestState
from loop_guard.testing import ScriptedChatModel, capture_events, tool_calls_message
from tests.support import ROOT
from tests.support.agents import assert_valid_history, build_graph

BIG = "".join(f"line {n:04}: the same four kilobytes every time\n" for n in range(82))[:4096]
MARK = "[Identical to the result of "
HEALTHY_STEPS = 10  # distinct calls before each request's loop
REQUESTS = 3


def make_tools() -> list[BaseTool]:
    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return BIG if path.startswith("big") else f"contents of {path}"

    return [read_file]


class Recorder:
    """A script that records what the model is sent: some distinct reads, then the same
    big read forever (calls per reply: `width`, all reading big files from then on)."""

    def __init__(self, width: int = 1) -> None:
        self.width = width
        self.sent: list[list[BaseMessage]] = []

    def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        self.sent.append(list(messages))
        # Since the user's message, or since the summary that replaced it.
        asked = [n for n, m in enumerate(messages) if str(m.content).startswith("request ")]
        turn = sum(isinstance(m, AIMessage) for m in messages[asked[-1] if asked else 0 :])
        if turn < HEALTHY_STEPS:
            return tool_calls_message(("read_file", {"path": f"step-{index}.txt"}))
        return tool_calls_message(*[("read_file", {"path": f"big-{n}"}) for n in range(self.width)])


def agent_of(recorder: Recorder, checkpointer: Any, *, chunks: int = 0, before: Any = ()) -> Any:
    model = ScriptedChatModel(script=recorder, chunk_chars=chunks)
    guard = LoopGuardMiddleware(compact_repeats=True)
    return create_agent(model, make_tools(), middleware=[*before, guard], checkpointer=checkpointer)


def run(agent: Any, text: str, thread: str, mode: str) -> list[BaseMessage]:
    payload = {"messages": [HumanMessage(text)]}
    config = {"configurable": {"thread_id": thread}, "recursion_limit": 200}

    async def consume() -> None:
        async for _ in agent.astream(payload, config, stream_mode="messages"):
            pass

    if mode == "invoke":
        agent.invoke(payload, config)
    elif mode == "ainvoke":
        asyncio.run(agent.ainvoke(payload, config))
    elif mode == "stream":
        for _ in agent.stream(payload, config, stream_mode="messages"):
            pass
    else:
        asyncio.run(consume())
    return list(agent.get_state(config).values["messages"])


def shown(message: BaseMessage) -> tuple[Any, ...]:
    """What a provider is sent of a message."""
    calls = [(c["name"], c["args"], c["id"]) for c in getattr(message, "tool_calls", [])]
    return (
        message.type,
        message.content,
        message.name,
        getattr(message, "tool_call_id", ""),
        calls,
    )


def assert_prefix_stable(sent: Sequence[Sequence[BaseMessage]]) -> None:
    for number, (before, after) in enumerate(pairwise(sent), start=2):
        head = [shown(m) for m in after[: len(before)]]
        assert head == [shown(m) for m in before], f"model call {number} changed its prefix"


def assert_sent_once(sent: Sequence[BaseMessage]) -> None:
    """The big result is sent in full once at most, and each repeat's line names a result
    sent above it in full."""
    assert sum(isinstance(m, ToolMessage) and m.content == BIG for m in sent) <= 1
    assert not dangling(sent)
    assert_valid_history(sent)


def dangling(sent: Sequence[BaseMessage]) -> list[str]:
    """The repeats' lines in `sent` that name no result sent: the message as many messages
    above as a line says is not the result of the call it names, of the size it gives."""
    lines = []
    for index, message in enumerate(sent):
        line = str(message.content)
        if isinstance(message, ToolMessage) and line.startswith(MARK):
            named = line.removeprefix(MARK).split(" call ")[1].split(",")[0]
            above = messages_above(line)
            first = sent[index - above] if above <= index else None
            if not (
                isinstance(first, ToolMessage)
                and first.tool_call_id == named
                and f"({len(str(first.content)):,} characters)" in line
            ):
                lines.append(line)
    return lines


def messages_above(line: str) -> int:
    """How many messages above a repeat's line says the message it repeats is."""
    return int(line.split(", ")[1].split(" message")[0])


@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "stream", "astream"])
def test_fifty_model_calls_three_loops_each_call_extends_the_last(mode: str) -> None:
    recorder = Recorder()
    agent = agent_of(recorder, InMemorySaver(), chunks=200 if "stream" in mode else 0)
    for request in range(REQUESTS):
        history = run(agent, f"request {request}", "t", mode)
    assert len(recorder.sent) >= 50
    assert_prefix_stable(recorder.sent)
    assert_sent_once(recorder.sent[-1])
    assert sum(m.content == BIG for m in recorder.sent[-1]) == 1
    # The history keeps every result as the tool gave it.
    assert sum(m.content == BIG for m in history if isinstance(m, ToolMessage)) == 3 * 4
    assert_valid_history(history)


def test_parallel_calls_with_identical_results_are_sent_once() -> None:
    recorder = Recorder(width=3)
    agent = agent_of(recorder, InMemorySaver())
    run(agent, "request", "t", "invoke")
    assert_prefix_stable(recorder.sent)
    assert_sent_once(recorder.sent[-1])


def test_a_reused_tool_call_id_names_the_earlier_result_by_its_distance() -> None:
    """A provider giving every call the same id: each line says how many messages above
    the result it repeats is, so the id alone never has to tell two results apart."""
    call = {"name": "read_file", "args": {}, "id": "call_0"}
    messages: list[BaseMessage] = [HumanMessage("Summarise the notes.")]
    for content in [BIG, "other", BIG, "other", BIG]:
        messages += [AIMessage("", tool_calls=[call]), ToolMessage(content, tool_call_id="call_0")]
    sent = compact_repeats(messages)
    lines = [(n, str(m.content)) for n, m in enumerate(sent) if str(m.content).startswith(MARK)]
    assert [n for n, _ in lines] == [6, 10]
    assert [n - messages_above(line) for n, line in lines] == [2, 2]
    assert lines[0][1] == (
        "[Identical to the result of read_file call call_0, 4 messages above "
        f"({len(BIG):,} characters); not repeated.]"
    )
    # The distance of two messages stays as the messages grow: the prefix holds.
    assert [shown(m) for m in compact_repeats(messages[:8])] == [shown(m) for m in sent[:8]]


def chars(messages: Sequence[BaseMessage]) -> int:
    return sum(len(str(message.content)) for message in messages)


class Metered(Recorder):
    """A recorder whose replies report, as their input tokens, a quarter of the
    characters the model was sent."""

    def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        tokens = chars(messages) // 4
        usage = {"input_tokens": tokens, "output_tokens": 10, "total_tokens": tokens + 10}
        return super().__call__(messages, index).model_copy(update={"usage_metadata": usage})


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_what_compaction_kept_out_is_counted_per_request_in_events_and_stats(mode: str) -> None:
    """Each model call's saving, measured on what the model was sent against the history
    it stands for: in the request's snapshot, on its stop and in the guard's stats; its
    tokens at each call's rate of reported input tokens per character."""
    recorder = Metered()
    guard = LoopGuardMiddleware(compact_repeats=True)
    model = ScriptedChatModel(script=recorder)
    agent = create_agent(model, make_tools(), middleware=[guard], checkpointer=InMemorySaver())
    totals = LoopCost()
    with capture_events(guard.guard) as events:
        for request in range(2):
            recorder.sent.clear()
            history = run(agent, f"request {request}", "t", mode)
            kept = [chars(history[: len(sent)]) - chars(sent) for sent in recorder.sent]
            rates = [(chars(sent) // 4) / chars(sent) for sent in recorder.sent]
            expected = (sum(kept), sum(round(k * r) for k, r in zip(kept, rates, strict=True)))
            assert expected[0] > 3 * len(BIG)
            assert (events[-1].kind, events[-1].cost.chars_kept_out) == ("stop", expected[0])
            assert events[-1].cost.tokens_kept_out == expected[1]
            snapshot = agent.get_state({"configurable": {"thread_id": "t"}}).values["loop_guard"]
            cost = RequestState.from_dict(snapshot).cost
            assert (cost.chars_kept_out, cost.tokens_kept_out) == expected
            totals += cost
    assert guard.guard.stats.cost.chars_kept_out == totals.chars_kept_out
    assert guard.guard.stats.cost.tokens_kept_out == totals.tokens_kept_out


def test_the_guards_repeated_messages_are_sent_once() -> None:
    recorder = Recorder()
    agent = agent_of(recorder, InMemorySaver())
    for request in range(2):
        run(agent, f"request {request}", "t", "invoke")
    last = recorder.sent[-1]
    steers = [m for m in last if isinstance(m, HumanMessage) and m.name == "loop_guard"]
    assert len(steers) == 2
    assert steers[1].content.startswith("[Identical to the loop guard's message, ")
    assert_prefix_stable(recorder.sent)


def test_compaction_holds_after_a_summary_rewrote_the_history() -> None:
    summarizer = ScriptedChatModel(script=lambda messages, index: AIMessage("A summary."))
    summary = SummarizationMiddleware(summarizer, trigger=("messages", 40), keep=("messages", 24))
    recorder = Recorder()
    agent = agent_of(recorder, InMemorySaver(), before=[summary])
    for request in range(REQUESTS):
        run(agent, f"request {request}", "t", "invoke")
    summarized = [sent for sent in recorder.sent if "A summary." in str(sent[0].content)]
    assert summarized, "the history was never summarised"
    compacted = [sent for sent in summarized if any(MARK in str(m.content) for m in sent)]
    assert compacted, "nothing was compacted after a summary"
    for sent in summarized:
        assert_sent_once(sent)


class KeepLast(AgentMiddleware[Any, Any]):
    """A trimmer of what the model is sent: the last `count` messages, from an AI message on
    (so that every result keeps its call)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def wrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
        kept = trim_messages(
            request.messages,
            strategy="last",
            token_counter=len,
            max_tokens=self.count,
            start_on="ai",
        )
        return handler(request.override(messages=kept))


def trimmers() -> list[Any]:
    """Middleware that edit what the model is sent: a trimmer, and LangChain's clearing of
    old tool results."""
    clearing = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=2_000, keep=3)])
    return [pytest.param(KeepLast(30), id="trimmer"), pytest.param(clearing, id="clearing")]


@pytest.mark.parametrize("trimmer", trimmers())
def test_a_trimmer_listed_before_the_guard_leaves_every_line_its_message(trimmer: Any) -> None:
    """The guard compacts what the trimmer (outer) kept: each line names a message sent."""
    recorder = Recorder()
    agent = agent_of(recorder, InMemorySaver(), before=[trimmer])
    for request in range(REQUESTS):
        run(agent, f"request {request}", "t", "invoke")
    assert any(MARK in str(m.content) for m in recorder.sent[-1]), "nothing was compacted"
    for sent in recorder.sent:
        assert_sent_once(sent)


@pytest.mark.parametrize("trimmer", trimmers())
def test_a_trimmer_listed_after_the_guard_can_drop_what_a_line_names(trimmer: Any) -> None:
    """Why the order matters: a trimmer inside the guard edits the compacted messages, and
    may drop (or clear) the result a line names while it keeps the line."""
    recorder = Recorder()
    model = ScriptedChatModel(script=recorder)
    guard = LoopGuardMiddleware(compact_repeats=True)
    agent = create_agent(
        model, make_tools(), middleware=[guard, trimmer], checkpointer=InMemorySaver()
    )
    for request in range(REQUESTS):
        run(agent, f"request {request}", "t", "invoke")
    assert any(dangling(sent) for sent in recorder.sent)


def resume_in_a_fresh_process(database: str) -> None:
    """Run one more request on the thread, printing what the model was sent."""
    recorder = Recorder()
    checkpointer = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    run(agent_of(recorder, checkpointer), "request 1", "t", "invoke")
    print(json.dumps([messages_to_dict(sent) for sent in recorder.sent]))


@pytest.mark.slow
def test_a_thread_resumed_in_a_fresh_process_keeps_its_prefix(tmp_path: Path) -> None:
    from langchain_core.messages import messages_from_dict

    database = str(tmp_path / "threads.sqlite")
    recorder = Recorder()
    checkpointer = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    run(agent_of(recorder, checkpointer), "request 0", "t", "invoke")
    code = (
        "from tests.faces.middleware.test_compaction import resume_in_a_fresh_process as resume; "
        f"resume({database!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    resumed = [messages_from_dict(sent) for sent in json.loads(done.stdout.splitlines()[-1])]
    assert_prefix_stable([*recorder.sent, *resumed])
    assert_sent_once(resumed[-1])


def guarded_graph(recorder: Recorder, sending: Callable[[list[BaseMessage]], Any]) -> Any:
    """A hand-built graph guarded by the node, whose model node sends the model
    `sending(messages)`."""
    from loop_guard import LoopGuard

    model = ScriptedChatModel(script=recorder)
    return build_graph(
        model,
        make_tools(),
        LoopGuard(),
        checkpointer=InMemorySaver(),
        model_node=lambda state: {"messages": [model.invoke(sending(state["messages"]))]},
    )


def test_a_graphs_model_node_sends_compacted_messages() -> None:
    """`compact_repeats` in the model node of a hand-built graph guarded by the node."""
    recorder = Recorder()
    graph = guarded_graph(recorder, compact_repeats)
    for request in range(2):
        run(graph, f"request {request}", "t", "invoke")
    assert_prefix_stable(recorder.sent)
    assert_sent_once(recorder.sent[-1])
    assert sum(m.content == BIG for m in recorder.sent[-1]) == 1


def test_a_model_node_that_trims_then_compacts_sends_every_line_its_message() -> None:
    def trimmed_then_compacted(messages: list[BaseMessage]) -> list[BaseMessage]:
        kept = trim_messages(
            messages, strategy="last", token_counter=len, max_tokens=30, start_on="ai"
        )
        return compact_repeats(kept)

    recorder = Recorder()
    graph = guarded_graph(recorder, trimmed_then_compacted)
    for request in range(REQUESTS):
        run(graph, f"request {request}", "t", "invoke")
    assert any(MARK in str(m.content) for m in recorder.sent[-1]), "nothing was compacted"
    assert max(map(len, recorder.sent)) <= 30
    for sent in recorder.sent:
        assert_sent_once(sent)


@contextmanager
def provider_stub(answer: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> Iterator[str]:
    """A local HTTP server at the URL yielded, answering each POSTed JSON body with
    `answer(body)`: a status and a JSON reply. Shut down, its thread joined, on exit."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, reply = answer(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="provider-stub")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Wire:
    """A provider's API as far as a request's shape goes: it records each request, rejects
    one the provider would reject (a 400 saying why), and answers every other with the same
    `read_file` call."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        problem = self.problem(body["messages"])
        return (400, self.error(problem)) if problem else (200, self.reply(len(self.requests)))

    def model(self, url: str) -> Any:
        """The provider's LangChain chat model, sending to `url`."""
        raise NotImplementedError

    @staticmethod
    def problem(messages: list[dict[str, Any]]) -> str:
        """What the provider would reject in `messages`, or ""."""
        raise NotImplementedError

    def error(self, problem: str) -> dict[str, Any]:
        raise NotImplementedError

    def reply(self, number: int) -> dict[str, Any]:
        raise NotImplementedError


class AnthropicWire(Wire):
    """Anthropic's Messages API: roles alternate, each `tool_use` is answered by a
    `tool_result` in the next message, no text is empty."""

    def model(self, url: str) -> Any:
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(model="claude-test", base_url=url, api_key="test", max_retries=0)  # type: ignore[call-arg]

    @staticmethod
    def problem(messages: list[dict[str, Any]]) -> str:
        asked: set[str] = set()
        for number, message in enumerate(messages):
            if message["role"] != ("user", "assistant")[number % 2]:
                return f"messages.{number}: roles must alternate"
            blocks = message["content"]
            blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks
            answered = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
            if answered != asked:
                return f"messages.{number}: tool_use ids {asked} answered by {answered}"
            if any(b["type"] == "text" and not b["text"].strip() for b in blocks):
                return f"messages.{number}: text content blocks must be non-empty"
            asked = {b["id"] for b in blocks if b["type"] == "tool_use"}
        return ""

    def error(self, problem: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": problem}}

    def reply(self, number: int) -> dict[str, Any]:
        call = {"type": "tool_use", "id": f"toolu_{number}", "name": "read_file"}
        return {
            "id": f"msg_{number}",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{**call, "input": {"path": "big-0"}}],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }


class OpenAIWire(Wire):
    """OpenAI's Chat Completions API: each of an assistant message's `tool_calls` is
    answered by a `tool` message before any other message, a `tool` message answers a call
    of the assistant message before it, and content is a string (an assistant's may be
    null)."""

    def model(self, url: str) -> Any:
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model="gpt-test", base_url=url, api_key="test", max_retries=0)  # type: ignore[arg-type]

    @staticmethod
    def problem(messages: list[dict[str, Any]]) -> str:
        pending: set[str] = set()
        for number, message in enumerate(messages):
            content = message.get("content")
            if not (isinstance(content, str) or (content is None and "tool_calls" in message)):
                return f"messages[{number}].content: expected a string"
            if message["role"] == "tool":
                if message["tool_call_id"] not in pending:
                    return f"messages[{number}]: a 'tool' message must answer a preceding call"
                pending.remove(message["tool_call_id"])
                continue
            if pending:
                return f"messages[{number}]: tool_call_ids without a response: {sorted(pending)}"
            pending = {call["id"] for call in message.get("tool_calls", [])}
        return f"tool_call_ids without a response: {sorted(pending)}" if pending else ""

    def error(self, problem: str) -> dict[str, Any]:
        return {"error": {"type": "invalid_request_error", "message": problem, "code": None}}

    def reply(self, number: int) -> dict[str, Any]:
        call = {"name": "read_file", "arguments": json.dumps({"path": "big-0"})}
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": f"call_{number}", "type": "function", "function": call}
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }


@pytest.mark.parametrize("wire", [AnthropicWire, pytest.param(OpenAIWire, marks=pytest.mark.slow)])
def test_every_compacted_request_is_accepted_on_the_providers_wire_format(
    wire: type[Wire],
) -> None:
    provider = wire()
    with provider_stub(provider) as url:
        guard = LoopGuardMiddleware(compact_repeats=True)
        agent = create_agent(
            provider.model(url), make_tools(), middleware=[guard], checkpointer=InMemorySaver()
        )
        for request in range(2):
            run(agent, f"request {request}", "t", "invoke")
    assert len(provider.requests) >= 14
    last = json.dumps(provider.requests[-1])
    assert last.count(json.dumps(BIG)[1:-1]) == 1
    assert last.count(MARK) >= 4
    assert not [thread for thread in threading.enumerate() if thread.name == "provider-stub"]


def test_the_openai_wire_rejects_what_openai_rejects() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    assert OpenAIWire.problem([*asked, answer, {"role": "user", "content": "more"}]) == ""
    assert "without a response" in OpenAIWire.problem([*asked, {"role": "user", "content": "x"}])
    assert "without a response" in OpenAIWire.problem(asked)
    assert "must answer" in OpenAIWire.problem([*asked, answer, answer])
    listed = {**answer, "content": [{"type": "text", "text": "ok"}]}
    assert "expected a string" in OpenAIWire.problem([*asked, listed])
