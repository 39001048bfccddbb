"""Loop guard middleware for `create_agent` agents."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from langchain.agents.middleware.types import (
    AgentMiddleware,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ResponseT,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from langgraph.typing import ContextT
from typing_extensions import Unpack, override

from loop_guard import _exits
from loop_guard._agent_state import (
    LoopGuardState,
    call_of,
    conversation_of,
    placed_call,
    session_of,
)
from loop_guard._ask import asked_about, left_unanswered
from loop_guard._config import LoopGuardConfig, LoopGuardOptions
from loop_guard._conversation import take_over
from loop_guard._events import GuardEvent
from loop_guard._exits import ExitBehavior
from loop_guard._faces import aran_tool, ashared_run, attach_sinks, ran_tool, shared_run
from loop_guard._guard import LoopGuard
from loop_guard._history import current_request, question_of, worked_on
from loop_guard._judge import aask_judge, ask_judge, judge_model
from loop_guard._langchain import block_message, messages_of, tool_names
from loop_guard._reply_watch import RepeatedTextCut
from loop_guard._turn import Turn
from loop_guard._values import Block, Call, Stop

__all__ = ["ExitBehavior", "LoopGuardMiddleware"]

if TYPE_CHECKING:
    from langgraph.runtime import Runtime


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
        compact_repeats: bool = False,
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
            compact_repeats: Send the model each repeated tool result (and each
                repeated message of the guard's) once: a later identical one is sent
                as a short line naming the earlier call (`compact_repeats`). The
                history keeps every result; the requests stay prefix-stable, so
                prompt caching holds. List a middleware that trims what the model is
                sent before this one, so the guard compacts what it kept. Off by default.
            **options: Any setting (`LoopGuardOptions`: `warn_threshold`,
                `block_threshold`, `abort_threshold`, `ignore_tools`, `tools`, ...); one
                given wins over `config` and the environment, one not given keeps coming
                from them.

        Raises:
            ValueError: If an explicit argument is invalid.
        """
        super().__init__()
        self.exit_behavior = _exits.checked(exit_behavior)
        every: object = judge_every  # checked at run time: callers may be untyped
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            msg = f"judge_every must be an integer >= 1, got {every!r}"
            raise ValueError(msg)
        self.guard = LoopGuard(config, on_event=on_event, **options)
        if judge is not None:
            self.guard.serve_judge()
        self.judge = judge_model(judge)
        self.judge_every = judge_every
        self.compact_repeats = compact_repeats
        attach_sinks(self.guard)
        # The last list of tools a model request offered, and their names.
        self._tools_offered: tuple[Sequence[object], frozenset[str]] = ((), frozenset())

    @override
    def before_agent(
        self, state: LoopGuardState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        """Start a new request: everything resets but the recent steps; or go on with the
        request the history holds, when agents before this one worked on it.

        A request is what one user message starts, whichever agents run for it: an agent
        entered by a handoff or a supervisor's delegation continues it, its state read
        from the shared history (every agent's calls, in the history's order), so that a
        loop between agents is one sequence for the detectors.

        See How the guard decides: reset and scope, and beyond the Pi extension.
        """
        _exits.check_checkpointer(self.exit_behavior)
        session = session_of(self.guard, state, runtime)
        left = left_unanswered(self.exit_behavior, state, session.stop)
        messages = messages_of(state)
        if left is None and worked_on(messages):
            take_over(self.guard, session, messages)
        else:
            session.start_request(uuid.uuid4().hex, question_of(current_request(messages)[1]))
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
        turn = self._turn(request)
        if self.judge is not None and (question := turn.question()) is not None:
            turn.judged(*ask_judge(self.judge, question))
        while (model_request := turn.next_request()) is not None:
            try:
                with turn.watching(model_request) as cutter:
                    response = handler(turn.sending(model_request))
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
        turn = self._turn(request)
        if self.judge is not None and (question := turn.question()) is not None:
            turn.judged(*await aask_judge(self.judge, question))
        while (model_request := turn.next_request()) is not None:
            try:
                with turn.watching(model_request) as cutter:
                    response = await handler(turn.sending(model_request))
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
        session = session_of(self.guard, state, runtime)
        session.end_request()
        _exits.raise_after_run(self.exit_behavior, session.stop)
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
        asked = asked_about(self.guard, self.exit_behavior, request)
        if asked is not None:
            decided = asked.decide(request)
            if not isinstance(decided, ToolCallRequest):  # answered, or stopped
                return decided
            return asked.ran(ran_tool(self.guard, handler, decided), request, decided)
        answer = self._blocked_answer(request)
        if answer is not None:
            return answer
        shared = self._sharing(request)
        if shared is None:
            return ran_tool(self.guard, handler, request)
        conversation, call, siblings = shared
        return cast(
            "ToolMessage | Command[Any]",
            shared_run(
                self.guard,
                conversation,
                call,
                siblings,
                lambda: ran_tool(self.guard, handler, request),
            ),
        )

    @override
    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Async twin of `wrap_tool_call`."""
        asked = asked_about(self.guard, self.exit_behavior, request)
        if asked is not None:
            decided = asked.decide(request)
            if not isinstance(decided, ToolCallRequest):  # answered, or stopped
                return decided
            return asked.ran(await aran_tool(self.guard, handler, decided), request, decided)
        answer = self._blocked_answer(request)
        if answer is not None:
            return answer
        shared = self._sharing(request)
        if shared is None:
            return await aran_tool(self.guard, handler, request)
        conversation, call, siblings = shared
        return cast(
            "ToolMessage | Command[Any]",
            await ashared_run(
                self.guard,
                conversation,
                call,
                siblings,
                lambda: aran_tool(self.guard, handler, request),
            ),
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

    def _turn(self, request: ModelRequest[ContextT]) -> Turn[ResponseT]:
        """A model turn on `request`, the guard told first what the offered tools say of
        themselves (MCP annotations): once per list of tools, as an agent offers the same
        list at every model call."""
        tools = request.tools
        offered, names = self._tools_offered
        if tools is not offered:
            names = tool_names(tools)
            self.guard.add_tools((*names, *tools))  # provider dicts by name
            self._tools_offered = (tools, names)
        return Turn(
            self.guard,
            request,
            names,
            exit_behavior=self.exit_behavior,
            judge_every=self.judge_every,
            compact_repeats=self.compact_repeats,
        )

    def _sharing(self, request: ToolCallRequest) -> tuple[str, Call, Sequence[Call]] | None:
        """The conversation, the call and its siblings when identical siblings may share."""
        if not self.guard.config.dedupe_siblings:
            return None
        try:
            placed = placed_call(request)
            if placed is None:
                return None
            siblings, position = placed
            return conversation_of(request.state, request.runtime), siblings[position], siblings
        except Exception as error:  # a fault of the guard: this call runs unshared
            self.guard.report_fault(None, error)
            return None

    def will_run(self, request: ToolCallRequest) -> bool:
        """Whether the guard lets this tool call run: `False` for a call it blocked, and
        for the call it asks a person about itself (`exit_behavior="ask"`).

        Pass it as `HumanInTheLoopMiddleware`'s `when`, so that a person is never asked
        to approve a call the guard will not run (its answer would be thrown away), and
        is asked about a loop once, by the guard. It gives the same answer for the same
        call whenever it is asked, as `when` must. A fault of the guard answers `True`.

        Example:
            ```python
            guard = LoopGuardMiddleware(exit_behavior="ask")
            approval = HumanInTheLoopMiddleware(
                interrupt_on={"send_email": {"allowed_decisions": ["approve", "reject"],
                                             "when": guard.will_run}}
            )
            agent = create_agent(model, tools, middleware=[guard, approval], checkpointer=...)
            ```
        """
        return self._blocked(request) is None

    def _blocked_answer(self, request: ToolCallRequest) -> ToolMessage | None:
        """The answer of a call the guard blocked when it decided the reply, if blocked.

        A reply blocked only in part keeps its blocked calls unanswered until the tool
        node reaches them, so that middleware acting after the model (call limits,
        human approval) never answers a call a second time.
        """
        blocked = self._blocked(request)
        if blocked is None or not isinstance(blocked[1], Block):
            return None
        call, verdict = blocked
        return block_message(call.id, call.tool, verdict.message)

    def _blocked(self, request: ToolCallRequest) -> tuple[Call, Block | Stop] | None:
        """The call and the verdict that keeps it from running, when the guard did not let
        it run as it decided its reply (a block; the stop, for the call a person is asked
        about); `None` when it runs."""
        try:
            if not self.guard.blocks_any(request.state.get("loop_guard") or {}):
                return None  # the common case: nothing of the reply was blocked
            session = session_of(self.guard, request.state, request.runtime)
            call = call_of(request)
            verdict = None if call is None else session.verdict_of(call)
            return (call, verdict) if call and isinstance(verdict, Block | Stop) else None
        except Exception as error:  # a fault of the guard: the call runs unguarded
            self.guard.report_fault(None, error)
            return None
