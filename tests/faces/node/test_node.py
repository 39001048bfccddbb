"""The graph node and the tool wrapper on real LangGraph graphs."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    Call,
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardNode,
    LoopGuardStop,
    Result,
    guard_tools,
)
from loop_guard.testing import (
    ScriptedChatModel,
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
    ToolRuns,
    ask,
    assert_stopped,
    assert_valid_history,
    blocked,
    build_graph,
    current_request,
    final_stop,
    make_tools,
    run,
    steers,
    timeline,
)


def graph_for(script: Any, *, checkpointer: Any = None, **options: Any) -> tuple[Any, Any, Any]:
    events: list[GuardEvent] = []
    guard = LoopGuard(on_event=events.append, **options)
    runs = ToolRuns()
    model = ScriptedChatModel(script=script)
    graph = build_graph(
        model, make_tools(runs), guard, checkpointer=checkpointer or InMemorySaver()
    )
    return graph, runs, (model, events)


@pytest.mark.parametrize("mode", MODES)
def test_stubborn_model_in_a_hand_built_graph(mode: Mode) -> None:
    """4 runs, one steer after the 3rd result, blocks 5-7, END; the next request starts fresh."""
    graph, runs, (model, events) = graph_for(stubborn(READ_NOTES))
    for request in (1, 2):
        messages = run(graph, ask(), THREAD, mode)
        this_request = current_request(messages)
        assert runs.counts["read_file"] == 4 * request
        assert model.calls == 7 * request
        assert len(steers(this_request)) == 1
        steer_index = this_request.index(steers(this_request)[0])
        assert isinstance(this_request[steer_index - 1], ToolMessage)
        assert sum(isinstance(m, ToolMessage) for m in this_request[:steer_index]) == 3
        assert len(blocked(this_request)) == 3
        assert final_stop(messages) is not None
        assert_valid_history(messages)
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"] * 2


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_obedient_model_in_a_graph_is_steered_once(mode: Mode) -> None:
    """After the steer the model answers; nothing is blocked."""
    graph, runs, _ = graph_for(obedient(READ_NOTES))
    messages = run(graph, ask(), THREAD, mode)
    assert runs.counts["read_file"] == 3
    assert len(steers(messages)) == 1
    assert blocked(messages) == []
    assert messages[-1].content == "Giving up on that; here is my answer."


def test_polling_and_different_args_in_a_graph_are_untouched() -> None:
    """A poll that advances and reads of different files: never steered or blocked."""
    turns = [[("job_status", {"job": "b"})]] * 10 + [
        [("read_file", {"path": f"f{n}.txt"})] for n in range(10)
    ]
    graph, runs, (_, events) = graph_for(sequence(*turns))
    messages = run(graph, ask(), THREAD, "invoke")
    assert runs.counts == {"job_status": 10, "read_file": 10}
    assert events == []
    assert messages[-1].content == "done"


def test_parallel_identical_and_different_siblings_in_a_graph() -> None:
    """Siblings never count against each other within a batch; across batches, the
    read made beside the listing in every response is a loop of its own (SPEC §8)."""
    # Each response: the same read twice and, last, a listing, each answered alike.
    turns = [[READ_NOTES, READ_NOTES, LIST_DIR]] * 6
    graph, runs, (_, events) = graph_for(sequence(*turns))
    run(graph, ask(), THREAD, "invoke")
    # Each runs in 4 responses; in the 5th all three are blocked, and the stop follows.
    assert runs.counts == {"read_file": 8, "list_dir": 4}
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert [e.tool for e in events if e.kind == "block"] == ["read_file", "read_file", "list_dir"]


def test_identical_siblings_are_blocked_together() -> None:
    """Once the streak reaches the block point every identical sibling is refused."""
    graph, runs, (model, events) = graph_for(stubborn(READ_NOTES, READ_NOTES))
    messages = run(graph, ask(), THREAD, "ainvoke")
    assert runs.counts["read_file"] == 8
    assert model.calls == 6
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert final_stop(messages) is not None
    assert_valid_history(messages)


@pytest.mark.parametrize(
    ("options", "expected_runs"),
    [({"ignore_tools": ["read_file"]}, 8), ({"ignore_errors": True}, 8)],
)
def test_ignore_options_through_the_graph(options: dict[str, Any], expected_runs: int) -> None:
    """Ignored tools and ignored error results never count."""
    graph, runs, (_, events) = graph_for(sequence(*[[READ_NOTES]] * 8), **options)
    run(graph, ask(), THREAD, "invoke")
    assert runs.counts["read_file"] == expected_runs
    assert events == []


def test_use_terminate_through_the_graph() -> None:
    """With use_terminate the first fully blocked response ends the request."""
    graph, runs, (model, events) = graph_for(stubborn(READ_NOTES), use_terminate=True)
    messages = run(graph, ask(), THREAD, "invoke")
    assert runs.counts["read_file"] == 4
    assert model.calls == 5
    assert [e.kind for e in events] == ["steer", "block", "stop"]
    assert final_stop(messages) is not None
    assert_valid_history(messages)


def test_without_a_checkpointer_each_run_is_its_own_conversation() -> None:
    """No thread: the request is keyed by its user message; two runs never mix."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    graph = build_graph(model, make_tools(runs), guard)
    for n in (1, 2):
        messages = graph.invoke(ask())["messages"]
        assert runs.counts["read_file"] == 4 * n
        assert final_stop(messages) is not None


def test_steer_in_the_tool_result_when_the_wrapper_delivers_it() -> None:
    """deliver_steer=True: the steer is appended to the 3rd result, and not repeated."""
    guard = LoopGuard()
    model = ScriptedChatModel(script=obedient(READ_NOTES))
    graph = build_graph(model, make_tools(ToolRuns()), guard, deliver_steer=True)
    messages = graph.invoke(ask())["messages"]
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert steers(messages) == []
    assert "LOOP GUARD: you have called `read_file` 3 times" in str(tool_messages[2].content)
    assert tool_messages[2].response_metadata["loop_guard"] == "steer"
    assert sum("LOOP GUARD" in str(m.content) for m in tool_messages) == 1
    assert messages[-1].content == "Giving up on that; here is my answer."


def test_many_conversations_on_one_guard_in_threads_and_event_loops() -> None:
    """16 OS threads and 16 asyncio tasks share one guard and one graph: no cross-talk."""
    guard = LoopGuard()

    def script(messages: Any, index: int) -> AIMessage:
        task = str(messages[0].content)
        if task.startswith("loop"):
            return tool_calls_message(READ_NOTES)
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        if turn < 6:
            return tool_calls_message(
                ("read_file", {"path": f"{task}-{turn}.txt"}), ("list_dir", {"path": f"dir{turn}"})
            )
        return AIMessage(content=f"done {task}")

    graph = build_graph(
        ScriptedChatModel(script=script),
        make_tools(ToolRuns()),
        guard,
        checkpointer=InMemorySaver(),
    )
    results: dict[str, Any] = {}

    def worker(name: str) -> None:
        results[name] = graph.invoke(ask(name), {"configurable": {"thread_id": name}})["messages"]

    async def tasks() -> None:
        names = [f"loop-a{n}" if n % 2 else f"ok-a{n}" for n in range(16)]
        outs = await asyncio.gather(
            *(graph.ainvoke(ask(n), {"configurable": {"thread_id": n}}) for n in names)
        )
        results.update({n: o["messages"] for n, o in zip(names, outs, strict=True)})

    names = [f"loop-t{n}" if n % 2 else f"ok-t{n}" for n in range(16)]
    threads = [threading.Thread(target=worker, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    asyncio.run(tasks())
    for thread in threads:
        thread.join()
    assert len(results) == 32
    for name, messages in results.items():
        assert_valid_history(messages)
        if name.startswith("loop"):
            assert_stopped(messages, name)
        else:
            assert steers(messages) == [], name
            assert blocked(messages) == [], name


def test_wrapped_tools_alone_stop_at_the_next_call_after_the_abort() -> None:
    """Without handler or node the request still cannot run on: LoopGuardStop is raised."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    agent = create_agent(
        model, guard_tools(make_tools(runs), LoopGuard()), checkpointer=InMemorySaver()
    )
    with pytest.raises(LoopGuardStop):
        agent.invoke(ask(), THREAD)
    assert runs.counts["read_file"] == 4
    assert model.calls == 8


def test_guard_messages_never_start_a_request() -> None:
    """The steer is a HumanMessage, yet the streak goes on across it."""
    graph, runs, _ = graph_for(stubborn(READ_NOTES))
    messages = run(graph, ask(), THREAD, "invoke")
    assert isinstance(steers(messages)[0], HumanMessage)
    assert runs.counts["read_file"] == 4  # not 4 + 4: the steer did not reset anything


def test_a_failing_tool_counts_as_an_error_result() -> None:
    """A tool that raises (caught by the ToolNode's error handling) is an ordinary error step."""

    @tool
    def flaky() -> str:
        """Always fails."""
        raise ValueError("disk on fire")

    model = ScriptedChatModel(script=stubborn(("flaky", {})))
    graph = build_graph(model, [flaky], LoopGuard(), handle_tool_errors=True)
    messages = graph.invoke(ask())["messages"]
    assert final_stop(messages) is not None
    assert len(blocked(messages)) == 3
    assert "disk on fire" in str(messages[2].content)
    assert_valid_history(messages)


class ChatState(TypedDict):
    """A graph state that keeps its messages under `chat`."""

    chat: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]


def test_a_state_with_its_own_messages_key() -> None:
    """With messages under another key, requests are still told apart (see How the guard decides:
    reset)."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    builder = StateGraph(ChatState)
    builder.add_node("model", lambda state: {"chat": [model.invoke(state["chat"])], "turns": 1})
    tools = guard_tools(make_tools(runs), guard, deliver_steer=False, messages_key="chat")
    builder.add_node("tools", ToolNode(tools, messages_key="chat"))
    node = LoopGuardNode(guard, messages_key="chat")
    builder.add_node("loop_guard", node, destinations=("model", END))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: tools_condition(s, messages_key="chat"))
    builder.add_edge("tools", "loop_guard")
    graph = builder.compile(checkpointer=InMemorySaver())
    for request in (1, 2):
        chat = graph.invoke({"chat": [HumanMessage("go")]}, THREAD)["chat"]
        assert runs.counts["read_file"] == 4 * request
        assert final_stop(chat) is not None
        assert len(blocked(current_request(chat))) == 3


@pytest.mark.internals(reason="how a face finds a conversation's session from its history")
def test_memory_proves_it_is_current_before_it_is_used() -> None:
    """The state held is checked against the history at every look: kept when it has
    seen the newest response and nothing after it is news; caught up when another guard
    (another process) moved the thread on; rebuilt at a new user message; kept for a
    summarised history and for a model call that is not the thread's (no ids)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    from loop_guard._conversation import ConversationKey, session_for

    def announce(guard: LoopGuard, thread: str, history: list[Any]) -> None:
        session_for(guard, ConversationKey("thread", thread), history)

    def response(n: int) -> list[Any]:
        call = {"name": "ls", "args": {}, "id": "call_0"}  # a provider reusing its ids
        return [
            AIMessage("", id=f"a{n}", tool_calls=[call]),
            ToolMessage("x", tool_call_id="call_0"),
        ]

    here, elsewhere = LoopGuard(), LoopGuard()
    kept = here._conversations.states  # what `here` holds, by conversation
    history: list[Any] = [HumanMessage("one", id="h1"), *response(1)]
    for guard in (here, elsewhere):
        announce(guard, "t", history)
        for call in (Call.of("ls", {}, id="call_0", key="a1#0"),):
            guard.session("t").check_call(call)
            guard.session("t").record_result(call, Result.of("x"))
    held = kept["t"]
    announce(here, "t", history)
    assert kept["t"] is held  # current: kept as it is
    for n in (2, 3):  # another process runs two more steps and delivers the steer
        history += response(n)
        announce(elsewhere, "t", history)
        call = Call.of("ls", {}, id="call_0", key=f"a{n}#0")
        elsewhere.session("t").check_call(call)
        elsewhere.session("t").record_result(call, Result.of("x"))
    assert elsewhere.session("t").take_steer() is not None
    history.append(HumanMessage("steer", name="loop_guard", id="s1"))
    announce(here, "t", history)
    assert kept["t"].to_dict() == elsewhere._conversations.states["t"].to_dict()
    assert kept["t"].streak == 3
    assert here.session("t").take_steer() is None
    caught_up = kept["t"]
    announce(here, "t", [HumanMessage("Summarise this conversation.")])  # a summarizer's call
    assert kept["t"] is caught_up
    summary = HumanMessage("summary", id="s", additional_kwargs={"lc_source": "summarization"})
    announce(here, "t", [summary, *history[-3:]])
    assert kept["t"] is caught_up
    history.append(HumanMessage("two", id="h2"))
    announce(here, "t", history)
    assert kept["t"].request_id == "h2"
    assert kept["t"].streak == 0


@pytest.mark.internals(reason="counts the fingerprint functions' calls by patching them")
@pytest.mark.parametrize("dedupe", [False, True])
def test_a_wide_batch_is_fingerprinted_in_linear_time(
    monkeypatch: pytest.MonkeyPatch, dedupe: bool
) -> None:
    """The first wrapped sibling decides the whole response; the others find their
    verdicts, so a batch of n calls costs n fingerprints, not one pass of n per sibling
    (with `dedupe_siblings` too, where every sibling needs the others)."""
    import loop_guard._values as values

    counted = 0
    real = values.args_fingerprint

    def counting(args: Any) -> str:
        nonlocal counted
        counted += 1
        return real(args)

    monkeypatch.setattr(values, "args_fingerprint", counting)
    width = 16
    batch = [("read_file", {"path": f"f{n}.txt"}) for n in range(width)]
    graph, runs, _ = graph_for(sequence(batch), dedupe_siblings=dedupe)
    graph.invoke(ask(), {**THREAD, "max_concurrency": 1})  # siblings one after another
    assert runs.counts == {"read_file": width}
    assert counted == width


@pytest.mark.slow
@pytest.mark.parametrize("face", ["middleware", "wrapper+handler"])
def test_a_summary_another_middleware_writes_is_not_a_new_request(face: str) -> None:
    """`SummarizationMiddleware` replaces old messages with a summary `HumanMessage`
    (`lc_source: summarization`): the request goes on, so the loop is still stopped; through
    the handler too, a summary does not restart the streak."""
    from langchain.agents.middleware import SummarizationMiddleware

    from loop_guard import LoopGuardMiddleware

    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    summarizer = ScriptedChatModel(script=lambda messages, index: AIMessage("It reads notes.md."))
    summarize = SummarizationMiddleware(
        model=summarizer, trigger=("messages", 6), keep=("messages", 3)
    )
    config: Any = {**THREAD, "recursion_limit": 80}
    if face == "middleware":
        agent = create_agent(
            model,
            make_tools(runs),
            middleware=[summarize, LoopGuardMiddleware()],
            checkpointer=InMemorySaver(),
        )
        messages = agent.invoke(ask(), config)["messages"]
        assert final_stop(messages) is not None
    else:
        guard = LoopGuard()
        agent = create_agent(
            model, guard_tools(make_tools(runs), guard), middleware=[summarize],
            checkpointer=InMemorySaver(),
        )  # fmt: skip
        with pytest.raises(LoopGuardStop):
            agent.invoke(ask(), {**config, "callbacks": [LoopGuardCallbackHandler(guard)]})
        assert guard.stats.steers == 1
    assert runs.counts["read_file"] == 4


def _lists_four_times(messages: Any, index: int) -> AIMessage:
    """`list_dir(".")` four times per request, then an answer."""
    request = current_request(messages)
    turns = sum(isinstance(m, AIMessage) for m in request)
    return tool_calls_message(LIST_DIR) if turns < 4 else AIMessage("done")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_fork_from_an_earlier_checkpoint_decides_as_a_fresh_process(mode: Mode) -> None:
    """Continuing a thread from an earlier checkpoint (a fork, time travel): the memory the
    process holds is ahead of that history, so it is rebuilt from it, and the fork decides
    as a fresh process does: the old steps are not counted twice, the fork is not stopped."""
    saver = InMemorySaver()
    first = LoopGuard()
    graph = build_graph(
        ScriptedChatModel(script=_lists_four_times), make_tools(ToolRuns()), first,
        checkpointer=saver,
    )  # fmt: skip
    graph.invoke(ask(), THREAD)
    fork = next(
        snapshot
        for snapshot in graph.get_state_history(THREAD)
        if snapshot.next == ("model",)
        and sum(isinstance(m, ToolMessage) for m in snapshot.values["messages"]) == 1
    )
    decided = []
    for guard in (first, LoopGuard()):  # the same process, then a fresh one
        events: list[GuardEvent] = []
        guard.on_event = events.append
        forked = build_graph(
            ScriptedChatModel(script=_lists_four_times), make_tools(ToolRuns()), guard,
            checkpointer=saver,
        )  # fmt: skip
        messages = run(forked, None, fork.config, mode)
        decided.append(([(e.kind, e.streak) for e in events], timeline(messages)))
    assert decided[0] == decided[1]
    assert decided[0][0] == [("steer", 3)]


def test_inputs_invoked_twice_without_a_thread_start_fresh() -> None:
    """The same inputs invoked twice on one guard, no thread, no handler: LangGraph gives
    the user message its id in place, so both runs name the same request; the second is
    rebuilt from its own history, and does not inherit the first run's stop (the tool
    raises no LoopGuardStop)."""
    guard = LoopGuard()
    inputs = ask()
    outcomes = []
    for _ in range(2):
        runs = ToolRuns()
        graph = build_graph(ScriptedChatModel(script=stubborn(READ_NOTES)), make_tools(runs), guard)
        messages = graph.invoke(inputs, {"recursion_limit": 60})["messages"]
        outcomes.append((runs.counts["read_file"], final_stop(messages) is not None))
    assert outcomes == [(4, True), (4, True)]


def test_concurrent_runs_sharing_a_system_message_are_apart() -> None:
    """Sixteen runs at once without a thread, all starting with one module-level system
    message: each is its own conversation, steered and stopped alone."""
    from concurrent.futures import ThreadPoolExecutor

    from langchain_core.messages import HumanMessage, SystemMessage

    guard = LoopGuard()
    system = SystemMessage("You are helpful.")

    def one(n: int) -> tuple[int, int, bool]:
        runs = ToolRuns()
        graph = build_graph(ScriptedChatModel(script=stubborn(READ_NOTES)), make_tools(runs), guard)
        inputs = {"messages": [system, HumanMessage(f"question {n}")]}
        messages = graph.invoke(inputs, {"recursion_limit": 60})["messages"]
        return runs.counts["read_file"], len(steers(messages)), final_stop(messages) is not None

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(one, range(16))) == {(4, 1, True)}


def test_the_node_leaves_a_batch_open_when_the_last_reply_has_no_calls() -> None:
    """The node settles the batch of the reply it follows; a reply without calls shows
    none, so a batch still open stays open (as a replay of the history leaves it)."""
    guard = LoopGuard(warn_threshold=2)
    builder = StateGraph(MessagesState)
    builder.add_node("loop_guard", LoopGuardNode(guard, next_node=END))
    builder.add_edge(START, "loop_guard")
    graph = builder.compile(checkpointer=InMemorySaver())

    def read(call_id: str, name: str = "read") -> dict[str, Any]:
        return {"name": name, "args": {"p": 1}, "id": call_id, "type": "tool_call"}

    history = [
        HumanMessage("go", id="h1"),
        AIMessage("", tool_calls=[read("c1")], id="a1"),
        ToolMessage("same", tool_call_id="c1", id="t1"),
        AIMessage("", tool_calls=[read("c2"), read("c3", "ls")], id="a2"),
        ToolMessage("same", tool_call_id="c2", id="t2"),  # `ls` never answered
        AIMessage("done", id="a3"),
    ]
    out = graph.invoke({"messages": history}, THREAD)
    assert [m.id for m in out["messages"]] == [m.id for m in history]  # no steer
    assert guard.session("t").state.streak == 1


class _Reads:
    """The messages the guard reads from a history, per model step (while `on`)."""

    def __init__(self) -> None:
        self.step = 0
        self.on = False
        self.per_step: Counter[int] = Counter()


_reads = _Reads()


class _CountedMessages(list[AnyMessage]):
    """A graph's messages that count each message read from them while the guard runs."""

    def _count(self, read: int) -> None:
        if _reads.on:
            _reads.per_step[_reads.step] += read

    def __getitem__(self, index: Any) -> Any:
        out = super().__getitem__(index)
        self._count(len(out) if isinstance(index, slice) else 1)
        return out

    def __iter__(self) -> Iterator[AnyMessage]:
        for message in super().__iter__():
            self._count(1)
            yield message

    def __reversed__(self) -> Iterator[AnyMessage]:
        for message in super().__reversed__():
            self._count(1)
            yield message


def _add_counted(left: Any, right: Any) -> _CountedMessages:
    return _CountedMessages(add_messages(left, right))


class _CountedState(TypedDict):
    messages: Annotated[list[AnyMessage], _add_counted]


class _CountedNode(LoopGuardNode):
    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        _reads.on = True
        try:
            return super().__call__(state, config)
        finally:
            _reads.on = False


def _counted_tool_call(request: Any, execute: Any) -> Any:
    _reads.on = True
    try:
        return execute(request)
    finally:
        _reads.on = False


def _steps_read(face: str, mode: Mode, earlier: int, steps: int) -> list[int]:
    """Messages the guard read at each of `steps` new model steps of a thread-less
    hand-built graph's request that holds `earlier` steps already."""
    guard = LoopGuard()
    model = ScriptedChatModel(
        script=lambda messages, index: (
            tool_calls_message(("read_file", {"path": f"new/{index}.py"}))
            if index < steps
            else AIMessage("done")
        )
    )

    def call_model(state: _CountedState) -> dict[str, Any]:
        _reads.step += 1
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(_CountedState)
    builder.add_node("model", call_model)
    wrapped = guard_tools(make_tools(ToolRuns()), guard)
    builder.add_node("tools", ToolNode(wrapped, wrap_tool_call=_counted_tool_call))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    if face == "node":
        builder.add_node("loop_guard", _CountedNode(guard), destinations=("model", END))
        builder.add_edge("tools", "loop_guard")
    else:
        builder.add_edge("tools", "model")
    history: list[AnyMessage] = [HumanMessage("Read every module.")]
    for n in range(earlier):
        call = {"name": "read_file", "args": {"path": f"old/{n}.py"}, "id": f"old_{n}"}
        history += [
            AIMessage("", tool_calls=[{**call, "type": "tool_call"}]),
            ToolMessage(f"contents of old/{n}.py", tool_call_id=f"old_{n}"),
        ]
    _reads.step, _reads.per_step = 0, Counter()
    messages = run(builder.compile(), {"messages": history}, {"recursion_limit": 100}, mode)
    assert messages[-1].content == "done"
    assert not steers(messages)
    return [_reads.per_step[step] for step in range(1, steps + 1)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("face", ["node", "tools"])
def test_a_long_request_without_a_thread_costs_the_same_per_step(face: str, mode: Mode) -> None:
    """Outside a thread a request is known by its user message: the guard finds it again
    at every step without walking the whole request back: a step after 5,000 earlier
    steps reads as many messages as a step after none."""
    short = _steps_read(face, mode, 0, 10)
    long = _steps_read(face, mode, 5000, 10)
    # The first step of a request the guard never saw replays it; the steps after it
    # read the same few messages whatever the request's length.
    assert max(long[1:]) <= max(short[1:])
    assert max(short[1:]) < 60


@pytest.mark.internals(reason="the remembered request start the history reader keeps")
def test_a_remembered_request_start_proves_it_holds_before_it_is_used() -> None:
    """The start of a thread-less request, remembered by its history's last message, is
    used only while that message and the request's first message are where they were:
    a trimmed, rewritten or forked history, a new user message or the guard's stop with
    a message after it is walked again, and named as the full walk names it."""
    from loop_guard._history import RequestStarts, current_request, request_start

    def step(n: int) -> list[AnyMessage]:
        call = {"name": "ls", "args": {"n": n}, "id": f"c{n}", "type": "tool_call"}
        return [
            AIMessage("", id=f"a{n}", tool_calls=[call]),
            ToolMessage("x", tool_call_id=f"c{n}", id=f"t{n}"),
        ]

    def check(history: list[AnyMessage]) -> int | None:
        start = request_start(history, known)
        walked, _ = current_request(history)
        assert (None if start is None else history[start].id) == walked
        return start

    known = RequestStarts()
    system = SystemMessage("You are helpful.", id="sys")
    history: list[AnyMessage] = [system, HumanMessage("one", id="h1"), *step(1)]
    assert check(history) == 1
    history += step(2)
    assert check(history) == 1  # remembered: t1 is still at 3, h1 still at 1
    assert check([system, *history[2:]]) is None  # trimmed: the user message is gone
    summary = HumanMessage("summary", id="s1", additional_kwargs={"lc_source": "summarization"})
    assert check([system, summary, *history[2:]]) is None  # rewritten in place
    assert check([system, HumanMessage("other", id="h9"), *history[2:]]) == 1
    fork = [*history[:4], HumanMessage("two", id="h2"), *step(3)]
    assert check(fork) == 4  # a fork after t1, and a new request in it
    assert check([*fork, *step(4)]) == 4
    stop = AIMessage("Stopped.", name="loop_guard", id="stop")
    assert check([*history, stop]) == 1  # the guard's stop ends the request...
    assert check([*history, stop, *step(5)]) == 6  # ...and what follows is another
