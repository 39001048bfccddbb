"""A person decides on the call that stopped a request (`exit_behavior="ask"`): the
question, asked in the tool node with LangGraph's `interrupt()`, and what each answer does,
as `HumanInTheLoopMiddleware` does it."""

from __future__ import annotations

import json
import logging
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, final

from langchain_core.messages import BaseMessage, RemoveMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from loop_guard import _messages
from loop_guard._agent_state import LoopGuardState, call_of, session_of, with_snapshot
from loop_guard._exits import ExitBehavior, asks_a_person
from loop_guard._guard import LoopGuard, Session
from loop_guard._langchain import (
    PersonDecision,
    answers_to,
    ask_request,
    block_message,
    calls_of,
    decision_of,
    last_batch,
    messages_of,
    repeated_result,
    stop_messages,
)
from loop_guard._values import Call, Stop

logger = logging.getLogger("loop_guard")

_END = "loop_guard_end"  # marks a rejected call's answer: the request ends with the model's


@final
@dataclass(frozen=True, slots=True)
class Asked:
    """The call a person is to decide on, in its session (`asked_about`)."""

    session: Session
    call: Call

    def decide(self, request: ToolCallRequest) -> ToolCallRequest | ToolMessage | Command[Any]:
        """Ask about the call; what the person decided, as the tool node's answer (the
        stop's, or in the tool's place with the snapshot of the request going on) or as
        the request to run (`ran` tells its output)."""
        decided = self._decided(request)
        if not isinstance(decided, ToolMessage) or self.session.stop is not None:
            return decided  # to run; or the stop's answer, the next turn ends the request
        return with_snapshot(decided, self.session)

    def _decided(self, request: ToolCallRequest) -> ToolCallRequest | ToolMessage:
        """Ask about the call and do what the person decided: the request to run (the
        call, or the call they edited: the session then lets the request go on), else
        the call's answer (their answer in the tool's place, or the stop: a rejection's
        reason goes to the model, which answers from what it has).

        The run pauses here, in the tool node, where the reply that stopped it is already
        checkpointed: resuming runs this node again, and nothing before the question
        but the block messages of the reply's other calls, which run nothing.
        """
        session, call = self.session, self.call
        stop = session.stop
        if stop is None:
            return request
        question = ask_request(stop, call, repeated_result(messages_of(request.state), call.tool))
        session.end_request()  # a paused thread holds nothing in memory
        answer = interrupt(question)
        decision = decision_of(answer)
        if decision is None:
            # Said where a developer sees it with no logging set up: a typo must not look
            # like a person's decision to stop.
            text = (
                f"loop guard: the answer {answer!r} is none of the accepted ones, so the "
                "request stops. Accepted: a HumanInTheLoopMiddleware response "
                '({"decisions": [{"type": "approve" | "edit" | "respond" | "reject"}]}), '
                'one such decision, or "allow", "raise", "stop" or "answer"'
            )
            warnings.warn(text, UserWarning, stacklevel=3)
            logger.warning(text)
            decision = PersonDecision("stop")
        if decision.choice in ("allow", "raise"):
            session.resume(call, afresh=decision.choice == "raise")
            session.publish()
            if decision.responded and decision.message is not None:
                return ToolMessage(decision.message, tool_call_id=call.id, name=call.tool)
            return request if decision.edited is None else _edit(request, *decision.edited)
        text = stop.message
        if decision.message is not None:
            text = _messages.rejected_text(call.tool, decision.message)
        stopped = block_message(call.id, call.tool, text)
        if decision.choice == "answer" or decision.message is not None:
            stopped.response_metadata[_END] = "answer"
        return stopped

    def ran(
        self, output: ToolMessage | Command[Any], asked: ToolCallRequest, ran: ToolCallRequest
    ) -> Command[Any]:
        """The output of the call the person let run, told as the edited call's when they
        edited it, with the snapshot of the request going on."""
        if ran is not asked and isinstance(output, ToolMessage):
            tool_call = ran.tool_call
            notice = _messages.edited_text(tool_call["name"], json.dumps(tool_call["args"]))
            content: Any = output.content
            content = f"{notice}\n\n{content}" if isinstance(content, str) else [notice, *content]
            output = output.model_copy(update={"content": content})
        return with_snapshot(output, self.session)


def asked_about(
    guard: LoopGuard, exit_behavior: ExitBehavior, request: ToolCallRequest
) -> Asked | None:
    """The call and its session when a person is to decide on this tool call: the guard
    asks (`exit_behavior="ask"`), and the call is the one that stopped the request."""
    if not asks_a_person(exit_behavior):
        return None
    try:
        session = session_of(guard, request.state, request.runtime)
        if session.stop is None:
            return None  # the common case: the request goes on
        call = call_of(request)
        return None if call is None or session.asked_about != call.key else Asked(session, call)
    except Exception as error:  # a fault of the guard: the call is judged as usual
        guard.report_fault(None, error)
        return None


def wants_answer(answers: Sequence[BaseMessage]) -> bool:
    """Whether the person asked wants the stopped request to end with the model's own
    answer (they asked for it, or gave a reason for rejecting the call)."""
    return any(answer.response_metadata.get(_END) == "answer" for answer in answers)


def left_unanswered(
    exit_behavior: ExitBehavior, state: LoopGuardState[Any], stop: Stop | None
) -> list[BaseMessage] | None:
    """When a new request follows a question never answered (the person wrote again
    instead), the stopping reply's calls answered "not run" before the new message, so
    that the history stays valid: the messages that do it, else `None`."""
    if not asks_a_person(exit_behavior):
        return None
    messages = messages_of(state)
    newest = messages[-1] if messages else None
    if stop is None or newest is None or newest.id is None:
        return None
    reply, answers = last_batch(messages[:-1])
    if reply is None or not reply.tool_calls:
        return None
    answered = [answer is not None for answer in answers_to(calls_of(reply), answers)]
    if all(answered):
        return None
    pending = stop_messages(reply, answered, stop)[:-1]  # without the stop's own message
    # Removed, then added again after the answers under a new id: the reducer would put a
    # message added under its own id back in its place.
    moved = newest.model_copy(update={"id": uuid.uuid4().hex})
    return [RemoveMessage(id=newest.id), *pending, moved]


def _edit(
    request: ToolCallRequest, tool: str, args: dict[str, Any]
) -> ToolCallRequest | ToolMessage:
    """The request of the call a person edited: its arguments, and its tool when they named
    another one the agent has (as `HumanInTheLoopMiddleware` applies an edit); an error
    answer when they named a tool it does not have."""
    if (tool, args) == (request.tool_call["name"], request.tool_call["args"]):
        return request  # approved as it was
    tool_call: ToolCall = {**request.tool_call, "name": tool, "args": args}
    if tool == request.tool_call["name"]:
        return request.override(tool_call=tool_call)
    available = getattr(request.runtime, "tools", None) or ()
    named = next((t for t in available if isinstance(t, BaseTool) and t.name == tool), None)
    if named is None:
        text = _messages.edited_missing_text(tool)
        return ToolMessage(text, tool_call_id=tool_call["id"] or "", name=tool, status="error")
    return request.override(tool_call=tool_call, tool=named)
