"""Two agents that talk while they hand a task back and forth (SPEC §9, what agents say is
the work): each writes its words beside the handoff in one message, as models do. A
guessing game and review rounds bring new words every lap and must run to their answer;
the same words bounced back and forth are a loop. Built on every face that sees the
shared history: a real `langgraph-swarm` with `LoopGuardMiddleware` on each agent, the
same swarm watched by the callback handler with `guard_tools` on its handoffs, and a
network of one's own with `LoopGuardNode`. Only the chat models are scripted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from langgraph_swarm import create_handoff_tool, create_swarm

from loop_guard import (
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    guard_tools,
)
from loop_guard.testing import Script, ScriptedChatModel
from tests.support.agents import Face
from tests.support.between import Network

Lines = Callable[[int], str | None]
"""What an agent says on its `turn`-th handoff (0 first); `None`: it answers instead."""

GUESSES = ("Is it 50?", "Is it 25?", "Is it 43?", "Is it 31?", "Is it 40?", "Is it 35?")
VERDICTS = ("Too high.", "Too low.", "Too high.", "Too low.", "Too high.", "Too low.")
NUMBER = "The number is 37."
ROUNDS = 8
DONE = f"Draft {ROUNDS + 1} is final."


def guessing() -> tuple[Lines, Lines]:
    """Alice guesses, bob says too high or too low (the same two phrases again and again,
    the guesses new every time); after 6 guesses alice names the number."""
    return (
        lambda turn: GUESSES[turn] if turn < len(GUESSES) else None,
        lambda turn: VERDICTS[turn % len(VERDICTS)],
    )


def review() -> tuple[Lines, Lines]:
    """A writer hands each new draft to a reviewer, who hands back comments on it, for
    `ROUNDS` rounds; then the writer says the draft is final."""
    return (
        lambda turn: (
            f"Draft {turn + 1}: section {turn + 1} rewritten with the new figures."
            if turn < ROUNDS
            else None
        ),
        lambda turn: f"Comments on draft {turn + 1}: tighten paragraph {turn % 5 + 2}.",
    )


def bounce() -> tuple[Lines, Lines]:
    """The same words handed back and forth, whatever happens."""
    return (
        lambda _: "Bob, can you handle the login bug?",
        lambda _: "This is Alice's area, handing it back.",
    )


def speakers(lines: tuple[Lines, Lines], answer: str) -> tuple[Script, Script]:
    """The scripts of alice and bob saying `lines`, handing over to each other."""
    return _speaker("alice", "bob", lines[0], answer), _speaker("bob", "alice", lines[1], answer)


def _speaker(name: str, other: str, lines: Lines, last: str) -> Script:
    """A script: the agent's next line beside a handoff to `other`, or `last` as its
    answer once it has nothing more to hand over."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        turn = sum(isinstance(m, AIMessage) and m.name == name and bool(m.tool_calls)
                   for m in messages)  # fmt: skip
        line = lines(turn)
        if line is None:
            return AIMessage(content=last)
        call = {"name": f"transfer_to_{other}", "args": {}, "id": f"{name}-{index}"}
        return AIMessage(content=line, tool_calls=[call])

    return script


class Chat:
    """Alice and bob taking turns, each writing its words beside its handoff, on one face.

    `face`: `"middleware"` (a swarm, `LoopGuardMiddleware` on each agent), `"handler"`
    (the swarm with no middleware, its handoffs guarded by `guard_tools`, the handler in
    the run config), `"node"` (a network of one's own: the agents are the graph's nodes,
    their handoff tools guarded by `guard_tools`, `LoopGuardNode` after the tools node).
    The graph is compiled with `checkpointer` (in memory by default) and
    `compile_options`; runs go to thread `t`.
    """

    def __init__(
        self,
        face: Face,
        lines: tuple[Lines, Lines],
        *,
        answer: str = NUMBER,
        checkpointer: Any = None,
        **compile_options: Any,
    ) -> None:
        self.face = face
        self.events: list[GuardEvent] = []
        alice, bob = speakers(lines, answer)
        self.models = {
            "alice": ScriptedChatModel(script=alice),
            "bob": ScriptedChatModel(script=bob),
        }
        self.config: dict[str, Any] = {"configurable": {"thread_id": "t"}, "recursion_limit": 120}
        saver = checkpointer or InMemorySaver()
        if face == "node":
            network = Network(
                scripts=(alice, bob), handoff=handoff_to, checkpointer=saver, **compile_options
            )
            self.app, self.events, self.models = network.app, network.events, network.models
        else:
            self.app = self._swarm().compile(checkpointer=saver, **compile_options)

    def _swarm(self) -> Any:
        guard = LoopGuard(on_event=self.events.append)
        if self.face == "handler":
            self.config["callbacks"] = [LoopGuardCallbackHandler(guard)]

        def agent(name: str, other: str) -> Any:
            handoffs = [create_handoff_tool(agent_name=other)]
            if self.face == "handler":
                return create_agent(self.models[name], guard_tools(handoffs, guard), name=name)
            middleware = LoopGuardMiddleware(on_event=self.events.append)
            return create_agent(self.models[name], handoffs, middleware=[middleware], name=name)

        return create_swarm(
            [agent("alice", "bob"), agent("bob", "alice")], default_active_agent="alice"
        )

    def run(self, payload: Any, sync: bool) -> list[BaseMessage]:
        if self.face == "node" and isinstance(payload, dict):
            payload = {**payload, "active_agent": "alice"}
        if sync:
            return list(self.app.invoke(payload, self.config)["messages"])
        return list(asyncio.run(self.app.ainvoke(payload, self.config))["messages"])

    def start(self, sync: bool) -> list[BaseMessage]:
        return self.run({"messages": [HumanMessage("Let's go", id="u1")]}, sync)

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]


def handoff_to(agent: str) -> BaseTool:
    """A handoff of one's own: it names the agent it hands over to in its metadata, as
    `langgraph-swarm`'s and `langgraph-supervisor`'s do, and the network routes by the
    state's `active_agent`."""

    @tool(f"transfer_to_{agent}")
    def transfer(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand the task to another agent."""
        answer = ToolMessage(f"Transferred to {agent}.", tool_call_id=tool_call_id)
        return Command(update={"messages": [answer], "active_agent": agent})

    transfer.metadata = {"__handoff_destination": agent}
    return transfer


def handoffs_run(messages: Sequence[BaseMessage]) -> int:
    """Handoffs that ran (answered by a transfer, not a block)."""
    return sum(isinstance(m, ToolMessage) and "ransferred to" in m.text and m.status != "error"
               for m in messages)  # fmt: skip


def steered_at(messages: Sequence[BaseMessage]) -> int | None:
    """Where the steer reached the agents: the guard's message, or a handoff's answer that
    carries it."""
    for index, message in enumerate(messages):
        if isinstance(message, HumanMessage) and message.name == "loop_guard":
            return index
        if (
            isinstance(message, ToolMessage)
            and message.status != "error"
            and "LOOP GUARD" in message.text
        ):
            return index
    return None
