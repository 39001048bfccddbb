"""Loop guard middleware for `create_agent` agents."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, cast

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
    ResponseT,
)
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_config
from langgraph.constants import TAG_NOSTREAM
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt
from langgraph.typing import ContextT
from typing_extensions import NotRequired, Unpack, override

from loop_guard import _messages
from loop_guard._config import LoopGuardConfig, LoopGuardOptions
from loop_guard._conversation import ConversationKey, thread_of
from loop_guard._engine import JUDGED_STEPS
from loop_guard._events import GuardEvent
from loop_guard._faces import (
    ashared_run,
    attach_sinks,
    final_answer_failed,
    results_of,
    shared_run,
)
from loop_guard._guard import LoopGuard, Session
from loop_guard._judge import judge_messages, verdict_of
from loop_guard._langchain import (
    PersonDecision,
    answer_request,
    answers_to,
    ask_request,
    block_message,
    call_keys,
    calls_of,
    decision_of,
    final_answer,
    keys_of,
    last_batch,
    messages_of,
    position_of,
    repeated_result,
    stop_messages,
    tokens_of,
    tool_names,
)
from loop_guard._repeated_text import Repetition
from loop_guard._reply_watch import Cutter, RepeatedTextCut, cut_reply, cutting, repetition_in
from loop_guard._state import SCHEMA_VERSION, migrate
from loop_guard._values import Block, Call, LoopGuardStop, Proceed, Steer, Stop

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.pregel import Pregel
    from langgraph.runtime import Runtime

logger = logging.getLogger("loop_guard")

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
_EXIT_BEHAVIORS: tuple[ExitBehavior, ...] = ("end", "answer", "error", "ask")


class LoopGuardState(AgentState[ResponseT]):
    """State schema for `LoopGuardMiddleware`.

    Extends `AgentState` with the guard's per-request state, a JSON-safe snapshot kept
    in the thread's checkpoint, so a thread resumed in another process continues
    exactly. It is reset at the start of every request. Its type parameter, `ResponseT`,
    is the type of the structured response (`Any` by default).
    """

    loop_guard: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


class LoopGuardMiddleware(AgentMiddleware[LoopGuardState[ResponseT], ContextT, ResponseT]):
    """Stop an agent that repeats the same tool call and gets the same result.

    When the model calls the same tool with the same arguments and gets the same
    result again and again, the guard steps in gradually: at `warn_threshold`
    identical steps the model is told to change course (a `HumanMessage` named
    `loop_guard`, once per streak); from `block_threshold` on the repeated call is
    blocked before it runs (an error `ToolMessage` with the reason); after
    `abort_threshold` blocks in one request the run ends cleanly. Different arguments,
    or a result that changes (polling), are never touched. Cycles, interleaved
    repeats, returns to a steered call, tools failing the same way whatever their
    args and calls to unknown tools are caught too, and every steer has a backstop
    (`LoopGuardConfig`); identical siblings can share one run (`dedupe_siblings`).

    Configuration:
        - Every `LoopGuardConfig` field, as a keyword argument (`LoopGuardOptions`) or a
            `LOOP_GUARD_*` environment variable (arguments win).
        - `exit_behavior`: `'end'` (default), `'answer'`, `'error'` or `'ask'`
            (`ExitBehavior`).
        - `on_event`: a callable receiving a `GuardEvent` per steer, block and stop.

    The guard's state lives in the agent state, never on this object: one instance
    serves any number of threads, and checkpointed threads resume exactly.

    Examples:
        !!! example "One line for any agent"

            ```python
            from langchain.agents import create_agent
            from loop_guard import LoopGuardMiddleware

            agent = create_agent("openai:gpt-5.5", tools, middleware=[LoopGuardMiddleware()])
            ```

        !!! example "Stricter thresholds and an event hook"

            ```python
            guard = LoopGuardMiddleware(
                warn_threshold=2, block_threshold=3, on_event=lambda e: print(e.kind, e.tool)
            )
            agent = create_agent("openai:gpt-5.5", tools, middleware=[guard])
            ```

        !!! example "A stopped request ends with the model's own answer"

            ```python
            guard = LoopGuardMiddleware(exit_behavior="answer")
            agent = create_agent("openai:gpt-5.5", tools, middleware=[guard])
            ```
    """

    state_schema = LoopGuardState  # type: ignore[assignment]

    def __init__(
        self,
        config: LoopGuardConfig | None = None,
        *,
        on_event: Callable[[GuardEvent], object] | None = None,
        exit_behavior: ExitBehavior = "end",
        judge: BaseChatModel | str | None = None,
        judge_every: int = 10,
        **options: Unpack[LoopGuardOptions],
    ) -> None:
        """Initialize the loop guard middleware.

        Args:
            config: Settings; when `None`, read from the `LOOP_GUARD_*` variables.
            on_event: Called with a `GuardEvent` for every steer, block and stop.
            exit_behavior: `'end'` to end the run cleanly with the guard's message,
                `'answer'` to end it with the model's own answer, `'error'` to raise
                `LoopGuardStop`, `'ask'` to ask a person (`ExitBehavior`).
            judge: A small chat model (or a name for `init_chat_model`, such as
                `"openai:gpt-5-mini"`) asked whether the agent still makes progress,
                for loops whose calls all differ. Off by default. It is asked at most
                once per `judge_every` counted steps of a request, and only when the
                recent steps brought back little that is new; a verdict of no
                progress steers the model, never blocks. Its calls and tokens are
                counted (`GuardStats.judgments`, `judge_tokens`, `'judge'` events).
            judge_every: Counted steps (model responses with tool calls) between two
                questions to the judge, at least.
            **options: Any setting (`LoopGuardOptions`: `warn_threshold`,
                `block_threshold`, `abort_threshold`, `ignore_tools`, `tools`, ...); one
                given wins over `config` and the environment, one not given keeps coming
                from them.

        Raises:
            ValueError: If an explicit argument is invalid.
        """
        super().__init__()
        if exit_behavior not in _EXIT_BEHAVIORS:
            msg = f"Invalid exit_behavior: {exit_behavior!r}. Must be one of {_EXIT_BEHAVIORS}"
            raise ValueError(msg)
        every: object = judge_every  # checked at run time: callers may be untyped
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            msg = f"judge_every must be an integer >= 1, got {every!r}"
            raise ValueError(msg)
        self.guard = LoopGuard(config, on_event=on_event, **options)
        if judge is not None and self.guard.engine.memory < JUDGED_STEPS:
            msg = (
                f"judge needs the last {JUDGED_STEPS} steps of a request, which the guard "
                f"keeps with detect_interleaved (repeat_window >= {JUDGED_STEPS}) or "
                f"detect_cycles (max_cycle_period >= {JUDGED_STEPS}) on"
            )
            raise ValueError(msg)
        self.judge = _judge_model(judge)
        self.judge_every = judge_every
        attach_sinks(self.guard)
        self.exit_behavior = exit_behavior
        self._tools_learned: Sequence[object] = ()

    @override
    def before_agent(
        self, state: LoopGuardState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        """Start a new request: everything resets but the recent steps.

        See How the guard decides: reset and scope, and beyond the Pi extension.
        """
        if self.exit_behavior == "ask" and not _checkpointed():
            msg = (
                'LoopGuardMiddleware(exit_behavior="ask") needs a checkpointer: a paused '
                "run is resumed from its checkpoint. Compile the agent with one "
                "(create_agent(..., checkpointer=InMemorySaver())), or serve it with "
                "LangGraph's server, which brings its own"
            )
            raise ValueError(msg)
        session = self.guard.session(_conversation(state, runtime), _snapshot_of(state))
        left = _left_unanswered(state, session.stop) if self.exit_behavior == "ask" else None
        session.start_request(uuid.uuid4().hex)
        update: dict[str, Any] = {"loop_guard": session.snapshot()}
        if left:
            update["messages"] = left
        return update

    @override
    def wrap_model_call(
        self,
        request: ModelRequest[ContextT],
        handler: Callable[[ModelRequest[ContextT]], ModelResponse[ResponseT]],
    ) -> ModelResponse[ResponseT] | ExtendedModelResponse[ResponseT]:
        """Record the last batch's results, deliver a due steer, and decide the reply.

        Everything happens inside the model call, before any `after_model` hook runs:
        no extra graph step per turn, and a call the guard blocks is already answered
        when other middleware (human approval, call limits) looks at the reply.

        - A due steer is written into the history just before the model's reply,
            where the model saw it.
        - When every call of the reply was blocked, the block messages join the history
            and the model is asked again at once, so no other middleware ever acts on
            a reply that has nothing left to run. When that call fails, the turn ends
            with the blocked reply, whose calls the tool node answers with their
            block messages: a retry or fallback around the guard never repeats a turn for a
            call the guard made.
        - A reply blocked in part keeps its blocked calls for the tool node, which
            answers them without running them (`wrap_tool_call`).
        - A stop answers the reply's calls and ends with the guard's final
            `AIMessage`: the run ends there.
        - A reply that keeps repeating its own text is cut where the repetition
            began (while it streams, the model's generation is stopped there), and the
            model is steered; a cut reply that calls no tool is asked again at once.

        What a middleware wrapping this one gets: `result` ends with the model's last
        reply, after the due steer (and the earlier replies and blocks, when the
        model was asked again); a stop follows it in the history through the
        `Command` of an `ExtendedModelResponse`.
        """
        turn = _Turn(self, request)
        if self.judge is not None and (question := turn.question()) is not None:
            turn.judged(*_ask(self.judge, question))
        while (model_request := turn.next_request()) is not None:
            try:
                with turn.watching(model_request) as cutter:
                    response = handler(model_request)
                response = turn.watched(response, cutter)
            except RepeatedTextCut as cut:
                response = turn.cut_short(cut)
            except Exception as error:
                if not turn.ended_by(error):
                    raise
                break
            turn.take(response)
        return turn.outcome()

    @override
    async def awrap_model_call(
        self,
        request: ModelRequest[ContextT],
        handler: Callable[[ModelRequest[ContextT]], Awaitable[ModelResponse[ResponseT]]],
    ) -> ModelResponse[ResponseT] | ExtendedModelResponse[ResponseT]:
        """Async twin of `wrap_model_call`."""
        turn = _Turn(self, request)
        if self.judge is not None and (question := turn.question()) is not None:
            turn.judged(*await _aask(self.judge, question))
        while (model_request := turn.next_request()) is not None:
            try:
                with turn.watching(model_request) as cutter:
                    response = await handler(model_request)
                response = turn.watched(response, cutter)
            except RepeatedTextCut as cut:
                response = turn.cut_short(cut)
            except Exception as error:
                if not turn.ended_by(error):
                    raise
                break
            turn.take(response)
        return turn.outcome()

    @override
    def after_agent(
        self, state: LoopGuardState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        """With `exit_behavior="error"`, raise `LoopGuardStop` once the run has ended.

        Raised here, after the history was completed, so the thread stays valid. The
        run's memory of published events (see `LoopGuard.session`) is released.
        """
        session = self.guard.session(_conversation(state, runtime), _snapshot_of(state))
        session.end_request()
        if self.exit_behavior == "error":
            stop = session.stop
            if stop is not None:
                raise LoopGuardStop(stop)
        return None

    @override
    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Answer a blocked call without running it; with `dedupe_siblings`, identical
        calls of one response run once. With `exit_behavior="ask"`, a person decides on
        the call that stopped the request."""
        asked = self._asked(request)
        if asked is not None:
            decided = self._ask(request, *asked)
            if isinstance(decided, ToolMessage):  # answered in the tool's place, or stopped
                return decided if asked[0].stop is not None else _with_snapshot(decided, asked[0])
            return _with_snapshot(_edited(handler(decided), request, decided), asked[0])
        answer = self._blocked_answer(request)
        if answer is not None:
            return answer
        shared = self._sharing(request)
        if shared is None:
            return handler(request)
        conversation, call, siblings = shared
        return cast(
            "ToolMessage | Command[Any]",
            shared_run(self.guard, conversation, call, siblings, lambda: handler(request)),
        )

    @override
    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Async twin of `wrap_tool_call`."""
        asked = self._asked(request)
        if asked is not None:
            decided = self._ask(request, *asked)
            if isinstance(decided, ToolMessage):  # answered in the tool's place, or stopped
                return decided if asked[0].stop is not None else _with_snapshot(decided, asked[0])
            return _with_snapshot(_edited(await handler(decided), request, decided), asked[0])
        answer = self._blocked_answer(request)
        if answer is not None:
            return answer
        shared = self._sharing(request)
        if shared is None:
            return await handler(request)
        conversation, call, siblings = shared
        return cast(
            "ToolMessage | Command[Any]",
            await ashared_run(self.guard, conversation, call, siblings, lambda: handler(request)),
        )

    @override
    async def abefore_agent(
        self, state: LoopGuardState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        """Async twin of `before_agent`."""
        return self.before_agent(state, runtime)

    @override
    async def aafter_agent(
        self, state: LoopGuardState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        """Async twin of `after_agent`."""
        return self.after_agent(state, runtime)

    def _check_response(
        self, state: LoopGuardState[ResponseT], session: Session, tools: frozenset[str]
    ) -> list[AnyMessage] | None:
        """Decide the last reply's calls; the blocks and the stop, as messages.

        A call the reply answers itself (structured output: the agent answers an invalid
        one with its own retry message) never reaches a tool. It counts like any call,
        its answer being its result, so a model stuck on it is steered and stopped; but
        it gets no second answer from the guard.
        """
        message, given = last_batch(state["messages"])
        if message is None or not message.tool_calls:
            return None
        calls = calls_of(message)
        verdicts = session.check_batch(calls, tokens_of(message))
        answers: list[AnyMessage] = []
        answered = []
        self_answered = []  # the calls the reply answered itself, with their answers
        for call, verdict, answer in zip(calls, verdicts, answers_to(calls, given), strict=True):
            if answer is not None and isinstance(verdict, Proceed):
                self_answered.append((call, answer))
            elif answer is None and isinstance(verdict, Block):
                answers.append(block_message(call.id, call.tool, verdict.message))
            answered.append(answer is not None or isinstance(verdict, Block))
        for call, result in results_of(self.guard, session, self_answered, tools):
            session.record_result(call, result)
        stop = session.stop
        if stop is not None:
            answers.extend(stop_messages(message, answered, stop))  # ends with the stop
        return answers

    def _record_results(
        self,
        state: LoopGuardState[ResponseT],
        session: Session,
        tools: frozenset[str],
        *,
        deliver: bool = True,
    ) -> list[AnyMessage] | None:
        """Record the last batch's results; a due steer as a message (also one due from
        calls the reply answered itself, recorded when it was decided), unless `deliver`
        is false (the steer stays due). `tools`: the names of the tools the model was
        offered, the tools that exist."""
        awaiting = {call.key for call in session.awaiting}
        message, answers = last_batch(state["messages"])
        if (not awaiting or message is None) and not session.steer_pending:
            return None
        answered = []
        if awaiting and message is not None:
            # Read from the AI message, not the snapshot: the snapshot keeps no args.
            calls = calls_of(message)
            for call, answer in zip(calls, answers_to(calls, answers), strict=True):
                if answer is not None and call.key in awaiting:
                    answered.append((call, answer))
        results = results_of(self.guard, session, answered, tools)
        # Settled only where the batch's response is in sight; a stop is the reply's to
        # tell (`_check_response`).
        after = session.finish(
            results, settle=bool(awaiting) and message is not None, claim=deliver
        )
        if not isinstance(after, Steer) or not deliver:
            return []
        return [HumanMessage(content=after.message, name=_messages.GUARD_NAME)]

    def _learn(self, tools: Sequence[object]) -> None:
        """Tell the guard what the offered tools say of themselves (MCP annotations),
        once per list of tools: an agent offers the same list at every model call."""
        if tools is not self._tools_learned:
            self.guard.add_tools((*tool_names(tools), *tools))  # provider dicts by name
            self._tools_learned = tools

    def _sharing(self, request: ToolCallRequest) -> tuple[str, Call, Sequence[Call]] | None:
        """The conversation, the call and its siblings when identical siblings may share."""
        if not self.guard.config.dedupe_siblings:
            return None
        try:
            placed = _placed(request)
            if placed is None:
                return None
            siblings, position = placed
            return _conversation(request.state, request.runtime), siblings[position], siblings
        except Exception as error:  # a fault of the guard: this call runs unshared
            self.guard.report_fault(None, error)
            return None

    def _asked(self, request: ToolCallRequest) -> tuple[Session, Call] | None:
        """The session and the call when a person is to decide on this call: the guard
        asks (`exit_behavior="ask"`), and the call is the one that stopped the request."""
        if self.exit_behavior != "ask":
            return None
        try:
            snapshot = request.state.get("loop_guard")
            if not snapshot or not snapshot.get("stopped"):
                return None  # the common case: the request goes on
            found = _session_and_call(self.guard, request)
            return found if found is not None and found[0].asked_about == found[1].key else None
        except Exception as error:  # a fault of the guard: the call is judged as usual
            self.guard.report_fault(None, error)
            return None

    def _ask(
        self, request: ToolCallRequest, session: Session, call: Call
    ) -> ToolCallRequest | ToolMessage:
        """Ask a person about the call that stopped the request, and do what they decided
        as `HumanInTheLoopMiddleware` does: the request to run (the call, or the call they
        edited: the session then lets the request go on), else the call's answer (their
        answer in the tool's place, or the stop: a rejection's reason goes to the model,
        which answers from what it has).

        The run pauses here, in the tool node, where the reply that stopped it is already
        checkpointed: resuming runs this node again, and nothing before the question
        but the block messages of the reply's other calls, which run nothing.
        """
        stop = session.stop
        if stop is None:
            return request
        question = ask_request(stop, call, repeated_result(messages_of(request.state), call.tool))
        session.end_request()  # a paused thread holds nothing in memory
        answer = interrupt(question)
        decision = decision_of(answer)
        if decision is None:
            logger.warning(
                "loop guard: %r answers none of the choices (allow, raise, stop, answer); "
                "the request stops",
                answer,
            )
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
        answer = block_message(call.id, call.tool, text)
        if decision.choice == "answer" or decision.message is not None:
            answer.response_metadata["loop_guard_end"] = "answer"
        return answer

    def _blocked_answer(self, request: ToolCallRequest) -> ToolMessage | None:
        """The answer of a call the guard blocked when it decided the reply, if blocked.

        A reply blocked only in part keeps its blocked calls unanswered until the tool
        node reaches them, so that middleware acting after the model (call limits,
        human approval) never answers a call a second time.
        """
        try:
            snapshot = request.state.get("loop_guard")
            current = snapshot and snapshot.get("v") == SCHEMA_VERSION
            if current and not self.guard._blocks_any(snapshot):
                return None  # the common case: nothing of the reply was blocked
            found = _session_and_call(self.guard, request)
            if found is None:
                return None
            session, call = found
            verdict = session.verdict_of(call)
            if not isinstance(verdict, Block):
                return None
            return block_message(call.id, call.tool, verdict.message)
        except Exception as error:  # a fault of the guard: this call runs unguarded
            self.guard.report_fault(None, error)
            return None


# The judge's calls are the guard's own: traced, never streamed to the agent's caller.
_JUDGE_CONFIG: RunnableConfig = {
    "tags": [TAG_NOSTREAM, "loop_guard:judge"],
    "run_name": "loop_guard_judge",
}


def _judge_model(judge: object) -> BaseChatModel | None:
    """The judge as given: a chat model, or a name `init_chat_model` knows."""
    if judge is None or isinstance(judge, BaseChatModel):
        return judge
    if isinstance(judge, str):
        return init_chat_model(judge)
    msg = f"judge must be a chat model or a model name, got {type(judge).__name__}"
    raise ValueError(msg)


def _ask(judge: BaseChatModel, question: list[BaseMessage]) -> tuple[object, str]:
    """The judge's reply, and why there is none when its call failed."""
    try:
        return judge.invoke(question, _JUDGE_CONFIG), ""
    except GraphBubbleUp:
        raise
    except Exception as error:  # a judge that fails never fails the agent
        return None, f"the judge's call failed: {type(error).__name__}: {error}"


async def _aask(judge: BaseChatModel, question: list[BaseMessage]) -> tuple[object, str]:
    """Async twin of `_ask`."""
    try:
        return await judge.ainvoke(question, _JUDGE_CONFIG), ""
    except GraphBubbleUp:
        raise
    except Exception as error:  # a judge that fails never fails the agent
        return None, f"the judge's call failed: {type(error).__name__}: {error}"


def _left_unanswered(state: LoopGuardState[Any], stop: Stop | None) -> list[BaseMessage] | None:
    """When a new request follows a question never answered (the person wrote again
    instead), the stopping reply's calls answered "not run" before the new message, so
    that the history stays valid: the messages that do it, else `None`."""
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


def _with_snapshot(output: ToolMessage | Command[Any], session: Session) -> Command[Any]:
    """A tool's output, with the guard's snapshot of a request a person let go on."""
    snapshot = session.snapshot()
    if not isinstance(output, Command):
        return Command(update={"messages": [output], "loop_guard": snapshot})
    if output.update is not None and not isinstance(output.update, Mapping):
        return output  # an update as a list of writes: the tool's own, kept as it is
    update = {**(output.update or {}), "loop_guard": snapshot}
    return Command(graph=output.graph, update=update, resume=output.resume, goto=output.goto)


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


def _edited(
    output: ToolMessage | Command[Any], asked: ToolCallRequest, ran: ToolCallRequest
) -> ToolMessage | Command[Any]:
    """A tool's output, told as the edited call's when a person edited the call."""
    if ran is asked or not isinstance(output, ToolMessage):
        return output
    notice = _messages.edited_text(ran.tool_call["name"], json.dumps(ran.tool_call["args"]))
    content: Any = output.content
    content = f"{notice}\n\n{content}" if isinstance(content, str) else [notice, *content]
    return output.model_copy(update={"content": content})


def _checkpointed() -> bool:
    """Whether the run has a checkpointer (`True` when it cannot be told: no run config
    in sight, as in async hooks before Python 3.11)."""
    try:
        configurable = get_config().get("configurable") or {}
    except RuntimeError:
        return True
    # LangGraph's own key for the run's checkpointer (`CONFIG_KEY_CHECKPOINTER`).
    return configurable.get("__pregel_checkpointer") is not None


def _session_and_call(guard: LoopGuard, request: ToolCallRequest) -> tuple[Session, Call] | None:
    """The conversation's session and the call a tool call is, in its reply."""
    session = _session_of(guard, request.state, request.runtime)
    placed = _placed(request)
    if placed is None:
        return None
    siblings, position = placed
    return session, siblings[position]


def _placed(request: ToolCallRequest) -> tuple[Sequence[Call], int] | None:
    """The calls of the reply a tool call belongs to, and its position among them."""
    message, _ = last_batch(messages_of(request.state))
    if message is None:
        return None
    tool_call = request.tool_call
    position = position_of(message, tool_call.get("id"), tool_call["name"], tool_call.get("args"))
    return None if position is None else (calls_of(message), position)


def _config_of(runtime: object) -> RunnableConfig | None:
    """The run's config: a tool's runtime holds it; a hook's runtime names its thread
    and namespace in its execution info. The context's config is the last resort (older
    LangGraph): in async code on Python 3.10 it is missing, or a caller's (an agent run
    inside an async tool would see the tool's), as tasks get no context there."""
    config = getattr(runtime, "config", None)
    if isinstance(config, Mapping):
        return cast("RunnableConfig", config)
    info = getattr(runtime, "execution_info", None)
    if info is not None:
        if info.thread_id is None:
            return None
        return {"configurable": {"thread_id": info.thread_id, "checkpoint_ns": info.checkpoint_ns}}
    try:
        return get_config()
    except RuntimeError:
        return None


def _snapshot_of(state: LoopGuardState[Any]) -> Mapping[str, Any]:
    """The guard's snapshot in `state`, in the current shape (`{}` before the first).

    An older one may name the calls of its batches by tool-call id: the history's latest
    responses give their keys now, so a request checkpointed by an earlier version goes
    on as one uninterrupted run.
    """
    snapshot = state.get("loop_guard")
    if not snapshot:
        return {}  # still the caller's state to keep, fresh
    if snapshot.get("v") == SCHEMA_VERSION:
        return snapshot  # the common case: written by this version
    return migrate(snapshot, call_keys(messages_of(state)))


def _session_of(guard: LoopGuard, state: LoopGuardState[Any], runtime: object) -> Session:
    """The guard's session on `state`'s snapshot (`_snapshot_of`).

    Versions that decided a reply in an `after_model` node, after the model node, could
    checkpoint a reply before deciding it (human approval listed after the guard, a
    pause after the model): such a reply is decided here, so that its calls count.
    """
    snapshot = state.get("loop_guard")
    session = guard.session(_conversation(state, runtime), _snapshot_of(state))
    if snapshot and snapshot.get("v") != SCHEMA_VERSION:
        reply, _ = last_batch(messages_of(state))
        if reply is not None and reply.tool_calls and not session.checked(keys_of(reply)):
            session.check_batch(calls_of(reply), tokens_of(reply))
    return session


def _conversation(state: LoopGuardState[Any], runtime: object) -> str:
    """The thread (narrowed to the agent's graph) when there is one, else this request."""
    key = thread_of(_config_of(runtime))
    if key is None:
        key = ConversationKey("request", str((state.get("loop_guard") or {}).get("request_id")))
    return str(key)


class _Turn(Generic[ResponseT]):
    """One model turn of `wrap_model_call`: the model's calls until a reply the guard lets
    through, with what the turn adds to the history. Sync and async share it.

    The guard's hooks share one session, read from the snapshot once and written back
    once, and read messages that grow with the turn. They only look at the last AI
    message and what follows it, so once the turn has added one, the added messages
    stand for the whole history (no copy of it per model call).
    """

    def __init__(
        self, middleware: LoopGuardMiddleware[ResponseT, Any], request: ModelRequest[Any]
    ) -> None:
        self.middleware = middleware
        self.request = request
        self.state = cast("LoopGuardState[ResponseT]", request.state)
        self.session = _session_of(middleware.guard, self.state, request.runtime)
        # The tools offered to the model: a call naming none of them is to a missing tool.
        self.tools = tool_names(request.tools)
        middleware._learn(request.tools)
        self.added: list[BaseMessage] = []  # what this turn adds to the history, in order
        self.replied = False  # `added` holds a reply of the model
        # What follows the last reply, applied after the result: a stop (the reply's
        # answers, the message).
        self.ending: list[BaseMessage] = []
        self.response: ModelResponse[ResponseT] | None = None
        self.changed = False  # the guard's snapshot changed
        self.again = True  # the model is to be called (again)
        # Each reply blocked in full adds a block, and enough blocks stop the request
        # (`abort_threshold`, or more once a person let it go on): the bound is a backstop.
        state = self.session.state
        stops_at = max(middleware.guard.config.abort_threshold, state.rearm)
        self.calls_left = max(stops_at - state.blocks, 0) + 2
        # Once a stop is due with `exit_behavior="answer"`: what the model is told when it
        # is asked for its final answer.
        self.asking: HumanMessage | None = None
        self.answered = False  # the model's final answer ends the turn
        # The repetition a streaming reply was cut at (`cut_short`), for `take`; the ids of
        # the replies whose stream was read to its end and found clean.
        self.cut: Repetition | None = None
        self.read: set[str] = set()
        config = middleware.guard.config
        self.text_chars = config.repeated_text_chars
        self.watches_text = config.enabled and config.detect_repeated_text

    def next_request(self) -> ModelRequest[Any] | None:
        """The model request to send now (a due steer added), or `None` when done."""
        if self.asking is not None:
            return self._final_request()
        if not self.again or self.calls_left <= 0:
            return None
        if self.response is None and self._stopped_before():
            return self._final_request() if self.asking is not None else None
        self.again, self.calls_left = False, self.calls_left - 1
        steer = self._decide(self.middleware._record_results)
        if steer is not None:
            self._add(steer)
        if not self.added:
            return self.request
        messages = [*self.request.messages, *self.added]
        return self.request.override(messages=cast("list[AnyMessage]", messages))

    def take(self, response: ModelResponse[ResponseT]) -> None:
        """Decide the model's reply.

        Blocked in full (and no stop): its block messages join the turn and the model is asked
        again. Stopped: the answers and the stop end the turn (with
        `exit_behavior="answer"`, the model is asked for its final answer first). Blocked
        in part: the tool node answers the blocked calls (`wrap_tool_call`).
        """
        if self.asking is not None:
            self._take_final(self._trimmed(response)[0])
            return
        response = self._without_repetition(response)
        self.response = response
        self._add(response.result)
        if self.session.stop is not None and self.ending:
            return  # the reply's repeated text stopped the request
        answers = self._decide(self.middleware._check_response)
        if not answers:  # nothing blocked, no stop: the common case
            return
        if self.middleware.exit_behavior == "ask" and self.session.stop is not None:
            return  # the tool node answers the calls, and asks about the stopping one
        if any(isinstance(answer, AIMessage) for answer in answers):
            self.ending = list(answers)
            stop = self.session.stop
            if self.middleware.exit_behavior == "answer" and stop is not None:
                self.asking, self.again = answer_request(stop), True
            return
        reply, _ = last_batch(response.result)
        blocked = sum(isinstance(answer, ToolMessage) for answer in answers)  # one per call
        if (
            reply is not None
            and reply.tool_calls
            and blocked == len(reply.tool_calls)
            and response.structured_response is None
            and self.calls_left > 0  # else the tool node answers them, as after a failure
        ):
            self._add(answers)
            self.again = True

    def question(self) -> list[BaseMessage] | None:
        """What the judge is to be asked before this turn's model call, if it is due
        (`Session.judge_due`): the history's recent calls and results, as data. The
        last batch's results are recorded first, its steer left for the model call."""
        middleware = self.middleware
        self._decide(partial(middleware._record_results, deliver=False))
        try:
            if not self.session.judge_due(middleware.judge_every):
                return None  # the common case
            return judge_messages(messages_of(self.state))
        except Exception as error:  # a fault of the guard: no judgment this turn
            self.middleware.guard.report_fault(self.session.conversation, error)
            return None

    def judged(self, reply: object, failure: str) -> None:
        """Record the judge's answer: its verdict, or no progress found when it gave
        none (`failure` says why); a verdict of no progress makes a steer due, delivered
        with this turn's model call."""
        verdict = verdict_of(reply) if not failure else None
        if verdict is None:
            failure = failure or "no verdict in the judge's reply"
            logger.warning("loop guard: the judge gave no verdict (%s)", failure)
        tokens = tokens_of(reply) if isinstance(reply, AIMessage) else 0
        try:
            self.session.judged(
                progress=verdict is None or verdict.progress,
                tokens=tokens,
                reason=failure if verdict is None else verdict.reason,
            )
            self.session.publish()
        except Exception as error:  # a fault of the guard: no judgment this turn
            self.middleware.guard.report_fault(self.session.conversation, error)
        self.changed = True

    def watching(self, request: ModelRequest[Any]) -> AbstractContextManager[Cutter | None]:
        """Around a model call: a streaming reply that begins repeating its own text is
        cut there (`RepeatedTextCut`, then `cut_short`). Middleware between the guard and
        the model may take the cut for a failure and answer otherwise (older langchain
        releases): the cut, kept by the `Cutter`, still wins."""
        if not self.watches_text:
            return nullcontext()
        return cutting(self.text_chars, request.messages)

    def cut_short(self, cut: RepeatedTextCut) -> ModelResponse[ResponseT]:
        """The model's reply as it was when its stream was cut."""
        self.cut = cut.repetition
        return ModelResponse(result=[cut.reply], structured_response=None)

    def watched(
        self, response: ModelResponse[ResponseT], cutter: Cutter | None
    ) -> ModelResponse[ResponseT]:
        """The model call's response, as the cutter saw its stream: cut where its reply
        began repeating itself (found at its end, or a cut that middleware between the
        guard and the model took for a failure), or known clean (not read again)."""
        if cutter is None:
            return response
        if cutter.cut is not None:
            return self.cut_short(cutter.cut)
        self.read = cutter.read
        return response

    def _trimmed(
        self, response: ModelResponse[ResponseT]
    ) -> tuple[ModelResponse[ResponseT], Repetition | None]:
        """`response` with its reply cut where it began repeating its own text, and where
        that was; as it is, and `None`, when it did not."""
        repetition, self.cut = self.cut, None
        if not self.watches_text or not response.result:
            return response, None
        reply = response.result[-1]
        if not isinstance(reply, AIMessage) or reply.name == _messages.GUARD_NAME:
            return response, None
        if repetition is None and reply.id in self.read:
            return response, None  # its stream was read to its end
        try:
            repetition = repetition or repetition_in(reply, self.text_chars)
            if repetition is None:
                return response, None  # the common case
            result = [*response.result[:-1], cut_reply(reply, repetition)]
        except Exception as error:  # a fault of the guard: the reply goes on as it is
            self.middleware.guard.report_fault(self.session.conversation, error)
            return response, None
        cut = ModelResponse(result=result, structured_response=response.structured_response)
        return cut, repetition

    def _without_repetition(self, response: ModelResponse[ResponseT]) -> ModelResponse[ResponseT]:
        """`response` with its reply cut where it began repeating its own text, if it
        did; the guard told (a steer, a block, or the stop, which ends the turn), and a
        cut reply that calls no tool asked again."""
        response, repetition = self._trimmed(response)
        if repetition is None:
            return response
        reply = cast("AIMessage", response.result[-1])
        session = self.session
        try:
            session.repeated_text(
                reply.id or uuid.uuid4().hex, repetition.repeats, tokens_of(reply)
            )
            session.publish()
        except Exception as error:  # a fault of the guard: the cut reply goes on
            self.middleware.guard.report_fault(session.conversation, error)
        self.changed = True
        stop = session.stop
        if stop is not None:
            self.ending = list(stop_messages(reply, [False] * len(reply.tool_calls), stop))
            if self.middleware.exit_behavior == "answer":
                self.asking, self.again = answer_request(stop), True
        elif not reply.tool_calls:
            self.again = self.calls_left > 0  # asked again, the steer before it
        return response

    def ended_by(self, error: Exception) -> bool:
        """Whether a failed model call ends the turn with what it has (then ended).

        The first call's failure is the caller's: a retry or fallback around the guard
        runs the turn again. Asking again after a reply blocked in full is the guard's
        own doing: raising there would make such a middleware repeat the whole turn
        (the reply, its block messages, the failing call) until it gives up, throwing the
        block messages away. The turn ends instead with the blocked reply, its calls left to
        the tool node, which answers them with their block messages without running them
        (`wrap_tool_call`): the model sees them on the next step, and the graph takes
        its usual way (no jump from the model back to the model, which agents without
        an `after_model` hook could not take before langchain 1.4). An interrupt always
        propagates.
        """
        if isinstance(error, GraphBubbleUp):
            return False
        if self.asking is not None:
            final_answer_failed(error)
            return True
        if self.response is None:
            return False
        logger.warning(
            "loop guard: asking the model again after a block failed (%s: %s); "
            "the model is asked on the next step",
            type(error).__name__,
            error,
        )
        last_reply = max(i for i, m in enumerate(self.added) if isinstance(m, AIMessage))
        del self.added[last_reply + 1 :]
        return True

    def outcome(self) -> ModelResponse[ResponseT] | ExtendedModelResponse[ResponseT]:
        """The model node's result: the turn's messages and the guard's new snapshot.

        A stop travels in the command, applied after the result: the result still ends
        with the model's last reply.
        """
        response = self.response
        update: dict[str, Any] = {"loop_guard": self.session.snapshot()}
        if response is None:  # stopped before this turn: its end is the whole result
            if not self.ending:  # never reached: the model is called, or the turn ends
                msg = "the model was not called"
                raise RuntimeError(msg)
            reply = ModelResponse(result=list(self.ending), structured_response=None)
            return ExtendedModelResponse(model_response=reply, command=Command(update=update))
        if not self.changed and self.added == response.result:
            return response
        reply = ModelResponse(result=self.added, structured_response=response.structured_response)
        if self.ending:
            update["messages"] = self.ending
        if self.answered:
            # One more model call for `ModelCallLimitMiddleware`, whose `after_model`
            # counts this turn once; its counts exist from its first count on.
            for count in ("thread_model_call_count", "run_model_call_count"):
                value = self.state.get(count)
                if isinstance(value, int):
                    update[count] = value + 1
        return ExtendedModelResponse(model_response=reply, command=Command(update=update))

    def _stopped_before(self) -> bool:
        """Whether the request stopped before this turn (a person, asked, chose to stop):
        the model is not called again, and the turn ends the request, with the model's
        own answer when the person asked for it."""
        stop = self.session.stop
        if stop is None:
            return False
        self.again = False
        self.ending = [AIMessage(content=stop.message, name=_messages.GUARD_NAME)]
        _, answers = last_batch(messages_of(self.state))
        if any(answer.response_metadata.get("loop_guard_end") == "answer" for answer in answers):
            self.asking, self.again = answer_request(stop), True
        return True

    def _final_request(self) -> ModelRequest[Any] | None:
        """The request for the model's final answer, once: the history so far with the
        stop's answers and what the model is told, no tools, plain text."""
        if not self.again or self.asking is None:
            return None
        self.again = False
        messages = [*self.request.messages, *self.added, *self.ending[:-1], self.asking]
        return self.request.override(
            messages=cast("list[AnyMessage]", messages),
            tools=[],
            tool_choice=None,
            response_format=None,
        )

    def _take_final(self, response: ModelResponse[ResponseT]) -> None:
        """End the turn with the model's final answer in place of the guard's message,
        unless the reply calls a tool or says nothing."""
        answer = final_answer(response.result[-1] if response.result else None)
        if answer is not None and self.asking is not None:
            self.ending = [*self.ending[:-1], self.asking, answer]
            self.answered = True

    def _decide(
        self,
        hook: Callable[
            [LoopGuardState[ResponseT], Session, frozenset[str]], list[AnyMessage] | None
        ],
    ) -> list[AnyMessage] | None:
        """Run one of the guard's hooks on the turn's messages and session; publish its
        decisions, once even when a middleware around this one runs the model call again
        (a retry, a fallback model)."""
        state = self.state
        if self.replied:  # the turn's messages stand for the history (see the class)
            state = cast("LoopGuardState[ResponseT]", {**state, "messages": self.added})
        try:
            messages = hook(state, self.session, self.tools)
        except Exception as error:  # a fault of the guard: the agent goes on unguarded
            self.middleware.guard.report_fault(self.session.conversation, error)
            messages = None
        self.session.publish()
        self.changed = self.changed or messages is not None
        return messages

    def _add(self, messages: Sequence[BaseMessage]) -> None:
        self.added.extend(messages)
        self.replied = self.replied or any(isinstance(message, AIMessage) for message in messages)


# The guard's nodes of earlier versions, and the node whose run stands for theirs now: a
# thread paused before one goes on from there (recording results and deciding replies
# happen in the model call now).
_REMOVED_NODES = {"before_model": "tools", "after_model": "model"}


def upgrade_thread(
    agent: Pregel[Any, Any], config: RunnableConfig, *, name: str = "LoopGuardMiddleware"
) -> str | None:
    """Move a thread an earlier version paused before one of the guard's removed nodes
    (`before_model`, `after_model`) on to the nodes that do their work now.

    Call it before resuming a thread checkpointed by such a version: LangGraph runs
    nothing for a pending node the graph no longer has, so the resume would do nothing.
    Any other thread is left as it is. `name`: the middleware's `name`.

    Returns:
        The node the thread was paused before, or `None` when it needed nothing.
    """
    found = _removed_node(agent, _checkpointer(agent).get_tuple(config), name)
    if found is None:
        return None
    agent.update_state(config, None, as_node=_REMOVED_NODES[found])
    return f"{name}.{found}"


async def aupgrade_thread(
    agent: Pregel[Any, Any], config: RunnableConfig, *, name: str = "LoopGuardMiddleware"
) -> str | None:
    """Async twin of `upgrade_thread`."""
    found = _removed_node(agent, await _checkpointer(agent).aget_tuple(config), name)
    if found is None:
        return None
    await agent.aupdate_state(config, None, as_node=_REMOVED_NODES[found])
    return f"{name}.{found}"


def _checkpointer(agent: Pregel[Any, Any]) -> BaseCheckpointSaver[Any]:
    if not isinstance(agent.checkpointer, BaseCheckpointSaver):
        msg = "upgrade_thread needs an agent compiled with a checkpointer"
        raise ValueError(msg)
    return agent.checkpointer


def _removed_node(agent: Pregel[Any, Any], saved: CheckpointTuple | None, name: str) -> str | None:
    """Which of the guard's removed nodes the thread's checkpoint waits for, if any: an
    edge to it (`branch:to:<node>`) was written, and the graph has no such node."""
    if saved is None:
        return None
    waiting = saved.checkpoint["channel_values"]
    for hook in _REMOVED_NODES:
        node = f"{name}.{hook}"
        if f"branch:to:{node}" in waiting and node not in agent.nodes:
            return hook
    return None
