"""Hostile input, the guard's own faults, resumes and configuration abuse: nothing crashes."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from loop_guard import (
    Call,
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardConfig,
    LoopGuardConfigWarning,
    LoopGuardMiddleware,
    Result,
    ToolPolicy,
    _config,
    guard_tools,
)
from loop_guard._fingerprint import args_fingerprint, result_fingerprint
from loop_guard._history import replay
from loop_guard.testing import GuardDriver, ScriptedChatModel, capture_events, sequence, stubborn
from tests.support import examples
from tests.support.agents import (
    LIST_DIR,
    READ_NOTES,
    ToolRuns,
    ask,
    assert_valid_history,
    blocked,
    build_graph,
    current_request,
    final_stop,
    make_tools,
    timeline,
)


class Detached:
    """An ORM-like object whose every attribute access raises."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"detached instance: {name}")


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@pytest.mark.parametrize(
    "value",
    [Detached(), 10**5000, {"n": 10**5000}, [Detached()], {"x": float("nan")}],
    ids=["detached", "huge-int", "huge-int-in-dict", "detached-in-list", "nan"],
)
def test_fingerprints_never_raise_on_hostile_values(value: Any) -> None:
    """Objects that raise on access and ints beyond the digit limit are still encoded."""
    assert args_fingerprint(value) == args_fingerprint(value)
    assert result_fingerprint(value) == result_fingerprint(value)


def test_a_hostile_tool_result_does_not_crash_the_agent() -> None:
    """A tool returning blocks with objects that raise: the agent runs as without the guard."""

    @tool
    def lookup(key: str) -> list[dict[str, Any]]:
        """Look a key up."""
        return [{"type": "json", "json": {"row": Detached(), "big": 10**5000}}]

    model = ScriptedChatModel(script=sequence([("lookup", {"key": "a"})], answer="ok"))
    agent = create_agent(model, [lookup], middleware=[LoopGuardMiddleware()])
    assert agent.invoke(ask())["messages"][-1].content == "ok"


def test_a_blocked_last_call_does_not_let_the_loop_restart() -> None:
    """[read, list] repeated: once `list` is blocked it stays blocked (see How the guard
    decides: block, and batches)."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES, LIST_DIR))
    agent = create_agent(model, make_tools(runs), middleware=[LoopGuardMiddleware()])
    messages = agent.invoke(ask())["messages"]
    assert runs.counts["list_dir"] == 4
    assert final_stop(messages) is not None
    assert_valid_history(messages)


class FaultyEngine:
    """The guard's engine, failing once as an internal bug would: on the first check of
    a response after the streak reached 4 (the call that would be the first block)."""

    def __init__(self, guard: LoopGuard) -> None:
        self.inner, self.failed = guard._engine, False
        guard._engine = self  # type: ignore[assignment]

    def check_batch(self, state: Any, calls: Any, tokens: int = 0) -> Any:
        if state.streak >= 4 and not self.failed:
            self.failed = True
            raise RuntimeError("simulated guard bug")
        return self.inner.check_batch(state, calls, tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("face", ["middleware", "graph"])
def test_a_fault_of_the_guard_fails_open_for_that_event_only(
    face: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The faulty event runs unguarded, one ERROR is logged, an error event is emitted,
    and the following events are judged normally."""
    events: list[GuardEvent] = []
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES))
    if face == "middleware":
        middleware = LoopGuardMiddleware(on_event=events.append)
        guard = middleware.guard
        runnable: Any = create_agent(model, make_tools(runs), middleware=[middleware])
    else:
        guard = LoopGuard(on_event=events.append)
        runnable = build_graph(model, make_tools(runs), guard)
    FaultyEngine(guard)
    with caplog.at_level(logging.ERROR, logger="loop_guard"):
        messages = runnable.invoke(ask())["messages"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "simulated guard bug" in errors[0].getMessage() or errors[0].exc_info
    assert [e.kind for e in events] == ["steer", "error", "block", "block", "block", "stop"]
    # The middleware failed on the 5th call, which then ran unguarded; in the graph the
    # node's check after the 4th result failed, and the wrapper blocked the 5th call.
    assert runs.counts["read_file"] == (5 if face == "middleware" else 4)
    assert final_stop(messages) is not None
    assert guard.stats.errors == 1
    assert_valid_history(messages)


@pytest.mark.internals(reason="the history replay a fresh guard rebuilds its state with")
def test_replay_counts_the_result_not_the_steer_appended_to_it() -> None:
    """A steered tool result keeps its original fingerprint for replays after a restart."""
    guard = LoopGuard()
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(LIST_DIR))
    graph = build_graph(model, make_tools(runs), guard, deliver_steer=True)
    messages = graph.invoke(ask())["messages"]
    steered = [m for m in messages if isinstance(m, ToolMessage) and "loop_guard_result" in
               m.response_metadata]  # fmt: skip
    assert len(steered) == 1
    state = replay(guard._engine, None, messages[:9])  # through the 4th result
    assert state.streak == 4


def test_late_sibling_gets_its_settled_verdict() -> None:
    """A sibling that asks after its batch was settled gets the same verdict again."""
    guard = LoopGuard(abort_threshold=10)
    session = guard.session("t")
    for n in range(4):
        call = Call.of("ls", {}, id=f"a{n}")
        session.check_call(call)
        session.record_result(call, Result.of("x"))
    blocked_call, other = Call.of("ls", {}, id="b"), Call.of("cat", {}, id="c")
    session.check_batch([blocked_call, other])
    session.record_result(other, Result.of("y"))  # settles the batch
    assert type(session.check_call(blocked_call)).__name__ == "Block"
    assert guard.stats.blocks == 1


def test_a_bad_environment_beside_unrelated_arguments_keeps_the_defaults(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad environment is not the arguments' fault: the arguments hold, the variable falls
    back to its default and is named; an argument that is wrong on its own still raises."""
    monkeypatch.setattr(_config, "_said", set())
    monkeypatch.setenv("LOOP_GUARD_WARN_THRESHOLD", "7")
    with (
        caplog.at_level(logging.WARNING, logger="loop_guard"),
        pytest.warns(LoopGuardConfigWarning, match="LOOP_GUARD_WARN_THRESHOLD='7'"),
    ):
        config = LoopGuard(abort_threshold=2).config
    assert (config.enabled, config.warn_threshold, config.abort_threshold) == (True, 3, 2)
    assert "LOOP_GUARD_WARN_THRESHOLD='7'" in caplog.text
    with pytest.raises(ValueError, match="warn_threshold"):
        LoopGuard(warn_threshold=9)  # the argument itself conflicts with the default block


@pytest.mark.parametrize(
    "raw", ["", " ", "-1", "0", "99999999999999999999", "abc", "TRUE", " 4 ", "4.0", "1e3"]
)
@pytest.mark.parametrize(
    "variable",
    [
        "LOOP_GUARD_ENABLED",
        "LOOP_GUARD_WARN_THRESHOLD",
        "LOOP_GUARD_BLOCK_THRESHOLD",
        "LOOP_GUARD_ABORT_THRESHOLD",
        "LOOP_GUARD_IGNORE_TOOLS",
        "LOOP_GUARD_IGNORE_ERRORS",
        "LOOP_GUARD_USE_TERMINATE",
    ],
)
def test_configuration_abuse_never_crashes(variable: str, raw: str) -> None:
    """Every variable with odd values: a valid, enabled config (the bad setting at its
    default), never an error; only a false `LOOP_GUARD_ENABLED` switches the guard off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoopGuardConfigWarning)
        config = LoopGuardConfig.from_env({variable: raw})
    assert isinstance(config, LoopGuardConfig)
    assert config.enabled is not (variable == "LOOP_GUARD_ENABLED" and raw == "0")
    assert config.warn_threshold < config.block_threshold
    guard = LoopGuard(config)
    call = Call.of("x", {})
    guard.session("t").check_call(call)
    guard.session("t").record_result(call, Result.of("r"))


def test_blocked_history_from_a_mixed_batch_stays_valid_in_the_graph() -> None:
    """Siblings of the stopping call that never ran are answered as not run."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(READ_NOTES, LIST_DIR))
    messages = build_graph(model, make_tools(runs), LoopGuard()).invoke(ask())["messages"]
    assert runs.counts["list_dir"] == 4
    assert len(blocked(messages)) >= 3
    assert_valid_history(messages)


# Hypothesis: arbitrary JSON-like and non-JSON args and results never make the guard raise.
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary()
    | st.decimals()
    | st.datetimes()
    | st.builds(Detached)
    | st.builds(object)
)
hostile = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.frozensets(st.integers() | st.text(max_size=3), max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=4)
    ),
    max_leaves=25,
)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@settings(max_examples=examples(300), deadline=None)
@given(args=hostile, result=hostile, is_error=st.booleans())
def test_arbitrary_values_never_make_the_guard_raise(
    args: Any, result: Any, is_error: bool
) -> None:
    """Any args and any result: fingerprints are stable and every decision is made."""
    assert args_fingerprint(args) == args_fingerprint(args)
    driver = GuardDriver(LoopGuard(warn_threshold=1, block_threshold=2))
    for _ in range(3):
        driver.step("tool", args, result, error=is_error)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_numpy_arrays_compare_by_content() -> None:
    """Arrays are encoded through tolist(): equal content is the same argument."""
    np = pytest.importorskip("numpy")
    assert args_fingerprint({"a": np.arange(3)}) == args_fingerprint({"a": [0, 1, 2]})
    assert args_fingerprint(np.zeros(2000)) != args_fingerprint(np.ones(2000))
    assert args_fingerprint(np.float64(2.0)) == args_fingerprint(2)


def test_a_100_mb_result_costs_bounded_memory() -> None:
    """Hashing a 100 MB result allocates a small, fixed amount beside it."""
    import tracemalloc

    text = "x" * 100_000_000
    tracemalloc.start()
    try:
        Result.of(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000


def test_deep_args_and_odd_results_through_a_wrapped_tool() -> None:
    """Deeply nested args (as deep as LangChain itself can print) and a result with a lone
    surrogate: the tool gets its args unchanged and the repeats are blocked."""
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    seen: list[Any] = []

    @tool
    def echo(payload: Any) -> str:
        """Echo."""
        seen.append(payload)
        return "\ud800 lone surrogate"

    guard = LoopGuard()
    [wrapped] = guard_tools([echo], guard)
    for n in range(6):
        call = {"name": "echo", "args": {"payload": deep}, "id": f"c{n}", "type": "tool_call"}
        wrapped.invoke(call, {"configurable": {"thread_id": "deep"}})
    assert len(seen) == 4  # the 5th and 6th identical calls were blocked
    assert seen[0] is deep


def test_none_and_command_results_are_results() -> None:
    """A tool returning None, or a Command, is recorded like any other result."""

    from langgraph.types import Command

    @tool
    def nothing() -> None:
        """Returns nothing."""

    @tool
    def command(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Returns a Command."""
        return Command(update={"messages": [ToolMessage("done", tool_call_id=tool_call_id)]})

    guard = LoopGuard(warn_threshold=2, block_threshold=3)
    for wrapped in guard_tools([nothing, command], guard):
        outputs = [
            wrapped.invoke(
                {"name": wrapped.name, "args": {}, "id": f"{wrapped.name}{n}", "type": "tool_call"},
                {"configurable": {"thread_id": wrapped.name}},
            )
            for n in range(3)
        ]
        last = outputs[-1]
        assert isinstance(last, ToolMessage)
        assert last.status == "error"


@pytest.mark.parametrize("handler", [False, True], ids=["wrapper", "wrapper+handler"])
def test_a_cancelled_tool_is_no_result_but_its_own_timeout_is(handler: bool) -> None:
    """Cancelled mid-call (asyncio): control flow, not a result, so repeated cancellations
    are neither steered nor blocked (no error result "CancelledError" is counted). A tool
    that times out by itself (its own `TimeoutError`) fails: repeated, it is steered and
    blocked like any repeated failure."""
    import asyncio

    @tool
    async def slow(job: str) -> str:
        """Waits."""
        await asyncio.sleep(10)
        return "never"

    @tool
    async def times_out(job: str) -> str:
        """Gives up waiting by itself."""
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.001)
        return "never"

    @tool
    async def failing(job: str) -> str:
        """Fails."""
        raise ToolException("always")

    times_out.handle_tool_error = failing.handle_tool_error = True

    def decisions(runner: Any) -> list[str]:
        guard = LoopGuard()
        [wrapped] = guard_tools([runner], guard)
        with capture_events(guard) as events:
            for n in range(5):
                call = {
                    "name": runner.name,
                    "args": {"job": "a"},
                    "id": f"c{n}",
                    "type": "tool_call",
                }
                config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
                if handler:
                    config["callbacks"] = [LoopGuardCallbackHandler(guard)]

                async def attempt(call: Any = call, config: Any = config) -> None:
                    await asyncio.wait_for(wrapped.ainvoke(call, config), timeout=0.05)

                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    asyncio.run(attempt())
        return [e.kind for e in events]

    assert decisions(slow) == []
    assert decisions(times_out) == decisions(failing) == ["steer", "block"]


def test_a_run_cancelled_mid_batch_leaves_the_guard_consistent() -> None:
    """asyncio cancellation while one sibling still runs: the calls that finished are
    recorded, the cancelled one has no result, and the next request on the thread decides
    exactly like a request on a fresh thread."""
    import asyncio

    @tool
    async def slow(job: str) -> str:
        """Waits a long time."""
        await asyncio.sleep(30)
        return "never"

    events: list[GuardEvent] = []
    guard = LoopGuard(on_event=events.append)
    runs = ToolRuns()
    first_turn = sequence([("slow", {"job": "a"}), READ_NOTES])
    stubborn_after = stubborn(READ_NOTES)

    def script(messages: Any, index: int) -> Any:
        return (first_turn if index == 0 else stubborn_after)(messages, index)

    model = ScriptedChatModel(script=script)
    graph = build_graph(model, [*make_tools(runs), slow], guard, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cancelled"}}

    async def cancelled_run() -> None:
        await asyncio.wait_for(graph.ainvoke(ask(), config), timeout=2.0)

    with pytest.raises((TimeoutError, asyncio.TimeoutError)):
        asyncio.run(cancelled_run())
    assert runs.counts["read_file"] == 1  # the sibling finished before the cancellation
    assert events == []

    fresh_runs = ToolRuns()
    fresh = build_graph(
        ScriptedChatModel(script=stubborn(READ_NOTES)), make_tools(fresh_runs), LoopGuard(),
        checkpointer=InMemorySaver(),
    )  # fmt: skip
    expected = fresh.invoke(ask(), {"configurable": {"thread_id": "fresh"}})["messages"]
    messages = graph.invoke(ask(), config)["messages"]
    assert timeline(current_request(messages)) == timeline(current_request(expected))
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]


def _failing_normalizer(text: str) -> str:
    raise ValueError("a normalizer bug")


@pytest.mark.parametrize("face", ["middleware", "graph"])
def test_a_failing_normalizer_hides_only_its_own_call(face: str) -> None:
    """A user's normalizer that raises for one tool costs the guard that call's result
    only: the rest of each batch is still recorded, so the loop beside it is stopped.

    The graph's tools are not wrapped here: the node records every result itself.
    """
    events: list[GuardEvent] = []
    options: dict[str, Any] = {
        "on_event": events.append,
        "tools": {"list_dir": ToolPolicy(normalizer=_failing_normalizer)},
    }
    model = ScriptedChatModel(script=stubborn(READ_NOTES, LIST_DIR))
    tools = make_tools(ToolRuns())
    if face == "middleware":
        middleware = LoopGuardMiddleware(**options)
        guard = middleware.guard
        runnable: Any = create_agent(model, tools, middleware=[middleware])
    else:
        guard = LoopGuard(**options)
        runnable = build_graph(model, tools, guard, wrapped=False)
    with _quiet_guard_log():
        messages = runnable.invoke(ask(), {"recursion_limit": 200})["messages"]
    kinds = [event.kind for event in events]
    assert "steer" in kinds, kinds
    assert kinds[-1] == "stop", kinds
    assert guard.stats.errors > 0  # each failing read was reported
    assert final_stop(messages) is not None
    assert_valid_history(messages)


@contextlib.contextmanager
def _quiet_guard_log() -> Any:
    logger = logging.getLogger("loop_guard")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
