"""Graphs of agents that loop between them (SPEC §9), for the tests of every face and of
threads resumed by other processes: a `langgraph-swarm` ping-pong, the same in a network
of one's own, and a supervisor with its worker. Only the chat models are scripted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from langgraph_supervisor import create_handoff_tool as create_delegation_tool
from langgraph_supervisor import create_supervisor
from langgraph_swarm import create_handoff_tool, create_swarm

from loop_guard import (
    ExitBehavior,
    GuardEvent,
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardNode,
    guard_tools,
)
from loop_guard.testing import Script, ScriptedChatModel, stubborn

TASKS = 10  # how many tasks the graphs of agents with new work to do get through


class PingPong:
    """Two agents, alice and bob, each handing the task to the other whatever they are told."""

    def __init__(
        self, checkpointer: Any = None, exit_behavior: ExitBehavior = "end", **compile_options: Any
    ) -> None:
        self.events: list[tuple[str, GuardEvent]] = []
        self.models: dict[str, ScriptedChatModel] = {}
        self.exit_behavior = exit_behavior
        self.callbacks: list[Any] = []
        agents = [self._agent("alice", "bob"), self._agent("bob", "alice")]
        swarm = create_swarm(agents, default_active_agent="alice")
        self.app = swarm.compile(checkpointer=checkpointer or InMemorySaver(), **compile_options)

    def _agent(self, name: str, other: str) -> Any:
        script = stubborn((f"transfer_to_{other}", {}), answer=f"{name} gives up.")
        model = ScriptedChatModel(script=script)
        self.models[name] = model
        guard = LoopGuardMiddleware(
            on_event=lambda event: self.events.append((name, event)),
            exit_behavior=self.exit_behavior,
        )
        handoff = create_handoff_tool(agent_name=other)
        return create_agent(model, [handoff], middleware=[guard], name=name)

    def run(self, payload: Any, sync: bool, thread: str = "t") -> list[BaseMessage]:
        return list(self.state(payload, sync, thread)["messages"])

    def state(self, payload: Any, sync: bool, thread: str = "t") -> dict[str, Any]:
        """The swarm's state after a run (`__interrupt__` when it paused for a person)."""
        config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": 100}
        config["callbacks"] = self.callbacks
        if sync:
            return dict(self.app.invoke(payload, config))
        return dict(asyncio.run(self.app.ainvoke(payload, config)))

    def kinds(self) -> list[str]:
        return [event.kind for _, event in self.events]


class HandlerPingPong(PingPong):
    """The same swarm with no middleware: one guard watches it, its agents' handoff tools
    wrapped by `guard_tools`, the callback handler in the swarm's run config. An event
    names the agent whose conversation it is about."""

    def __init__(self, checkpointer: Any = None, **compile_options: Any) -> None:
        self.guard = LoopGuard(on_event=lambda event: self.events.append((agent_of(event), event)))
        super().__init__(checkpointer, **compile_options)
        self.callbacks = [LoopGuardCallbackHandler(self.guard)]

    def _agent(self, name: str, other: str) -> Any:
        script = stubborn((f"transfer_to_{other}", {}), answer=f"{name} gives up.")
        model = ScriptedChatModel(script=script)
        self.models[name] = model
        handoffs = guard_tools([create_handoff_tool(agent_name=other)], self.guard)
        return create_agent(model, handoffs, name=name)


class Network:
    """Alice and bob as nodes of one hand-built graph, each calling its own model with
    a handoff-like tool that names the other as the next agent; the network routes to
    the agent named (`Command(goto=...)`). One guard, the tools wrapped by `guard_tools`,
    and on `face` `"node"` `LoopGuardNode` after the tools node; on `"handler"` the
    callback handler in the run config instead. Stubborn agents hand over whatever they
    are told; with `new_work`, each searches a topic of its own before handing over, for
    `TASKS` searches in all, then answers; `scripts`, alice's and bob's in their place.
    `handoff` makes the handoff tool to an agent (by default one that names the next
    agent in the state only). The graph is compiled with `checkpointer` (in
    memory by default) and `compile_options`; it runs on thread `t`."""

    def __init__(
        self,
        face: Literal["node", "handler"] = "node",
        *,
        new_work: bool = False,
        scripts: tuple[Script, Script] | None = None,
        handoff: Callable[[str], BaseTool] | None = None,
        checkpointer: Any = None,
        **compile_options: Any,
    ) -> None:
        self.events: list[GuardEvent] = []
        self.models: dict[str, ScriptedChatModel] = {}
        guard = LoopGuard(on_event=self.events.append)
        self.config: dict[str, Any] = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
        handoff = handoff or _handoff
        tools = guard_tools([handoff("alice"), handoff("bob"), search], guard)
        graph = StateGraph(NetworkState)
        for number, (name, other) in enumerate((("alice", "bob"), ("bob", "alice"))):
            script = _working(other) if new_work else stubborn((f"transfer_to_{other}", {}))
            self.models[name] = ScriptedChatModel(
                script=script if scripts is None else scripts[number]
            )
            graph.add_node(name, self._agent(name, tools), destinations=("tools", END))
        graph.add_node("tools", ToolNode(tools))
        graph.add_node("next_agent", _next_agent, destinations=("alice", "bob"))
        graph.add_edge(START, "alice")
        if face == "node":
            graph.add_node("loop_guard", LoopGuardNode(guard, next_node="next_agent"))
            graph.add_edge("tools", "loop_guard")
        else:
            self.config["callbacks"] = [LoopGuardCallbackHandler(guard)]
            graph.add_edge("tools", "next_agent")
        self.app = graph.compile(checkpointer=checkpointer or InMemorySaver(), **compile_options)

    def _agent(self, name: str, tools: Sequence[BaseTool]) -> Any:
        model = self.models[name].bind_tools(tools)

        def agent(state: NetworkState) -> Command[Any]:
            reply = model.invoke(state["messages"])
            reply.name = name
            return Command(goto="tools" if reply.tool_calls else END, update={"messages": [reply]})

        return agent

    def run(self, sync: bool) -> list[BaseMessage]:
        payload = {"messages": [HumanMessage("Plan a trip")], "active_agent": "alice"}
        if sync:
            return list(self.app.invoke(payload, self.config)["messages"])
        return list(asyncio.run(self.app.ainvoke(payload, self.config))["messages"])

    def history(self) -> list[BaseMessage]:
        """The thread's messages as checkpointed (also after a run that raised)."""
        return list(self.app.get_state(self.config).values["messages"])


class NetworkState(MessagesState):
    active_agent: str


def _handoff(agent: str) -> BaseTool:
    @tool(f"transfer_to_{agent}")
    def transfer(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand the task to another agent."""
        answer = ToolMessage(f"Transferred to {agent}.", tool_call_id=tool_call_id)
        return Command(update={"messages": [answer], "active_agent": agent})

    return transfer


@tool
def search(topic: str) -> str:
    """Search the web."""
    return f"findings on {topic}"


def _working(other: str) -> Script:
    """An agent that searches a topic no one searched yet, then hands the task to
    `other`; once `TASKS` topics are searched, it answers."""

    def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
        searched = sum(isinstance(m, ToolMessage) and m.name == "search" for m in messages)
        if isinstance(messages[-1], ToolMessage) and messages[-1].name == "search":
            call = {"name": f"transfer_to_{other}", "args": {}, "id": f"handoff-{index}"}
            return AIMessage(content="", tool_calls=[call])
        if searched >= TASKS:
            return AIMessage(content="The plan is ready.")
        call = {"name": "search", "args": {"topic": f"topic {searched + 1}"}, "id": f"s-{index}"}
        return AIMessage(content="", tool_calls=[call])

    return script


def _next_agent(state: NetworkState) -> Command[Any]:
    return Command(goto=state["active_agent"])


def agent_of(event: GuardEvent) -> str:
    """The agent an event's conversation is in: its namespace's first node."""
    return event.conversation.partition("|")[2].partition(":")[0]


class Supervisor:
    """A supervisor that delegates to one worker until it has `TASKS` reports, then
    answers; `new_tasks`: each delegation says a task of its own (else the same one);
    `new_findings`: the worker reports something new each time (else the same). The
    graph is compiled with `checkpointer` (in memory by default) and `compile_options`;
    it runs on thread `t`."""

    def __init__(
        self,
        *,
        new_tasks: bool = False,
        new_findings: bool = False,
        checkpointer: Any = None,
        **compile_options: Any,
    ) -> None:
        self.events: list[GuardEvent] = []
        self.delegations = 0
        self.new_tasks, self.new_findings = new_tasks, new_findings
        self.config: dict[str, Any] = {"configurable": {"thread_id": "t"}, "recursion_limit": 100}
        self.app = self._build().compile(
            checkpointer=checkpointer or InMemorySaver(), **compile_options
        )

    def _build(self) -> StateGraph[Any]:
        worker = create_agent(ScriptedChatModel(script=self._work), [], name="worker")
        graph = StateGraph(MessagesState)
        graph.add_node(self._supervisor(), destinations=("worker", END))
        graph.add_node("worker", worker)
        graph.add_edge(START, "supervisor")
        graph.add_edge("worker", "supervisor")
        return graph

    def _supervisor(self) -> Any:
        return create_agent(
            ScriptedChatModel(script=self._supervise),
            [create_delegation_tool(agent_name="worker")],
            middleware=[LoopGuardMiddleware(on_event=self.events.append)],
            name="supervisor",
        )

    def _watching_guard(self) -> LoopGuard:
        """A guard whose callback handler watches the graph's runs."""
        guard = LoopGuard(on_event=self.events.append)
        self.config["callbacks"] = [LoopGuardCallbackHandler(guard)]
        return guard

    def _supervise(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        reports = sum(
            isinstance(m, AIMessage) and m.name == "worker" and not m.tool_calls for m in messages
        )  # not the hand-back `create_supervisor` writes for the worker
        if reports >= TASKS:
            return AIMessage(content="Here is the summary.")
        task = f"Research topic {reports + 1}." if self.new_tasks else "Research the topic."
        call = {"name": "transfer_to_worker", "args": {}, "id": f"handoff-{index}"}
        return AIMessage(content=task, tool_calls=[call])

    def _work(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        self.delegations += 1
        if self.new_findings:
            return AIMessage(content=f"Finding number {self.delegations}.")
        return AIMessage(content="Nothing found.")

    def run(self, sync: bool) -> list[BaseMessage]:
        payload = {"messages": [HumanMessage("Summarise the research")]}
        if sync:
            return list(self.app.invoke(payload, self.config)["messages"])
        return list(asyncio.run(self.app.ainvoke(payload, self.config))["messages"])


class HandlerSupervisor(Supervisor):
    """The same `create_agent` supervisor with no middleware: its handoff tool guarded by
    `guard_tools`, the callback handler in the parent graph's run config."""

    def _supervisor(self) -> Any:
        handoffs = guard_tools(
            [create_delegation_tool(agent_name="worker")], self._watching_guard()
        )
        return create_agent(ScriptedChatModel(script=self._supervise), handoffs, name="supervisor")


class PrebuiltSupervisor(Supervisor):
    """The same supervisor built by `create_supervisor` (no middleware): its handoff tool
    guarded by `guard_tools`, the callback handler in the parent graph's run config."""

    def _build(self) -> StateGraph[Any]:
        guard = self._watching_guard()
        worker = create_agent(ScriptedChatModel(script=self._work), [], name="worker")
        handoffs = guard_tools([create_delegation_tool(agent_name="worker")], guard)
        return create_supervisor(
            [worker], model=ScriptedChatModel(script=self._supervise), tools=handoffs
        )
