"""`exit_behavior="ask"`: where the guard would stop, a person decides, through LangGraph's
`interrupt()` with a `HumanInTheLoopMiddleware`-shaped request, resumed by `Command`."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware.human_in_the_loop import HITLRequest, HITLResponse
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command
from pydantic import TypeAdapter

from loop_guard import LoopCost, LoopGuardMiddleware
from loop_guard._langchain import is_marked
from loop_guard.marks import BLOCK_MARK, FINAL_ANSWER_MARK, GUARD_NAME
from loop_guard.middleware import ExitBehavior
from loop_guard.testing import ScriptedChatModel, ToolCallSpec, capture_events, stubborn
from tests.support.agents import (
    LIST_DIR,
    ToolRuns,
    ask,
    assert_valid_history,
    make_tools,
    needs_async_context,
)

APPROVE: HITLResponse = {"decisions": [{"type": "approve"}]}
# An edit that leaves the call as it was: the guard's limits raised, the same call run.
EDIT: HITLResponse = {
    "decisions": [{"type": "edit", "edited_action": {"name": "list_dir", "args": {"path": "."}}}]
}
REJECT: HITLResponse = {"decisions": [{"type": "reject"}]}


class Asking:
    """A stubborn agent making `calls` (`LIST_DIR` unless given) whose guard asks (or ends as
    `exit_behavior` says); `run` starts or resumes thread `t`."""

    def __init__(
        self,
        *calls: ToolCallSpec,
        checkpointer: Any = None,
        answer: str | None = None,
        exit_behavior: ExitBehavior = "ask",
    ) -> None:
        self.runs = ToolRuns()
        self.model = ScriptedChatModel(script=stubborn(*(calls or (LIST_DIR,)), answer=answer))
        self.middleware = LoopGuardMiddleware(exit_behavior=exit_behavior)
        self.agent = create_agent(
            self.model,
            make_tools(self.runs),
            middleware=[self.middleware],
            checkpointer=checkpointer or InMemorySaver(),
        )
        self.config: Any = {"configurable": {"thread_id": "t"}}

    def run(self, payload: Any, mode: str = "invoke") -> dict[str, Any]:
        if mode == "ainvoke":
            return dict(asyncio.run(self.agent.ainvoke(payload, self.config)))
        return dict(self.agent.invoke(payload, self.config))

    def resume(self, answer: Any, mode: str = "invoke") -> dict[str, Any]:
        return self.run(Command(resume=answer), mode)

    @property
    def ran(self) -> int:
        return self.runs.counts["list_dir"]

    def messages(self) -> list[BaseMessage]:
        return list(self.agent.get_state(self.config).values["messages"])


def question(result: dict[str, Any]) -> dict[str, Any]:
    (pending,) = result["__interrupt__"]
    return dict(pending.value)


MODES = ["invoke", pytest.param("ainvoke", marks=needs_async_context)]


@pytest.mark.parametrize("mode", MODES)
def test_the_run_pauses_with_a_human_in_the_loop_request(mode: str) -> None:
    """Where the guard would stop (4 runs, 3 blocks), the run pauses in the tool node
    with the request `HumanInTheLoopMiddleware` makes, so its UIs show it."""
    agent = Asking()
    paused = agent.run(ask(), mode)
    asked = question(paused)
    TypeAdapter(HITLRequest).validate_python(asked)  # the shape the UIs read
    (action,) = asked["action_requests"]
    assert (action["name"], action["args"]) == LIST_DIR
    assert "4 times in a row" in action["description"]
    assert "README.md" in action["description"]  # the result it keeps getting
    assert asked["review_configs"] == [
        {"action_name": "list_dir", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    facts = asked["loop_guard"]
    assert (facts["reason"], facts["streak"], facts["blocks"]) == ("abort_threshold", 4, 3)
    assert (agent.model.calls, agent.ran) == (7, 4)
    # The reply that stopped the request is in the thread, its call not yet answered.
    last = agent.messages()[-1]
    assert isinstance(last, AIMessage)
    assert last.tool_calls


@pytest.mark.parametrize("mode", MODES)
def test_approve_runs_the_call_once_more_and_asks_again_after_a_growing_gap(mode: str) -> None:
    """Each approval runs the refused call; the guard asks again after 3, then 6, then 12
    more refusals: a person who keeps approving is asked less and less often."""
    agent = Asking()
    agent.run(ask(), mode)
    calls = [agent.model.calls]
    for answer in (APPROVE, "allow", APPROVE):
        paused = agent.resume(answer, mode)
        assert "__interrupt__" in paused
        calls.append(agent.model.calls)
    assert agent.ran == 4 + 3  # each approval ran the call once
    assert [later - earlier for earlier, later in itertools.pairwise(calls)] == [3, 6, 12]
    assert_valid_history(agent.messages()[:-1])  # the last reply awaits its answer


@pytest.mark.parametrize("mode", MODES)
def test_edit_keeps_going_with_the_limits_raised(mode: str) -> None:
    """The call runs, and the loop gets the guard's whole ladder again: steered at its
    3rd identical step (the call just allowed is its 1st), blocked from its 5th."""
    agent = Asking()
    agent.run(ask(), mode)
    with capture_events(agent.middleware.guard) as events:
        paused = agent.resume(EDIT, mode)
    assert "__interrupt__" in paused
    assert agent.ran == 4 + 4
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]


@pytest.mark.parametrize("mode", MODES)
def test_reject_stops_the_request_without_calling_the_model(mode: str) -> None:
    agent = Asking()
    agent.run(ask(), mode)
    done = agent.resume(REJECT, mode)
    assert "__interrupt__" not in done
    messages = done["messages"]
    assert_valid_history(messages)
    last = messages[-1]
    assert isinstance(last, AIMessage)
    assert last.name == GUARD_NAME
    assert "Stopped by loop_guard" in last.text
    assert (agent.model.calls, agent.ran) == (7, 4)  # the model was not called again
    refused = [m for m in messages if is_marked(m, BLOCK_MARK)]
    assert len(refused) == 3  # the three blocks, the last answered after the question
    assert "Stopped by loop_guard" in refused[-1].text


def test_answer_ends_with_the_models_own_answer() -> None:
    agent = Asking(answer="I could not list it; here is what I know.")
    agent.run(ask())
    done = agent.resume("answer")
    last = done["messages"][-1]
    assert last.text == "I could not list it; here is what I know."
    assert last.response_metadata["loop_guard"] == FINAL_ANSWER_MARK
    assert agent.model.calls == 8  # the one call for the answer, with no tools
    assert_valid_history(done["messages"])


def test_an_answer_that_is_no_choice_stops_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Asking()
    agent.run(ask())
    with (
        caplog.at_level(logging.WARNING, logger="loop_guard"),
        pytest.warns(UserWarning, match="is none of the accepted ones") as said,
    ):
        done = agent.resume({"decisions": [{"type": "maybe"}]})
    assert done["messages"][-1].name == GUARD_NAME
    assert "is none of the accepted ones" in caplog.text
    assert '"allow", "raise", "stop" or "answer"' in str(said[0].message)


def test_without_a_checkpointer_it_says_so_at_the_start() -> None:
    model = ScriptedChatModel(script=stubborn(LIST_DIR))
    agent = create_agent(model, make_tools(ToolRuns()), middleware=[
        LoopGuardMiddleware(exit_behavior="ask")])  # fmt: skip
    with pytest.raises(ValueError, match="needs a checkpointer"):
        agent.invoke(ask())
    assert model.calls == 0


@pytest.mark.internals(reason="what the guard keeps in memory for a paused thread")
def test_a_paused_thread_holds_nothing_in_memory_and_resumes_elsewhere(tmp_path: Path) -> None:
    """Paused in one process, resumed by another (a new agent on the same database): the
    guard of the first holds nothing for the thread; the second goes on exactly."""
    with SqliteSaver.from_conn_string(str(tmp_path / "t.db")) as saver:
        first = Asking(checkpointer=saver)
        first.run(ask())
        guard = first.middleware.guard
        assert not guard._conversations.states
        assert not guard._events._published
        second = Asking(checkpointer=saver)
        paused = second.resume(APPROVE)
        assert "__interrupt__" in paused
        assert (second.ran, second.model.calls) == (1, 3)  # the call, then 3 refused replies
        done = second.resume(REJECT)
        assert done["messages"][-1].name == GUARD_NAME
        assert_valid_history(done["messages"])


def test_what_the_loop_cost_counts_a_call_a_person_let_run() -> None:
    """The refused call that ran after all is no longer a tool run saved."""
    agent = Asking()
    agent.run(ask())
    before = agent.middleware.guard.stats.cost
    assert before == LoopCost(model_calls=6, tool_runs=3, tool_runs_saved=3)
    agent.resume(APPROVE)
    after = agent.middleware.guard.stats.cost
    # The allowed run (saved no more, spent now, its reply charged once), then 3 refused
    # replies.
    assert after == LoopCost(model_calls=6 + 3, tool_runs=3 + 1, tool_runs_saved=3 - 1 + 3)


def test_a_stop_answered_by_the_tool_node_keeps_every_call_answered() -> None:
    """Parallel calls in the stopping reply: the one asked about and its siblings are each
    answered once, whatever the person decides."""
    runs = ToolRuns()
    model = ScriptedChatModel(script=stubborn(LIST_DIR, ("read_file", {"path": "a.txt"})))
    agent = create_agent(model, make_tools(runs), middleware=[
        LoopGuardMiddleware(exit_behavior="ask")], checkpointer=InMemorySaver())  # fmt: skip
    config: Any = {"configurable": {"thread_id": "t"}}
    paused = agent.invoke(ask(), config)
    # Each call of the pair is a loop of its own, blocked from its 5th run: the 3rd block,
    # the stop, is the listing's in the 6th reply.
    assert question(paused)["action_requests"][0]["name"] == "list_dir"  # the last refused
    done = agent.invoke(Command(resume=REJECT), config)
    assert_valid_history(done["messages"])
    answers = [m for m in done["messages"] if isinstance(m, ToolMessage)]
    assert len(answers) == 2 * 6


def test_a_new_request_after_an_unanswered_question_keeps_the_history_valid() -> None:
    """The person writes again instead of answering: the stopping reply's calls are
    answered "not run" before the new message, and the new request starts clean."""
    runs = ToolRuns()

    def script(messages: Any, index: int) -> AIMessage:
        users = [m for m in messages if m.type == "human" and m.name != GUARD_NAME]
        return AIMessage("Here is something else.") if len(users) > 1 else looping(messages, index)

    looping = stubborn(LIST_DIR)
    model = ScriptedChatModel(script=script)
    agent = create_agent(model, make_tools(runs), middleware=[
        LoopGuardMiddleware(exit_behavior="ask")], checkpointer=InMemorySaver())  # fmt: skip
    config: Any = {"configurable": {"thread_id": "t"}}
    assert "__interrupt__" in agent.invoke(ask(), config)
    done = agent.invoke(ask("Something else, then"), config)
    messages = done["messages"]
    assert_valid_history(messages)
    assert messages[-2].text == "Something else, then"
    assert messages[-1].text == "Here is something else."
    assert not agent.get_state(config).values["loop_guard"].get("stopped")


@pytest.mark.parametrize("answer", [APPROVE, EDIT])
def test_with_use_terminate_the_allowed_call_counts(answer: Any) -> None:
    """A request stopped by `use_terminate` (every call of a reply refused): the call a
    person lets run is recorded like any, and charged once."""
    runs = ToolRuns()
    middleware = LoopGuardMiddleware(exit_behavior="ask", use_terminate=True)
    model = ScriptedChatModel(script=stubborn(LIST_DIR))
    agent = create_agent(model, make_tools(runs), middleware=[middleware],
                         checkpointer=InMemorySaver())  # fmt: skip
    config: Any = {"configurable": {"thread_id": "t"}}
    assert "__interrupt__" in agent.invoke(ask(), config)
    assert "__interrupt__" in agent.invoke(Command(resume=answer), config)
    cost = middleware.guard.stats.cost
    assert cost.tool_runs == runs.counts["list_dir"] - 1  # all but the first run, a fair one
    assert cost.model_calls == model.calls - 1
