"""Each batch is read once: a call's args are fingerprinted once and a result is hashed
once per conversation, whatever combination of faces watches it.

Every face looks at the same response and the same results (the handler, the wrapped
tools, the node); reading them again would cost a fingerprint per face per call.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver

import loop_guard._reply_watch as reply_watch
import loop_guard._values as values
from loop_guard import LoopGuard, LoopGuardCallbackHandler, LoopGuardMiddleware, guard_tools
from loop_guard.testing import ScriptedChatModel, sequence
from tests.support.agents import MODES, Mode, ToolRuns, ask, build_graph, make_tools, run

STEPS = 6
WIDTH = 3


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often args were fingerprinted and results hashed."""
    counts: Counter[str] = Counter()
    for name in ("args_fingerprint", "result_fingerprint"):
        real = getattr(values, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> str:
            counts[_name] += 1
            return str(_real(*args, **kwargs))

        monkeypatch.setattr(values, name, counting)
    return counts


def _healthy() -> Any:
    """STEPS turns of WIDTH parallel calls, every call new: nothing to steer."""
    return sequence(
        *[[("list_dir", {"path": f"d{turn}-{n}"}) for n in range(WIDTH)] for turn in range(STEPS)]
    )


def _agent(face: str) -> tuple[Any, dict[str, Any]]:
    model = ScriptedChatModel(script=_healthy())
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    if face == "middleware":
        agent = create_agent(
            model, make_tools(ToolRuns()), middleware=[LoopGuardMiddleware()],
            checkpointer=InMemorySaver(),
        )  # fmt: skip
        return agent, config
    guard = LoopGuard()
    handler = {"callbacks": [LoopGuardCallbackHandler(guard)]}
    if face == "tools+handler":
        tools = guard_tools(make_tools(ToolRuns()), guard)
        return create_agent(model, tools, checkpointer=InMemorySaver()), {**config, **handler}
    graph = build_graph(model, make_tools(ToolRuns()), guard, checkpointer=InMemorySaver())
    return graph, {**config, **handler} if face == "tools+node+handler" else config


@pytest.mark.internals(reason="counts the fingerprint functions' calls by patching them")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "face", ["middleware", "tools+node", "tools+node+handler", "tools+handler"]
)
def test_every_call_is_fingerprinted_and_every_result_hashed_once(
    face: str, mode: Mode, reads: Counter[str]
) -> None:
    """18 calls in 6 responses: 18 args fingerprints and 18 result hashes, with any faces."""
    agent, config = _agent(face)
    run(agent, ask(), config, mode)
    assert reads == {"args_fingerprint": STEPS * WIDTH, "result_fingerprint": STEPS * WIDTH}


@pytest.mark.internals(reason="the per-message cache of a response's calls")
def test_a_response_whose_calls_were_replaced_is_read_again() -> None:
    """Human approval edits a response by giving it new tool calls: the calls read before
    are not reused for it."""
    from langchain_core.messages import AIMessage

    from loop_guard._langchain import calls_of

    message = AIMessage("", id="r1", tool_calls=[{"name": "ls", "args": {"path": "a"}, "id": "c"}])
    before = calls_of(message)
    assert calls_of(message) is before  # read once
    message.tool_calls = [{"name": "ls", "args": {"path": "b"}, "id": "c", "type": "tool_call"}]
    after = calls_of(message)
    assert after[0].args == {"path": "b"}
    assert after[0].fingerprint != before[0].fingerprint


@pytest.mark.internals(reason="counts the repeated-text reads by patching the detector")
@pytest.mark.parametrize("face", ["middleware", "tools+handler"])
def test_only_replies_with_text_are_read_for_repeated_text(
    face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six replies of tool calls only, then the answer: the answer alone is read."""
    read: list[str] = []
    real = reply_watch.find_repetition

    def counting(text: str, min_chars: int) -> Any:
        read.append(text)
        return real(text, min_chars)

    monkeypatch.setattr(reply_watch, "find_repetition", counting)
    agent, config = _agent(face)
    run(agent, ask(), config, "invoke")
    assert read == ["done"]
