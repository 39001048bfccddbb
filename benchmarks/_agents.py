"""Agents for the benchmarks: tools, scripted models, graph builders, timed guard parts.

Everything here is offline and deterministic. The model is `loop_guard.testing`'s
`ScriptedChatModel` ("instant"), the tools return at once, so what is measured is the
agent framework plus whatever guard is attached.

The `Timed*` classes are the guard's own classes with a stopwatch around the methods
that run the guard's code. They measure the guard's CPU time *in situ* (inside a real
run, on the real messages), charged to the model step it happened in. The stopwatch is
`time.thread_time`, so time spent waiting for another thread or process is not counted.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ToolCallLimitMiddleware, hook_config
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardNode,
    guard_tools,
)
from loop_guard.testing import ScriptedChatModel
from loop_guard.tools import GuardedTool

Script = Callable[[Sequence[BaseMessage], int], AIMessage]
CallSpec = tuple[str, dict[str, Any]]

_script_ids = itertools.count(1)
_FILLER = "def handler(event, context):\n    return {'status': 200, 'body': event['body']}\n" * 3


# ---------------------------------------------------------------------------- tools


class Toolbox:
    """Four tools whose bodies count their runs and remember every output they gave.

    Every output starts with "OK"; an output the model sees that no tool body produced
    (a replaced or amended result) is an intervention.
    """

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.outputs: Counter[str] = Counter()
        self._progress: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _out(self, name: str, text: str) -> str:
        with self._lock:
            self.runs[name] += 1
            self.outputs[text] += 1
        return text

    def tools(self) -> list[BaseTool]:
        box = self

        @tool
        def read_file(path: str) -> str:
            """Read a file."""
            if path == "notes.md":
                with box._lock:
                    box.runs["read_file"] += 1
                raise ToolException("File not found: notes.md")
            return box._out("read_file", f"OK {path}:\n{_FILLER}")

        read_file.handle_tool_error = True  # the failure reaches the model as an error result

        @tool
        def job_status(job: str) -> str:
            """Poll a job."""
            with box._lock:
                box._progress[job] += 1
                done = box._progress[job]
            return box._out("job_status", f"OK job {job}: {min(done * 5, 100)}% done")

        @tool
        def list_items(page: int) -> str:
            """List one page of items."""
            first = (page - 1) * 10
            return box._out("list_items", f"OK page {page}: items {first}..{first + 9}")

        @tool
        def lookup(record_id: str) -> str:
            """Look a record up."""
            return box._out("lookup", f"OK lookup {record_id}: no such record")

        return [read_file, job_status, list_items, lookup]


# ---------------------------------------------------------------------------- scripts


def _message(prefix: str, turn: int, calls: Sequence[CallSpec]) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {
                "name": name,
                "args": dict(args),
                "id": f"call_{prefix}_{turn}_{n}",
                "type": "tool_call",
            }
            for n, (name, args) in enumerate(calls)
        ],
    )


class Meter:
    """Per-model-step CPU seconds of the guard, filled by the `Timed*` classes.

    The scripted model advances `step` on each model call; whatever guard code runs
    until the next model call is charged to that step.
    """

    def __init__(self) -> None:
        self.step = 0
        self.per_step: Counter[int] = Counter()
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.per_step[self.step] += seconds

    def steps(self, first: int, last: int) -> list[float]:
        """The per-step costs of steps first..last-1 (0 where the guard did nothing)."""
        return [self.per_step.get(i, 0.0) for i in range(first, last)]


class Scripted:
    """A script over turns of tool calls, then a final answer; counts the model calls."""

    def __init__(
        self,
        turns: Callable[[int], Sequence[CallSpec] | None],
        meter: Meter | None = None,
    ) -> None:
        self.turns = turns
        self.meter = meter
        self.calls = 0
        self._prefix = f"s{next(_script_ids)}"

    def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
        turn = self.calls
        self.calls += 1
        if self.meter is not None:
            self.meter.step = turn + 1
        calls = self.turns(turn)
        if not calls:
            return AIMessage(content="done")
        return _message(self._prefix, turn, calls)

    def model(self) -> ScriptedChatModel:
        return ScriptedChatModel(script=self)


def healthy(steps: int, meter: Meter | None = None) -> Scripted:
    """`steps` turns, each reading a different file, then an answer."""
    return Scripted(
        lambda turn: [("read_file", {"path": f"src/module_{turn}.py"})] if turn < steps else None,
        meter,
    )


def stubborn(meter: Meter | None = None) -> Scripted:
    """Reads the same missing file forever, whatever it is told."""
    return Scripted(lambda turn: [("read_file", {"path": "notes.md"})], meter)


def one_step() -> Scripted:
    """One distinct read per request, then an answer: one model serves any number of runs."""
    calls = itertools.count()

    def turns(turn: int) -> Sequence[CallSpec] | None:
        return None  # unused: see `__call__` below

    class OneStep(Scripted):
        def __call__(self, messages: Sequence[BaseMessage], index: int) -> AIMessage:
            self.calls += 1
            if not isinstance(messages[-1], HumanMessage):
                return AIMessage(content="done")
            n = next(calls)
            return _message(self._prefix, n, [("read_file", {"path": f"src/{n}.py"})])

    return OneStep(turns)


def stubborn_ok(meter: Meter | None = None) -> Scripted:
    """Looks up the same record forever; the (successful) answer never changes."""
    return Scripted(lambda turn: [("lookup", {"record_id": "user-1"})], meter)


def mixed_healthy_turns() -> list[list[CallSpec]]:
    """Legitimate work that repeats itself: every guard should leave it alone.

    Distinct reads, a poll whose result advances (same args 12 times in a row),
    pagination, distinct lookups that all answer "no such record", parallel distinct
    reads, a verification re-read (twice in a row, same result), an earlier file read
    again later.
    """
    turns: list[list[CallSpec]] = []
    turns += [[("read_file", {"path": f"src/part_{i}.py"})] for i in range(8)]
    turns += [[("job_status", {"job": "build-42"})] for _ in range(12)]
    turns += [[("list_items", {"page": p})] for p in range(1, 11)]
    turns += [[("lookup", {"record_id": f"user-{i}"})] for i in range(8)]
    turns += [
        [("read_file", {"path": f"docs/{i}-{k}.md"}) for k in ("a", "b", "c")] for i in range(3)
    ]
    turns += [[("read_file", {"path": "src/part_3.py"})] for _ in range(2)]
    turns += [[("read_file", {"path": "src/part_1.py"})]]
    return turns


def mixed_healthy(meter: Meter | None = None) -> Scripted:
    turns = mixed_healthy_turns()
    return Scripted(lambda turn: turns[turn] if turn < len(turns) else None, meter)


# ---------------------------------------------------------------------------- timed parts

_METER: list[Meter | None] = [None]


def set_meter(meter: Meter | None) -> None:
    """The meter the `Timed*` classes charge (one measured run at a time)."""
    _METER[0] = meter


def _charge(start: float) -> None:
    meter = _METER[0]
    if meter is not None:
        meter.add(time.thread_time() - start)


class TimedMiddleware(LoopGuardMiddleware):
    """`LoopGuardMiddleware` with a stopwatch on each hook's own code.

    `wrap_model_call` does its work through `_fail_open`, which is timed (not the model
    call it wraps); `wrap_tool_call` looks the call's verdict up (`_refusal`, timed) and
    otherwise passes it on unless `dedupe_siblings` is set.
    """

    def before_agent(self, state: Any, runtime: Any) -> Any:
        start = time.thread_time()
        try:
            return super().before_agent(state, runtime)
        finally:
            _charge(start)

    def _fail_open(self, *args: Any) -> Any:
        start = time.thread_time()
        try:
            return super()._fail_open(*args)
        finally:
            _charge(start)

    def _refusal(self, request: Any) -> Any:
        start = time.thread_time()
        try:
            return super()._refusal(request)
        finally:
            _charge(start)

    def after_agent(self, state: Any, runtime: Any) -> Any:
        start = time.thread_time()
        try:
            return super().after_agent(state, runtime)
        finally:
            _charge(start)


class TimedToolCallLimit(ToolCallLimitMiddleware):
    """LangChain's `ToolCallLimitMiddleware` with a stopwatch on its one hook."""

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> Any:
        start = time.thread_time()
        try:
            return super().after_model(state, runtime)
        finally:
            _charge(start)


class NullHooks(AgentMiddleware):
    """Does nothing, through the same hooks as `LoopGuardMiddleware`.

    What any middleware with that layout costs before it does any work: the
    framework's price of the hooks themselves (graph nodes, call wrappers).
    """

    def before_agent(self, state: Any, runtime: Any) -> None:
        return None

    def after_agent(self, state: Any, runtime: Any) -> None:
        return None

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return handler(request)


class NullAfterModel(AgentMiddleware):
    """Does nothing, through one `after_model` hook: `ToolCallLimitMiddleware`'s layout."""

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> None:
        return None


class TimedNode(LoopGuardNode):
    """`LoopGuardNode` with a stopwatch."""

    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        start = time.thread_time()
        try:
            return super().__call__(state, config)
        finally:
            _charge(start)


class TimedGuardedTool(GuardedTool):
    """`GuardedTool` with a stopwatch on the guard's work before and after the tool body."""

    def _decide(self, input: Any, config: Any) -> Any:
        start = time.thread_time()
        try:
            return super()._decide(input, config)
        finally:
            _charge(start)

    def _after(self, decision: Any, output: Any) -> Any:
        start = time.thread_time()
        try:
            return super()._after(decision, output)
        finally:
            _charge(start)


_TIMED = ((GuardedTool, ("_decide", "_after")), (LoopGuardNode, ("__call__",)))
for _owner, _names in _TIMED:  # fail loudly (the smoke pass crashes) if the package moved them
    for _name in _names:
        if _name not in vars(_owner):
            msg = f"{_owner.__name__}.{_name} no longer exists: update the Timed* classes"
            raise ImportError(msg)


def _timed_method(name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return getattr(LoopGuardCallbackHandler, name)(self, *args, **kwargs)
        finally:
            _charge(start)

    method.__name__ = name
    return method


_HANDLER_METHODS = (
    "on_chain_start",
    "on_chat_model_start",
    "on_llm_end",
    "on_llm_error",
    "on_tool_start",
    "on_tool_end",
    "on_tool_error",
    "on_chain_end",
    "on_chain_error",
)

TimedHandler: type[LoopGuardCallbackHandler] = type(
    "TimedHandler",
    (LoopGuardCallbackHandler,),
    {name: _timed_method(name) for name in _HANDLER_METHODS},
)
"""`LoopGuardCallbackHandler` with a stopwatch on every callback it implements."""


def timed_guard_tools(tools: Sequence[BaseTool], guard: LoopGuard) -> list[BaseTool]:
    """`guard_tools(..., deliver_steer=False)`, each tool given the stopwatch."""
    wrapped = guard_tools(tools, guard, deliver_steer=False)
    for item in wrapped:
        item.__class__ = TimedGuardedTool
    return wrapped


# ---------------------------------------------------------------------------- agents


def agent_with(script: Scripted, box: Toolbox, middleware: Sequence[Any]) -> Any:
    return create_agent(script.model(), box.tools(), middleware=list(middleware))


def graph_with(
    script: Scripted,
    box: Toolbox,
    guard: LoopGuard | None,
    *,
    timed: bool = True,
) -> Any:
    """The hand-built graph of the README: model -> tools [-> loop_guard] -> model | END.

    Without a guard: model -> ToolNode(tools) -> model. With one: the tools wrapped by
    `guard_tools(deliver_steer=False)` and `LoopGuardNode` after the tools node.
    """
    model = script.model()
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    if guard is None:
        builder.add_node("tools", ToolNode(box.tools()))
        builder.add_edge("tools", "model")
    else:
        tools = (
            timed_guard_tools(box.tools(), guard)
            if timed
            else guard_tools(box.tools(), guard, deliver_steer=False)
        )
        node = TimedNode(guard) if timed else LoopGuardNode(guard)
        builder.add_node("tools", ToolNode(tools))
        builder.add_node("loop_guard", node, destinations=("model", END))
        builder.add_edge("tools", "loop_guard")
    return builder.compile()


def ask(text: str = "Please do the work.", history: Sequence[BaseMessage] = ()) -> dict[str, Any]:
    return {"messages": [*history, HumanMessage(text)]}


def earlier_history(messages: int) -> list[BaseMessage]:
    """`messages` messages of earlier, finished requests on the same thread."""
    out: list[BaseMessage] = []
    request = 0
    while len(out) < messages:
        call_id = f"old_{request}"
        out += [
            HumanMessage(f"Earlier question {request}", id=f"h{request}"),
            AIMessage(
                content="",
                id=f"a{request}",
                tool_calls=[
                    {
                        "name": "read_file",
                        "args": {"path": f"old/{request}.py"},
                        "id": call_id,
                        "type": "tool_call",
                    }
                ],
            ),
            ToolMessage(f"OK old/{request}.py", tool_call_id=call_id, id=f"t{request}"),
            AIMessage(content=f"Answer {request}", id=f"f{request}"),
        ]
        request += 1
    return out[:messages]


def config_for(thread: str | None, *, limit: int, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    config: dict[str, Any] = {"recursion_limit": limit}
    if thread is not None:
        config["configurable"] = {"thread_id": thread}
    if callbacks:
        config["callbacks"] = list(callbacks)
    return config


def interventions(messages: Sequence[BaseMessage], box: Toolbox, script: Scripted) -> int:
    """How many times a guard changed what the model saw, in a finished history.

    Counted: a tool result no tool body produced (replaced, blocked or amended), a
    message neither the model nor a tool wrote (a steer, a stop message), and a run
    that ended before the script's final answer.
    """
    produced = Counter(box.outputs)
    count = 0
    for message in messages[1:]:
        if isinstance(message, ToolMessage):
            text = message.content if isinstance(message.content, str) else str(message.content)
            if produced[text] > 0:
                produced[text] -= 1
            elif not text.startswith("File not found"):
                count += 1
        elif isinstance(message, AIMessage):
            if message.name:  # the scripted model never names its messages
                count += 1
        else:
            count += 1
    final = messages[-1] if messages else None
    if not (isinstance(final, AIMessage) and final.content == "done" and not final.name):
        count += 1
    return count


def run_invoke(agent: Any, payload: Any, config: dict[str, Any]) -> tuple[list[BaseMessage], str]:
    """Invoke; the final messages and how the run ended (`completed` or the exception)."""
    try:
        result = agent.invoke(payload, config)
    except Exception as error:  # a guard that stops the run by raising
        return [], type(error).__name__
    return list(result["messages"]), "completed"
