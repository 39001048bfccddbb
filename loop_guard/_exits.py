"""How a request the guard stopped ends (`ExitBehavior`): the one place that tells the
behaviours apart, a function per point where one acts, and the final answer that
`exit_behavior="answer"` and `LoopGuardNode(model=...)` end a request with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, final

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.config import get_config

from loop_guard._langchain import answer_request, final_answer
from loop_guard._values import LoopGuardStop, Stop

ExitBehavior = Literal["end", "answer", "error", "ask"]
"""How the request ends when the guard stops it.

- `'end'`: End the run cleanly (default): every pending tool call gets a `ToolMessage`
    and a final `AIMessage` (`name="loop_guard"`) tells the user why.
- `'answer'`: End it with the model's own answer: the pending calls are answered as
    with `'end'`, then the model is called once more with no tools, told why the
    request was stopped and asked to answer from what it already has. Its reply ends
    the run, named `loop_guard`; it and the request for it are marked
    `response_metadata["loop_guard"] == FINAL_ANSWER_MARK`. When that call fails, or
    the reply calls a tool or says nothing, the run ends as with `'end'`.
- `'error'`: Raise `LoopGuardStop` from the agent's `invoke`/`stream`.
- `'ask'`: Ask a person instead: the run pauses with LangGraph's `interrupt()` in the
    tool node, before the call that would have stopped it, with a
    `HumanInTheLoopMiddleware`-shaped request (`_langchain.ask_request`). Resume with
    `Command(resume=...)`: each decision does what `HumanInTheLoopMiddleware` does with
    it. Approve (or `"allow"`) runs the call once more; edit (or `"raise"`) runs the
    edited call and keeps going with the guard's limits raised for this request; respond
    answers the call with the person's text and keeps going likewise; reject (or
    `"stop"`) ends the request as `'end'` does, and with a message, which answers the
    call, as `'answer'` does; `"answer"` as `'answer'` does. The
    request may stop, and ask, again only after as many more blocks as
    `abort_threshold`, doubled with each answer. Needs a checkpointer.
"""
EXIT_BEHAVIORS: tuple[ExitBehavior, ...] = ("end", "answer", "error", "ask")


def checked(exit_behavior: object) -> ExitBehavior:
    """`exit_behavior` as given, checked at run time (callers may be untyped)."""
    for known in EXIT_BEHAVIORS:
        if exit_behavior == known:
            return known
    msg = f"Invalid exit_behavior: {exit_behavior!r}. Must be one of {EXIT_BEHAVIORS}"
    raise ValueError(msg)


def check_checkpointer(exit_behavior: ExitBehavior) -> None:
    """As a request starts: a person asked pauses the run, which only a checkpointer
    can resume, so `'ask'` without one is a configuration mistake, raised at once."""
    if exit_behavior == "ask" and not checkpointed():
        msg = (
            'LoopGuardMiddleware(exit_behavior="ask") needs a checkpointer: a paused '
            "run is resumed from its checkpoint. Compile the agent with one "
            "(create_agent(..., checkpointer=InMemorySaver())), or serve it with "
            "LangGraph's server, which brings its own"
        )
        raise ValueError(msg)


def asks_a_person(exit_behavior: ExitBehavior) -> bool:
    """Whether a person decides on the call that stopped the request: the model turn
    leaves the reply's calls to the tool node, which asks (`_ask`)."""
    return exit_behavior == "ask"


def ends_with_answer(exit_behavior: ExitBehavior) -> bool:
    """Whether the model turn that stops the request asks the model for its final
    answer (`FinalAnswer`) after the stop's messages."""
    return exit_behavior == "answer"


def raises(exit_behavior: ExitBehavior) -> bool:
    """Whether a stopped run raises `LoopGuardStop` (`'error'`); a subagent's guard ends
    its run cleanly instead, and its caller goes on (`loop_guard.deepagents`)."""
    return exit_behavior == "error"


def raise_after_run(exit_behavior: ExitBehavior, stop: Stop | None) -> None:
    """Once the run has ended (its history complete, the thread valid): with `'error'`,
    the stop raised as `LoopGuardStop`."""
    if raises(exit_behavior) and stop is not None:
        raise LoopGuardStop(stop)


@final
@dataclass(frozen=True, slots=True)
class FinalAnswer:
    """A stopped request that is to end with the model's own answer: the question the
    model is asked (`answer_request`) and the stop's messages, the guard's message last,
    which the request ends with when the model gives no answer."""

    question: HumanMessage
    ending: tuple[BaseMessage, ...]

    @classmethod
    def of(cls, stop: Stop, ending: Sequence[BaseMessage]) -> FinalAnswer:
        """The final answer `stop` asks for, after `ending` (the stop's messages)."""
        return cls(answer_request(stop), tuple(ending))

    def prompt(self, history: Sequence[BaseMessage]) -> list[BaseMessage]:
        """What the model is sent: `history` with the stop's answers in it (an answer
        with the id of one there takes its place; the others follow), then the question."""
        *answers, _ = self.ending
        present = {message.id for message in history if message.id}
        replacing: dict[str | None, BaseMessage] = {
            message.id: message for message in answers if message.id in present
        }
        added = [message for message in answers if message.id not in present]
        return [*(replacing.get(m.id, m) for m in history), *added, self.question]

    def ended_with(self, reply: object) -> tuple[BaseMessage, ...] | None:
        """The request's end with the model's `reply` in place of the guard's message;
        `None` when the reply cannot end it (it calls a tool, says nothing)."""
        answer = final_answer(reply)
        if answer is None:
            return None
        return (*self.ending[:-1], self.question, answer)


def checkpointed() -> bool:
    """Whether the run has a checkpointer (`True` when it cannot be told: no run config
    in sight, as in async hooks before Python 3.11)."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return True
    # LangGraph's own key for the run's checkpointer (`CONFIG_KEY_CHECKPOINTER`).
    return configurable.get("__pregel_checkpointer") is not None
