"""Agents for the benchmarks: tools, scripted models, graph builders, a stopwatch.

Everything here is offline and deterministic. The model is `loop_guard.testing`'s
`ScriptedChatModel` ("instant"), the tools return at once, so what is measured is the
agent framework plus whatever guard is attached.

The stopwatch measures the guard's CPU time *in situ* (inside a real run, on the real
messages), charged to the model step it happened in, through public seams only: the
middleware's hooks, the node's `__call__`, the handler's callbacks and a guarded tool's
`invoke` (reached through `ToolNode`'s `wrap_tool_call` interceptor). Whatever such a
seam hands on to (the model, a tool body, the rest of the middleware stack) is timed
apart and subtracted. The clock is `time.thread_time`, so time spent waiting for
another thread or process is not counted.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from loop_guard import (
    LoopGuard,
    LoopGuardCallbackHandler,
    LoopGuardMiddleware,
    LoopGuardNode,
    guard_tools,
)
from loop_guard.testing import ScriptedChatModel

Script = Callable[[Sequence[BaseMessage], int], AIMessage]
CallSpec = tuple[str, dict[str, Any]]

_script_ids = itertools.count(1)
_FILLER = "def handler(event, context):\n    return {'status': 200, 'body': event['body']}\n" * 3


def sized_result(path: str, size: int, run: int) -> str:
    """A realistic result of about `size` characters for reading `path`: a source file on
    odd runs, a JSON listing (ids, timestamps, counts) on even ones. Each is the path and
    a body made once per size, so making a 1 MB result costs a copy, not a loop."""
    if run % 2:
        return f"# {path}\n{_sized_body(size, code=True)}"
    return f'{{"path": {json.dumps(path)}, {_sized_body(size, code=False)}'


@functools.cache
def _sized_body(size: int, *, code: bool) -> str:
    if code:
        lines = []
        for n in range(size // 150 + 1):
            lines += [
                f"def handler_{n}(event, context):",
                f'    """Handle request type {n} (see docs/handlers.md#{n})."""',
                "    body = event.get('body') or {}",
                f"    return {{'status': 200, 'handler': {n}, 'body': body}}",
                "",
            ]
        return "\n".join(lines)[:size]
    items = [
        {
            "id": f"rec_{n:05d}",
            "name": f"entry {n}",
            "created_at": f"2025-03-{n % 28 + 1:02d}T12:{n % 60:02d}:00Z",
            "size": 1000 + 37 * n,
            "tags": ["source", f"group-{n % 7}"],
            "status": "active" if n % 3 else "archived",
        }
        for n in range(size // 180 + 1)
    ]
    return json.dumps({"total": len(items), "items": items}, indent=1)[1:]


# ---------------------------------------------------------------------------- tools


class Toolbox:
    """Four tools whose bodies count their runs and remember every output they gave.

    Every output starts with "OK"; an output the model sees that no tool body produced
    (a replaced or amended result) is an intervention.
    """

    def __init__(self, result_size: int = 0) -> None:
        self.result_size = result_size  # 0: short reads (`_FILLER`); else `sized_result`
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
        """The four tools, each a `MeteredTool` (its run is never the guard's)."""
        box = self

        def read_file(path: str) -> str:
            """Read a file."""
            if path == "notes.md":
                with box._lock:
                    box.runs["read_file"] += 1
                raise ToolException("File not found: notes.md")
            if box.result_size:
                text = sized_result(path, box.result_size, box.runs["read_file"])
                return box._out("read_file", text)
            return box._out("read_file", f"OK {path}:\n{_FILLER}")

        def job_status(job: str) -> str:
            """Poll a job."""
            with box._lock:
                box._progress[job] += 1
                done = box._progress[job]
            return box._out("job_status", f"OK job {job}: {min(done * 5, 100)}% done")

        def list_items(page: int) -> str:
            """List one page of items."""
            first = (page - 1) * 10
            return box._out("list_items", f"OK page {page}: items {first}..{first + 9}")

        def lookup(record_id: str) -> str:
            """Look a record up."""
            return box._out("lookup", f"OK lookup {record_id}: no such record")

        return [
            # The failure reaches the model as an error result.
            metered(read_file, handle_tool_error=True),
            metered(job_status),
            metered(list_items),
            metered(lookup),
        ]

    def writer(self) -> BaseTool:
        """`write_file(path, content)`, answering "OK wrote ..." (the scaling batches)."""
        box = self

        def write_file(path: str, content: str) -> str:
            """Write a file."""
            return box._out("write_file", f"OK wrote {len(content)} characters to {path}")

        return metered(write_file)


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
    """Per-model-step CPU seconds of the guard, filled by the stopwatch.

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


# ---------------------------------------------------------------------------- stopwatch
#
# The guard's CPU time is measured in situ through public seams only: the hooks a
# middleware implements, `LoopGuardNode.__call__`, the callbacks of
# `LoopGuardCallbackHandler`, and the public `invoke` of a guarded tool, reached
# through `ToolNode`'s public `wrap_tool_call` interceptor. What such a seam hands on
# to code that is not the guard's (the `handler` of a wrap hook: the model, the tool;
# the wrapped tool a guarded tool runs) is timed as a span of its own and subtracted.

_METER: list[Meter | None] = [None]


def set_meter(meter: Meter | None) -> None:
    """The meter the stopwatch charges (one measured run at a time)."""
    _METER[0] = meter


class _Frames(threading.local):
    """This thread's open spans, innermost last: [charged, since]."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []


_FRAMES = _Frames()


def _settle(frame: list[Any], now: float) -> None:
    if frame[0]:
        meter = _METER[0]
        if meter is not None:
            meter.add(now - frame[1])
    frame[1] = now


class _Span:
    """A stretch of code on this thread, the guard's (`GUARD`) or not (`OTHER`).

    Time is split between nested spans like a profiler's self time: a span owns the
    thread CPU time that passes while it is the innermost open span. The guard's share
    is charged to the meter as it goes (so a hook's work before the model call is
    charged to the step before it, its work after to the new step). Each thread keeps
    its own stack: `ToolNode` runs tools in a thread pool.
    """

    __slots__ = ("charged",)

    def __init__(self, *, charged: bool) -> None:
        self.charged = charged

    def __enter__(self) -> None:
        now = time.thread_time()
        stack = _FRAMES.stack
        if stack:
            _settle(stack[-1], now)
        stack.append([self.charged, now])

    def __exit__(self, *exc: object) -> None:
        now = time.thread_time()
        stack = _FRAMES.stack
        _settle(stack.pop(), now)
        if stack:
            stack[-1][1] = now


GUARD = _Span(charged=True)
"""The guard's own code: charged to the meter."""
OTHER = _Span(charged=False)
"""Code the guard hands on to (the model, a tool, the framework behind a handler)."""


def not_the_guards(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`handler` (what a wrap hook calls on with) timed as `OTHER`."""

    def run(request: Any) -> Any:
        with OTHER:
            return handler(request)

    return run


# -- middleware: the public hooks

_STATE_HOOKS = ("before_agent", "before_model", "after_model", "after_agent")
_WRAP_HOOKS = ("wrap_model_call", "wrap_tool_call")


def _timed_state_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)  # keeps `hook_config`'s marks (`can_jump_to`)
    def timed(self: Any, state: Any, runtime: Any) -> Any:
        with GUARD:
            return hook(self, state, runtime)

    return timed


def _timed_wrap_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def timed(self: Any, request: Any, handler: Callable[[Any], Any]) -> Any:
        with GUARD:
            return hook(self, request, not_the_guards(handler))

    return timed


M = TypeVar("M", bound=AgentMiddleware)


def with_stopwatch(middleware: type[M]) -> type[M]:
    """`middleware` with a stopwatch on every public sync hook it implements.

    Only the hooks the class itself implements are overridden, so the agent's graph has
    exactly the nodes it has without the stopwatch. The `handler` a wrap hook calls
    (the model, the tool, the middleware inside) is not the hook's own time.
    """
    namespace: dict[str, Any] = {}
    for name in _STATE_HOOKS + _WRAP_HOOKS:
        hook = getattr(middleware, name)
        if hook is getattr(AgentMiddleware, name):
            continue
        timed = _timed_wrap_hook if name in _WRAP_HOOKS else _timed_state_hook
        namespace[name] = timed(hook)
    if not namespace:
        msg = f"{middleware.__name__} implements no sync hook to time"
        raise TypeError(msg)
    return type(f"Timed{middleware.__name__}", (middleware,), namespace)


TimedMiddleware = with_stopwatch(LoopGuardMiddleware)
"""`LoopGuardMiddleware` with a stopwatch on its hooks."""

# -- graph: the node, the handler's callbacks, the guarded tools' `invoke`


class NullNode:
    """Does nothing, in the place of `LoopGuardNode`: a node after the tools node that
    routes back to the model with a `Command`.

    What the README's graph layout costs before any guard work: the framework's price
    of one more node per model step.
    """

    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        return Command(goto="model")


class TimedNullNode(NullNode):
    """`NullNode` with the stopwatch on its `__call__`: the floor of the node's column."""

    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        with GUARD:
            return super().__call__(state, config)


class TimedNode(LoopGuardNode):
    """`LoopGuardNode` with a stopwatch on its public `__call__`."""

    def __call__(self, state: Any, config: RunnableConfig) -> Any:
        with GUARD:
            return super().__call__(state, config)


def _timed_callback(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        with GUARD:
            return callback(self, *args, **kwargs)

    return timed


def _implemented_callbacks(handler: type[BaseCallbackHandler]) -> list[str]:
    """The public `on_*` callbacks `handler` implements (not `BaseCallbackHandler`'s no-ops)."""
    return [
        name
        for name in dir(BaseCallbackHandler)
        if name.startswith("on_")
        and getattr(handler, name) is not getattr(BaseCallbackHandler, name)
    ]


TimedHandler: type[LoopGuardCallbackHandler] = type(
    "TimedHandler",
    (LoopGuardCallbackHandler,),
    {
        name: _timed_callback(getattr(LoopGuardCallbackHandler, name))
        for name in _implemented_callbacks(LoopGuardCallbackHandler)
    },
)
"""`LoopGuardCallbackHandler` with a stopwatch on every callback it implements."""


def _nothing(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


NullHandler: type[BaseCallbackHandler] = type(
    "NullHandler",
    (BaseCallbackHandler,),
    {
        "raise_error": LoopGuardCallbackHandler.raise_error,
        "run_inline": LoopGuardCallbackHandler.run_inline,
        **dict.fromkeys(_implemented_callbacks(LoopGuardCallbackHandler), _nothing),
    },
)
"""Does nothing, through the callbacks `LoopGuardCallbackHandler` implements: what
LangChain's dispatch of those events costs before any handler code runs."""


class MeteredTool(StructuredTool):
    """A tool whose own run is never the guard's: its public `invoke` and `run` (argument
    validation, callbacks, the body, the output message) are timed as `OTHER`.

    The benchmarks' tools are all metered, so what a guarded tool spends in the tool it
    wraps is subtracted from the guarded tool's time, whichever public entry it uses.
    """

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with OTHER:
            return super().invoke(input, config, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        with OTHER:
            return super().run(*args, **kwargs)


def metered(function: Callable[..., Any], **options: Any) -> BaseTool:
    """`function` as a `MeteredTool` (name and description from the function, as `@tool`)."""
    return MeteredTool.from_function(function, **options)


class ToolStopwatch(BaseTool):
    """Stands in for one tool where `ToolNode` invokes it: times that tool's public
    `invoke`, as the guard's (`charged`) or not.

    Put in place by `stopwatch_interceptor` through `ToolCallRequest.override(tool=...)`;
    `ToolNode` has already worked out the tool's injected arguments from the registered
    tool by its name. It fires no callbacks of its own. The async path is not timed
    (thread CPU time means nothing across an `await`); the benchmarks run sync.
    """

    timed: BaseTool
    charged: bool = True

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.timed.get_input_schema(config)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with GUARD if self.charged else OTHER:
            return self.timed.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await self.timed.ainvoke(input, config, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # `invoke` never gets here


def stopwatch_interceptor(
    tools: Sequence[BaseTool], *, charged: bool
) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """A `ToolNode(wrap_tool_call=...)` interceptor timing each tool's public `invoke`.

    With `charged`, the time inside a guarded tool's `invoke` is the guard's, less what
    the tool it wraps spends (a `MeteredTool`) and less the handler's callbacks fired
    there (timed on their own). Without, the same interceptor only costs what it costs,
    so that an unguarded `ToolNode` pays it too.
    """
    watches = {
        item.name: ToolStopwatch(
            name=item.name, description=item.description, timed=item, charged=charged
        )
        for item in tools
    }

    def intercept(request: Any, execute: Callable[[Any], Any]) -> Any:
        watch = watches.get(request.tool_call["name"])
        if watch is None or watch.timed is not request.tool:
            return execute(request)
        return execute(request.override(tool=watch))

    return intercept


def tool_node(
    tools: Sequence[BaseTool],
    *,
    charged: bool,
    timed: bool = True,
    interceptor: Callable[[Any, Callable[[Any], Any]], Any] | None = None,
) -> ToolNode:
    """`ToolNode(tools)`, with the stopwatch interceptor when `timed`, else with
    `interceptor` if given (`ToolNode(wrap_tool_call=interceptor)`)."""
    if not timed:
        return ToolNode(list(tools), wrap_tool_call=interceptor)
    return ToolNode(list(tools), wrap_tool_call=stopwatch_interceptor(tools, charged=charged))


# ---------------------------------------------------------------------------- agents


def agent_with(script: Scripted, box: Toolbox, middleware: Sequence[Any]) -> Any:
    return create_agent(script.model(), box.tools(), middleware=list(middleware))


def graph_with(
    script: Scripted,
    box: Toolbox,
    guard: LoopGuard | None,
    *,
    timed: bool = True,
    node: bool = True,
    tools: Sequence[BaseTool] | None = None,
    null_node: bool = False,
    interceptor: Callable[[Any, Callable[[Any], Any]], Any] | None = None,
) -> Any:
    """The hand-built graph of the README: model -> tools [-> loop_guard] -> model | END.

    Without a guard: model -> ToolNode(tools) -> model, or with `null_node`, a
    do-nothing node in the guard node's place (`NullNode`). With a guard: the tools
    wrapped by `guard_tools(deliver_steer=False)` and `LoopGuardNode` after the tools
    node; with `node=False`, the wrapped tools alone (`guard_tools` with its defaults).
    `timed` puts the stopwatch on the node and on the tools' `invoke` (with or without a
    guard, so that both graphs pay for the interceptor). `tools` replaces the toolbox's
    tools. `interceptor`, without a guard, node or stopwatch, is the tools node's
    `wrap_tool_call` (a guard living in the tools node: `_minimal.graph_interceptor`).
    """
    if interceptor is not None and (guard is not None or null_node or timed):
        msg = "an interceptor goes only in the unguarded, untimed graph without a node"
        raise ValueError(msg)
    model = script.model()
    inner = list(tools) if tools is not None else box.tools()
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    if guard is None and null_node:
        builder.add_node("tools", tool_node(inner, charged=False, timed=timed))
        null = TimedNullNode() if timed else NullNode()
        builder.add_node("loop_guard", null, destinations=("model", END))
        builder.add_edge("tools", "loop_guard")
    elif guard is None:
        tools_node = tool_node(inner, charged=False, timed=timed, interceptor=interceptor)
        builder.add_node("tools", tools_node)
        builder.add_edge("tools", "model")
    elif not node:
        builder.add_node("tools", tool_node(guard_tools(inner, guard), charged=True, timed=timed))
        builder.add_edge("tools", "model")
    else:
        wrapped = guard_tools(inner, guard, deliver_steer=False)
        builder.add_node("tools", tool_node(wrapped, charged=True, timed=timed))
        guard_node = TimedNode(guard) if timed else LoopGuardNode(guard)
        builder.add_node("loop_guard", guard_node, destinations=("model", END))
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


def earlier_steps(steps: int) -> list[BaseMessage]:
    """`steps` steps the request has made already: distinct reads and their results."""
    out: list[BaseMessage] = []
    for step in range(steps):
        call_id = f"done_{step}"
        call = {"name": "read_file", "args": {"path": f"done/{step}.py"}, "id": call_id}
        out += [
            AIMessage(content="", id=f"da{step}", tool_calls=[{**call, "type": "tool_call"}]),
            ToolMessage(f"OK done/{step}.py", tool_call_id=call_id, id=f"dt{step}"),
        ]
    return out


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
