"""Loop guard graph node for hand-built LangGraph `StateGraph`s."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any, cast

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.errors import GraphBubbleUp
from langgraph.graph import END
from langgraph.types import Command
from typing_extensions import assert_never

from loop_guard import _messages
from loop_guard._conversation import conversation_for, follow_history, session_for
from loop_guard._exits import FinalAnswer
from loop_guard._faces import attach_sinks, checked_guard, final_answer_failed, reply_step
from loop_guard._guard import LoopGuard
from loop_guard._langchain import (
    BLOCK_MARK,
    HANDOFF_KEY,
    STATE_KEY,
    block_message,
    earlier_runs,
    is_marked,
    last_batch,
    messages_of,
    stop_messages,
)
from loop_guard._values import Block, Call, Steer, Stop


class LoopGuardNode:
    """A node to place after the tools node: steers the model, or ends the request.

    It reads the last model response and its tool results from the state (records
    them, once, whoever recorded them first), then returns a `Command`: back to
    `next_node`, with the steer message (a `HumanMessage` named `loop_guard`) appended
    when a steer is due; or to `END` once the request was stopped, with a
    `ToolMessage` for every tool call still unanswered and a final `AIMessage` saying
    why, so the thread's history stays valid for the next request.

    Blocking a call before it runs is done by the tools themselves: wrap them with
    `guard_tools(tools, guard)`. Once this node exists for a guard, those tools leave
    the steer to it in every conversation it serves (unless built with
    `deliver_steer=True`).

    Args:
        guard: The `LoopGuard` holding the conversations' state.
        next_node: Where to go when the request continues (usually the model node).
            Pass `destinations=(next_node, END)` to `add_node` so that `compile()`
            checks it; otherwise a missing node raises at the first run.
        messages_key: The state key holding the messages (as `ToolNode(messages_key=...)`).
        model: A chat model with no tools bound: when given, a stopped request ends with
            its answer instead of the guard's message. It is called once, told why the
            request was stopped and asked to answer from what it already has; its reply,
            named `loop_guard`, is the request's last message, and it and the request
            for it carry `response_metadata["loop_guard"] == FINAL_ANSWER_MARK`. When
            the call fails, or the reply calls a tool or says nothing, the request ends
            with the guard's message. The node calls it synchronously (in an async
            graph LangGraph runs the node in a worker thread).

    Raises:
        ValueError: At the first run, when the graph has no node named `next_node`.

    Examples:
        ```python
        guard = LoopGuard()
        builder = StateGraph(MessagesState)
        builder.add_node("model", call_model)
        builder.add_node("tools", ToolNode(guard_tools(tools, guard)))
        builder.add_node("loop_guard", LoopGuardNode(guard), destinations=("model", END))
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", tools_condition)
        builder.add_edge("tools", "loop_guard")
        graph = builder.compile(checkpointer=InMemorySaver())
        ```

        A stopped request that ends with the model's own answer:

        ```python
        LoopGuardNode(guard, model=chat_model)  # the model without bind_tools
        ```
    """

    def __init__(
        self,
        guard: LoopGuard,
        *,
        next_node: str = "model",
        messages_key: str = "messages",
        model: Runnable[LanguageModelInput, BaseMessage] | None = None,
    ) -> None:
        """Create the node; see the class docstring."""
        guard = checked_guard(guard)
        if not isinstance(next_node, str) or not next_node:
            msg = f"next_node must be a node name, got {next_node!r}"
            raise ValueError(msg)
        if not isinstance(messages_key, str) or not messages_key:
            msg = f"messages_key must be a state key, got {messages_key!r}"
            raise ValueError(msg)
        given_model: object = model
        if given_model is not None and not isinstance(given_model, Runnable):
            msg = f"model must be a chat model (a Runnable), got {type(given_model).__name__}"
            raise ValueError(msg)
        self.model = model
        self.guard = guard
        self.next_node = next_node
        self.messages_key = messages_key
        self._next_node_found = next_node == END
        attach_sinks(guard)
        guard.attach_node()

    def __call__(self, state: Any, config: RunnableConfig) -> Command[Any]:
        """Record the last batch; continue with a steer if due, or end the request."""
        if not self._next_node_found:  # a wiring mistake is the user's: raised, not skipped
            nodes = _graph_nodes(config)
            if nodes is not None and self.next_node not in nodes:
                msg = (
                    f"LoopGuardNode(next_node={self.next_node!r}): the graph has no node "
                    f"named {self.next_node!r}; its nodes are {', '.join(sorted(nodes))}. "
                    "Pass the model node's name as next_node."
                )
                raise ValueError(msg)
            self._next_node_found = True
        try:
            return self._route(messages_of(state, self.messages_key), config)
        except GraphBubbleUp:  # an interrupt in the final answer's model call
            raise
        except Exception as error:  # a fault of the guard: the agent goes on unguarded
            self.guard.report_fault(None, error)
            return Command(goto=self.next_node)

    def _withheld(self, call: Call, verdict: Block | Stop, answer_id: str | None) -> ToolMessage:
        """The answer that replaces a result the guard blocked after the fact.

        A tool that does not exist never ran, so its block says so and lists the tools
        that do; any other call did run, and its result is withheld.
        """
        if isinstance(verdict, Stop):
            text = _messages.withheld_after_stop_text(call.tool)
        elif verdict.reason == "unknown_tool":
            text = verdict.message
        else:
            text = _messages.withheld_text(call.tool, verdict.message)
        return block_message(call.id, call.tool, text).model_copy(update={"id": answer_id})

    def _route(self, messages: Sequence[BaseMessage], config: RunnableConfig) -> Command[Any]:
        key = conversation_for(self.guard, config, messages)
        if key is None:
            return Command(goto=self.next_node)
        ai_message, answers = last_batch(messages)
        # The last response's answers are this node's to record, with their decisions:
        # the state catches up on the history up to that response only.
        end = len(messages)
        while end > 0 and not isinstance(messages[end - 1], AIMessage):
            end -= 1
        session = session_for(self.guard, key, messages, end)
        if answers and all(
            STATE_KEY in answer.response_metadata and HANDOFF_KEY not in answer.response_metadata
            for answer in answers
        ):
            # Guarded tools recorded them, and published what they led to, in the process
            # that ran them: a process taking the thread over reads them, publishing nothing.
            # (A handoff's they leave to this node, which reads what its agent said.)
            follow_history(self.guard, session, messages)
        session.serve_by_node()  # the steers of this conversation are ours
        # Verdicts already given (by wrapped tools) come back unchanged; calls no wrapper
        # saw - an unknown tool, an unwrapped tool - are judged now, after the fact: a
        # blocked one keeps its place but its result is withheld. Answers no wrapper
        # recorded are recorded here.
        step = reply_step(
            self.guard,
            session,
            ai_message,
            answers,
            settle=ai_message is not None and bool(ai_message.tool_calls),
            tools=self.guard.tool_names,
            history=messages,
            earlier=earlier_runs(messages, self.guard.config.normalizers),
        )
        corrections: list[AnyMessage] = [
            self._withheld(outcome.call, outcome.verdict, outcome.answer.id)
            for outcome in step.calls
            if isinstance(outcome.verdict, Block | Stop)
            and outcome.answer is not None
            and not is_marked(outcome.answer, BLOCK_MARK)  # same id: the reducer replaces it
        ]
        match step.after:
            case Stop() as stop:
                answered = [outcome.answer is not None for outcome in step.calls]
                ending = [*corrections, *stop_messages(ai_message, answered, stop)]
                if self.model is not None:
                    ending = self._answered(self.model, messages, ending, stop, config)
                return Command(goto=END, update={self.messages_key: ending})
            case Steer() as steer:
                corrections.append(HumanMessage(content=steer.message, name=_messages.GUARD_NAME))
            case None:
                pass
            case unknown:
                assert_never(unknown)
        if not corrections:
            return Command(goto=self.next_node)
        return Command(goto=self.next_node, update={self.messages_key: corrections})

    @staticmethod
    def _answered(
        model: Runnable[LanguageModelInput, BaseMessage],
        messages: Sequence[BaseMessage],
        ending: list[AnyMessage],
        stop: Stop,
        config: RunnableConfig,
    ) -> list[AnyMessage]:
        """The stop's messages with `model`'s final answer in place of the guard's
        message, when it gives one (see `LoopGuardNode`'s `model`). The model sees the
        history with the withheld results in place, then the unanswered calls' answers."""
        final_answer = FinalAnswer.of(stop, ending)
        try:
            reply = model.invoke(final_answer.prompt(messages), config)
        except GraphBubbleUp:
            raise
        except Exception as error:  # the model's fault, not the user's: end as without it
            final_answer_failed(error)
            return ending
        answered = final_answer.ended_with(reply)
        return ending if answered is None else cast("list[AnyMessage]", list(answered))


_BRANCH = "branch:to:"


def _graph_nodes(config: RunnableConfig) -> Collection[str] | None:
    """The nodes of the graph this node runs in, as far as LangGraph shows them.

    LangGraph checks a `Command`'s destination only by logging "unknown channel" and
    ending the graph, so the node looks itself: each node of a graph has a trigger
    channel named `branch:to:<node>`, among the channels its task reads from. `None`
    when LangGraph does not show them this way.
    """
    read = (config.get("configurable") or {}).get("__pregel_read")
    channels = read.args[1] if isinstance(read, functools.partial) and len(read.args) > 1 else None
    if not isinstance(channels, Collection) or isinstance(channels, str):
        return None
    nodes = {name[len(_BRANCH) :] for name in channels if str(name).startswith(_BRANCH)}
    return nodes or None
