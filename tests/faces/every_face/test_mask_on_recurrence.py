"""Fresh values are masked only when a call recurs: a call new to the request cannot be a
repeat, so its result is hashed as returned; when its tool and args come back, its result
and the earlier run's are masked, the earlier one found in the history (middleware, node)
or in the guard's cache of last results (wrapped tools, handler)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver

import loop_guard._volatile as volatile
from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardMiddleware, guard_tools
from loop_guard.testing import ScriptedChatModel, sequence
from tests.support.agents import Mode, build_graph, run

FACES = ("middleware", "tools+node", "tools+handler")


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts masked for fresh values, in order."""
    texts: list[str] = []
    real = volatile._mask

    def counting(text: str, *args: Any, **kwargs: Any) -> tuple[str, bool]:
        texts.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(volatile, "_mask", counting)
    return texts


def _tools() -> list[BaseTool]:
    @tool
    def send(to: str) -> str:
        """Send the report."""
        return f'{{"ok": true, "to": "{to}", "messageId": "{uuid.uuid4().hex}"}}'

    return [send]


def _agent(face: str, script: Any, tools: Any = _tools) -> tuple[Any, dict[str, Any]]:
    model = ScriptedChatModel(script=script)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    if face == "middleware":
        middleware = [LoopGuardMiddleware()]
        agent = create_agent(model, tools(), middleware=middleware, checkpointer=InMemorySaver())
        return agent, config
    guard = LoopGuard()
    tools = guard_tools(tools(), guard)
    if face == "tools+handler":
        handler = {"callbacks": [LoopGuardCallbackHandler(guard)]}
        return create_agent(model, tools, checkpointer=InMemorySaver()), {**config, **handler}
    return build_graph(model, tools, guard, checkpointer=InMemorySaver()), config


@pytest.mark.internals(reason="counts the masking passes by patching the masker")
@pytest.mark.parametrize("face", FACES)
def test_a_healthy_run_masks_nothing(face: str, masked: list[str]) -> None:
    """Eight sends to eight people: no call recurs, so no result is masked."""
    script = sequence(*[[("send", {"to": f"user{n}@example.com"})] for n in range(8)])
    agent, config = _agent(face, script)
    messages = run(agent, {"messages": [("user", "send the reports")]}, config, "invoke")
    assert sum(message.type == "tool" for message in messages) == 8
    assert masked == []


@pytest.mark.internals(reason="counts the masking passes by patching the masker")
@pytest.mark.parametrize("face", FACES)
def test_a_send_repeated_with_fresh_ids_is_caught_as_before(face: str, masked: list[str]) -> None:
    """The same send, a new message id each time: its first run is masked once the call
    recurs, so the near-repeats are steered and blocked at the runs they always were."""
    other = [[("send", {"to": f"user{n}@example.com"})] for n in range(3)]
    same = [[("send", {"to": "boss@example.com"})]] * 8
    agent, config = _agent(face, sequence(*other, *same))
    messages = run(agent, {"messages": [("user", "send the report")]}, config, "invoke")
    results = [message for message in messages if message.type == "tool"]
    blocked = [n for n, message in enumerate(results, 1) if message.status == "error"]
    assert blocked[:1] == [3 + 7]  # the 7th send to the boss: near-repeats are given longer
    assert not any("user0" in text or "user1" in text for text in masked)  # never recurred


def _quoting_tools(quotes: bool) -> Any:
    def tools() -> list[BaseTool]:
        @tool
        def read(path: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
            """Read a file."""
            served = tool_call_id if quotes else "the cache"
            return f"{path}:\n" + "a line of the file\n" * 300 + f"served for {served}\n"

        return [read]

    return tools


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize("face", FACES)
def test_a_result_quoting_its_call_id_is_caught_as_a_plain_repeat(face: str, mode: Mode) -> None:
    """A long result that quotes its own call's id past its first characters: the id is
    left out once the call recurs, so the repeats are steered and blocked at the calls
    where a result quoting nothing is."""
    script = [[("read", {"path": "notes.md"})]] * 6  # steered and blocked, not stopped
    outcomes = []
    for quotes in (True, False):
        agent, config = _agent(face, sequence(*script), _quoting_tools(quotes))
        messages = run(agent, {"messages": [("user", "read the notes")]}, config, mode)
        results = [message for message in messages if message.type == "tool"]
        steered = [n for n, message in enumerate(messages) if message.name == "loop_guard"]
        blocked = [n for n, message in enumerate(results, 1) if message.status == "error"]
        outcomes.append((len(results), len(steered), blocked))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][2] == [5, 6]
