"""The guard in real Deep Agents (`deepagents`): the main agent and every subagent.

Only the chat model is scripted, and one script plays every agent: a subagent's
conversation starts with the task the main agent gave it, so the script can tell who
is asking. The subagents use deepagents' own `read_file` (the default in-state
filesystem, where `/notes.md` does not exist: the same error every time).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("deepagents", reason="the `deepagents` extra is not installed")

from deepagents import create_deep_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from loop_guard import GuardEvent, LoopGuardMiddleware, LoopGuardStop
from loop_guard.deepagents import create_guarded_deep_agent
from loop_guard.marks import GUARD_NAME
from loop_guard.testing import ScriptedChatModel, asked_to_answer, tool_calls_message
from tests.support.agents import assert_valid_history, blocked, current_request, final_stop, steers

FIND = "Find out what /notes.md says."
OTHER = "Find out what /todo.md says."
READ_NOTES = ("read_file", {"file_path": "/notes.md"})
CAP = 40  # a subagent the guard does not stop gives up here, so the test ends


class Play:
    """One script for every agent of a deep agent; counts each one's model calls.

    `main` decides the supervisor's turns from the task results it has seen;
    `sub` decides a subagent's turn from its own history.
    """

    def __init__(
        self,
        main: Callable[[list[ToolMessage]], AIMessage],
        sub: Callable[[Sequence[BaseMessage]], AIMessage],
    ) -> None:
        self.main, self.sub = main, sub
        self.calls: Counter[str] = Counter()
        self.sub_histories: list[list[BaseMessage]] = []  # what each subagent call saw
        self._lock = threading.Lock()

    def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        humans = [m for m in messages if isinstance(m, HumanMessage) and m.name != GUARD_NAME]
        task = str(humans[0].content) if humans else ""
        role = "sub" if task in (FIND, OTHER) else "main"
        with self._lock:
            self.calls[role] += 1
            if role == "sub":
                self.sub_histories.append(list(messages))
        if role == "main":
            request = current_request(messages)
            return self.main([m for m in request if isinstance(m, ToolMessage)])
        return self.sub(messages)


def delegate(*tasks: str, subagent: str = "general-purpose") -> Callable[..., AIMessage]:
    """A supervisor that gives the subagent each task in turn, then reports."""

    def main(results: list[ToolMessage]) -> AIMessage:
        if len(results) < len(tasks):
            args = {"description": tasks[len(results)], "subagent_type": subagent}
            return tool_calls_message(("task", args))
        return AIMessage(f"Report: {results[-1].content}")

    return main


def stubborn_sub(messages: Sequence[BaseMessage]) -> AIMessage:
    """A subagent that reads the missing file forever (up to CAP calls per run)."""
    run = current_request(messages)
    if sum(isinstance(m, AIMessage) for m in run) >= CAP:
        return AIMessage("Gave up.")
    return tool_calls_message(READ_NOTES)


def answering_sub(messages: Sequence[BaseMessage]) -> AIMessage:
    """A subagent that answers at once, always the same."""
    return AIMessage("The notes file does not exist.")


def ask(agent: Any, sync: bool, config: dict[str, Any], payload: Any = None) -> dict[str, Any]:
    payload = payload if payload is not None else {"messages": [HumanMessage("Summarise it.")]}
    if sync:
        return dict(agent.invoke(payload, config))
    return dict(asyncio.run(agent.ainvoke(payload, config)))


def task_results(messages: Sequence[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages if isinstance(m, ToolMessage) and m.name == "task"]


def last_sub_run(play: Play) -> list[BaseMessage]:
    """The full history of the last subagent run, as its last model call saw it."""
    return play.sub_histories[-1]


SYNC = pytest.mark.parametrize("sync", [True, False], ids=["invoke", "ainvoke"])
THREAD: dict[str, Any] = {"configurable": {"thread_id": "t1"}}


def test_create_deep_agent_alone_leaves_subagents_unguarded() -> None:
    """Why the helper exists: deepagents keeps the main agent's middleware to itself.

    The general-purpose subagent loops on until the script gives up (a stubborn one
    was seen to make 2,948 model calls).
    """
    play = Play(delegate(FIND), stubborn_sub)
    agent = create_deep_agent(
        ScriptedChatModel(script=play), [], middleware=[LoopGuardMiddleware()]
    )
    messages = agent.invoke({"messages": [HumanMessage("Summarise it.")]})["messages"]
    assert play.calls["sub"] == CAP + 1
    assert task_results(messages) == ["Gave up."]


@SYNC
def test_a_stubborn_general_purpose_subagent_is_steered_blocked_and_stopped(sync: bool) -> None:
    """7 model calls in the subagent (4 reads, 1 steer, 3 blocks), then its stop is the
    task's result and the main agent reports on it, untouched."""
    events: list[GuardEvent] = []
    play = Play(delegate(FIND), stubborn_sub)
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play),
        [],
        middleware=[LoopGuardMiddleware(on_event=events.append)],
        checkpointer=InMemorySaver(),
    )
    messages = ask(agent, sync, THREAD)["messages"]
    assert play.calls == {"sub": 7, "main": 2}
    run = last_sub_run(play)  # the 7th call saw the steer and the first 2 blocks
    assert len(steers(run)) == 1
    assert len(blocked(run)) == 2
    (result,) = task_results(messages)
    assert result.startswith("Stopped by loop_guard")
    assert messages[-1].content == f"Report: {result}"
    assert final_stop(messages) is None  # the main agent was not stopped
    assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"]
    assert_valid_history(messages)


def answers_when_stopped_sub(messages: Sequence[BaseMessage]) -> AIMessage:
    """Reads the missing file until the guard stops it, then answers when asked."""
    if asked_to_answer(messages):
        return AIMessage("The notes file cannot be read.")
    return tool_calls_message(READ_NOTES)


@SYNC
def test_with_exit_behavior_answer_a_stopped_subagents_answer_is_the_task_result(
    sync: bool,
) -> None:
    """The subagent's own answer, asked for with no tools, reaches the main agent."""
    play = Play(delegate(FIND), answers_when_stopped_sub)
    guard = LoopGuardMiddleware(exit_behavior="answer")
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play), [], middleware=[guard], checkpointer=InMemorySaver()
    )
    messages = ask(agent, sync, THREAD)["messages"]
    assert play.calls == {"sub": 8, "main": 2}  # the stopped run's 7 calls and its answer
    assert task_results(messages) == ["The notes file cannot be read."]
    assert messages[-1].content == "Report: The notes file cannot be read."
    assert_valid_history(messages)


@SYNC
def test_each_subagent_run_has_its_own_streaks(sync: bool) -> None:
    """Two tasks, two stubborn runs: each is stopped after its own 7 calls."""
    play = Play(delegate(FIND, OTHER), stubborn_sub)
    agent = create_guarded_deep_agent(ScriptedChatModel(script=play), [])
    messages = ask(agent, sync, {})["messages"]
    assert play.calls == {"sub": 14, "main": 3}
    results = task_results(messages)
    assert len(results) == 2
    assert all(r.startswith("Stopped by loop_guard") for r in results)
    assert final_stop(messages) is None


def test_declared_subagents_are_guarded_and_a_guard_of_their_own_is_kept() -> None:
    """A declared subagent gets the guard; one that brings its own keeps it."""
    for own, calls in (([], 7), ([LoopGuardMiddleware(warn_threshold=2, block_threshold=3)], 5)):
        play = Play(delegate(FIND, subagent="researcher"), stubborn_sub)
        researcher = {
            "name": "researcher",
            "description": "Researches a question in the files.",
            "system_prompt": "You research.",
            "middleware": own,
        }
        agent = create_guarded_deep_agent(
            ScriptedChatModel(script=play), [], subagents=[researcher]
        )
        messages = agent.invoke({"messages": [HumanMessage("Summarise it.")]})["messages"]
        assert play.calls["sub"] == calls
        (result,) = task_results(messages)
        assert result.startswith("Stopped by loop_guard")
        assert researcher["middleware"] == own  # the caller's spec is not changed


def test_the_general_purpose_subagent_is_still_there_next_to_declared_ones() -> None:
    """Declaring subagents does not lose the general-purpose one (guarded too)."""
    play = Play(delegate(FIND), stubborn_sub)
    researcher = {"name": "researcher", "description": "Researches.", "system_prompt": "."}
    agent = create_guarded_deep_agent(ScriptedChatModel(script=play), [], subagents=[researcher])
    messages = agent.invoke({"messages": [HumanMessage("Summarise it.")]})["messages"]
    assert play.calls["sub"] == 7
    assert task_results(messages)[0].startswith("Stopped by loop_guard")


@SYNC
def test_the_main_agent_looping_on_task_is_stopped(sync: bool) -> None:
    """The same task again and again with the same answer: the main agent's own loop."""
    play = Play(lambda results: tool_calls_message(("task", {"description": FIND,
                "subagent_type": "general-purpose"})), answering_sub)  # fmt: skip
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play), [], checkpointer=InMemorySaver()
    )
    messages = ask(agent, sync, THREAD)["messages"]
    assert play.calls == {"main": 7, "sub": 4}  # the task ran 4 times
    assert len(steers(messages)) == 1
    assert len(blocked(messages)) == 3
    stop = final_stop(messages)
    assert stop is not None
    assert "`task`" in str(stop.content)
    assert_valid_history(messages)


def test_the_main_agents_stop_does_not_follow_into_the_next_subagent_run() -> None:
    """After the main agent was stopped, its next request delegates to a fresh subagent."""
    looping = [True]

    def main(results: list[ToolMessage]) -> AIMessage:
        if looping[0] or not results:
            return tool_calls_message(("task", {"description": FIND,
                                                "subagent_type": "general-purpose"}))  # fmt: skip
        return AIMessage(f"Report: {results[-1].content}")

    def sub(messages: Sequence[BaseMessage]) -> AIMessage:
        run = current_request(messages)
        if any(isinstance(m, ToolMessage) for m in run):
            return AIMessage("Read it: nothing there.")
        return tool_calls_message(READ_NOTES)

    play = Play(main, sub)
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play), [], checkpointer=InMemorySaver()
    )
    first = agent.invoke({"messages": [HumanMessage("Summarise it.")]}, THREAD)["messages"]
    assert final_stop(first) is not None
    looping[0] = False
    before = play.calls["sub"]
    second = agent.invoke({"messages": [HumanMessage("Again, please.")]}, THREAD)["messages"]
    assert play.calls["sub"] - before == 2  # one read, one answer: no steer, no block
    assert steers(last_sub_run(play)) == []
    assert second[-1].content == "Report: Read it: nothing there."
    assert_valid_history(second)


def test_exit_behavior_error_raises_in_the_main_agent_only() -> None:
    """A subagent's stop is the task's result; the main agent's own stop raises."""
    play = Play(delegate(FIND), stubborn_sub)
    guard = LoopGuardMiddleware(exit_behavior="error")
    agent = create_guarded_deep_agent(ScriptedChatModel(script=play), [], middleware=[guard])
    messages = agent.invoke({"messages": [HumanMessage("Summarise it.")]})["messages"]
    assert play.calls["sub"] == 7
    assert task_results(messages)[0].startswith("Stopped by loop_guard")

    play = Play(lambda results: tool_calls_message(("task", {"description": FIND,
                "subagent_type": "general-purpose"})), answering_sub)  # fmt: skip
    agent = create_guarded_deep_agent(ScriptedChatModel(script=play), [], middleware=[guard])
    with pytest.raises(LoopGuardStop):
        agent.invoke({"messages": [HumanMessage("Summarise it.")]})


@SYNC
def test_human_approval_in_a_guarded_subagent_never_asks_about_refused_calls(sync: bool) -> None:
    """`interrupt_on` reaches the subagent with the guard: the human approves the 4 reads
    that run, never the 3 the guard blocks (deepagents lists the guard first)."""
    play = Play(delegate(FIND), stubborn_sub)
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play),
        [],
        interrupt_on={"read_file": True},
        checkpointer=InMemorySaver(),
    )
    result = ask(agent, sync, THREAD)
    approvals = 0
    while result.get("__interrupt__"):
        approvals += 1
        assert approvals < 20
        (pending,) = result["__interrupt__"]
        assert [a["name"] for a in pending.value["action_requests"]] == ["read_file"]
        resume = Command(resume={"decisions": [{"type": "approve"}]})
        result = ask(agent, sync, THREAD, resume)
    assert approvals == 4
    assert play.calls["sub"] == 7
    assert len(blocked(last_sub_run(play))) == 2  # the 3rd came with the stop
    assert task_results(result["messages"])[0].startswith("Stopped by loop_guard")


def test_with_exit_behavior_ask_a_stopped_subagent_asks_the_person() -> None:
    """The question of a subagent's guard pauses the whole deep agent; the person's answer
    resumes the subagent where it stood: approved, its call runs once more; rejected,
    its stop is the task's result."""
    from langgraph.types import Command

    play = Play(delegate(FIND), stubborn_sub)
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=play),
        [],
        middleware=[LoopGuardMiddleware(exit_behavior="ask")],
        checkpointer=InMemorySaver(),
    )
    paused = ask(agent, True, THREAD)
    (pending,) = paused["__interrupt__"]
    assert pending.value["loop_guard"]["tool"] == READ_NOTES[0]
    assert play.calls == {"sub": 7, "main": 1}
    paused = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), THREAD)
    assert "__interrupt__" in paused
    assert play.calls["sub"] == 7 + 3  # the allowed run, then 3 refused replies
    done = agent.invoke(Command(resume={"decisions": [{"type": "reject"}]}), THREAD)
    (result,) = task_results(done["messages"])
    assert result.startswith("Stopped by loop_guard")
    assert done["messages"][-1].content == f"Report: {result}"
    assert_valid_history(done["messages"])


@SYNC
def test_parallel_subagents_with_the_same_instructions_on_different_inputs_run_to_the_end(
    sync: bool,
) -> None:
    """Two rounds of six `task` calls in parallel, the same instructions on six different
    files each: every subagent reads its file (the same missing-file error, its own
    conversation) and answers; every task runs, the main agent reports, no event."""
    files = [f"/notes-{number}.md" for number in range(12)]
    rounds = [files[:6], files[6:]]

    def main(results: list[ToolMessage]) -> AIMessage:
        done = len(results) // 6
        if done < len(rounds):
            calls = [
                ("task", {"description": f"Summarise {name}.", "subagent_type": "general-purpose"})
                for name in rounds[done]
            ]
            return tool_calls_message(*calls)
        return AIMessage("Report: all files summarised.")

    def sub(messages: Sequence[BaseMessage]) -> AIMessage:
        name = str(messages[0].content).removeprefix("Summarise ").removesuffix(".")
        if not any(isinstance(m, ToolMessage) for m in messages):
            return tool_calls_message(("read_file", {"file_path": name}))
        return AIMessage(f"{name} does not exist.")

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        humans = [m for m in messages if isinstance(m, HumanMessage) and m.name != GUARD_NAME]
        if str(humans[0].content).startswith("Summarise /"):
            return sub(humans[:1] + list(messages[messages.index(humans[0]) + 1 :]))
        return main([m for m in current_request(messages) if isinstance(m, ToolMessage)])

    events: list[GuardEvent] = []
    agent = create_guarded_deep_agent(
        ScriptedChatModel(script=script), middleware=[LoopGuardMiddleware(on_event=events.append)]
    )
    result = ask(agent, sync, {"recursion_limit": 100})
    messages = result["messages"]
    assert messages[-1].text == "Report: all files summarised."
    assert sorted(task_results(messages)) == sorted(f"{name} does not exist." for name in files)
    assert events == []
    assert_valid_history(messages)
