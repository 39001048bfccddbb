"""The scenario catalogue of notes/agent-harnesses.md §7 as scripted agents.

Each scenario is a scripted agent (the only fake: the model) against deterministic
real tools; `expect` checks the guard's events, stamped with the tool call they came
at: true loops (A-C) are steered and stopped, legitimate shapes (D) are never
blocked, and the guard's bookkeeping (E) holds. `tests/faces/every_face/test_catalogue.py`
runs every scenario through the middleware and the graph node; `evals/traces.py` reports them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import GuardEvent, LoopGuardConfig, LoopGuardMiddleware
from loop_guard.testing import Script, ScriptedChatModel, sequence

Turn = Sequence[tuple[str, dict[str, Any]]]
THREAD: Any = {"configurable": {"thread_id": "catalogue"}}


def toolbox(runs: Counter[str]) -> list[BaseTool]:
    """Deterministic tools: what a call returns depends only on its args and, for the
    tools that make progress, on how often it ran."""
    progress: Counter[str] = Counter()
    uuids = itertools.count(1000)

    @tool
    def read(path: str) -> str:
        """Read a file."""
        runs["read"] += 1
        if path.startswith("missing"):
            raise ToolException(f"File not found: {path}")
        return f"contents of {path}"

    read.handle_tool_error = True

    @tool
    def run(command: str) -> str:
        """Run a shell command."""
        runs["run"] += 1
        progress[command] += 1
        if command.startswith("grep -q"):  # no match: grep's answer, not a broken tool
            raise ToolException("Command failed with exit code 1")
        if command.startswith("tail"):  # a log that grows
            return f"line {progress[command]}"
        if command == "wait":  # a process that never ends, in fresh session ids and pids
            n = progress[command]
            return f"Command still running (session sess-{n}, pid {1000 + n})"
        if command == "date":  # the same answer in fresh ids and timings
            n = next(uuids)
            return f"request 3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d{n:04d} done in {n % 97} ms"
        if command.startswith("pytest"):
            return "FAILED test_a: expected 3, got 2"
        return f"$ {command}\nerror E1 at f.c:10"

    run.handle_tool_error = True

    @tool
    def edit(path: str, old: str, new: str) -> str:
        """Replace text in a file."""
        runs["edit"] += 1
        if old == "missing":
            raise ToolException("no match for old_string")
        return f"edited {path}"

    edit.handle_tool_error = True

    @tool
    def write(path: str, content: str) -> str:
        """Write a file."""
        runs["write"] += 1
        return "write complete"

    @tool
    def status(job: str) -> str:
        """Poll a job."""
        runs["status"] += 1
        progress[job] += 1
        return f"{job}: {progress[job] * 5}% done"

    @tool
    def lookup(query: str, fields: list[str] | None = None) -> str:
        """Look a course up (broken: it fails the same way whatever it is asked)."""
        runs["lookup"] += 1
        raise ToolException("'str' object has no attribute 'get'")

    lookup.handle_tool_error = True

    @tool
    def search(query: str) -> str:
        """Search the code base."""
        runs["search"] += 1
        return "No results found."

    @tool
    def fetch(issue: int) -> str:
        """Fetch an issue."""
        runs["fetch"] += 1
        raise ToolException("404 Not Found")

    fetch.handle_tool_error = True

    @tool
    def send(to: str, text: str) -> str:
        """Send a message."""
        runs["send"] += 1
        n = next(uuids)
        receipt = {"platformMessageId": f"{n * 7919}"}
        return json.dumps(
            {"ok": True, "to": to, "messageId": f"m{n:08x}{n:08x}", "receipt": receipt}
            | {"runId": f"3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d{n:04d}", "timestamp": 1764466033000 + n}
        )

    @tool
    def upload_file(path: str) -> str:
        """Upload a file."""
        runs["upload_file"] += 1
        n = next(uuids)
        return json.dumps({"ok": True, "path": path, "fileId": f"file_{n:012x}{n * 7919:012x}"})

    @tool
    def plugin_send(to: str, text: str) -> str:
        """Send a message through a plugin, which answers the message's id alone."""
        runs["plugin_send"] += 1
        n = next(uuids)
        return f"msg_{n:08x}{n * 7919:012x}"

    @tool
    def get_plan(plan_id: str) -> str:
        """Look a plan up."""
        runs["get_plan"] += 1
        raise ToolException(f"Plan {plan_id} not found")

    get_plan.handle_tool_error = True

    return [
        read,
        run,
        edit,
        write,
        status,
        lookup,
        search,
        fetch,
        send,
        upload_file,
        plugin_send,
        get_plan,
    ]


def call(tool_name: str, **args: Any) -> tuple[str, dict[str, Any]]:
    return tool_name, args


@dataclass(frozen=True)
class Scenario:
    """A catalogue entry: its turns, and what the guard must do (checked by `expect`)."""

    key: str
    turns: list[Turn]
    expect: Callable[[list[tuple[int, str, str | None]]], object]
    options: dict[str, Any] = field(default_factory=dict)
    requests: tuple[int, ...] = ()  # turns per user message; all in one by default
    asked_again: bool = False  # every user message the same; else each one new

    def question(self, request: int) -> str:
        """The user message that begins the scenario's `request`-th request."""
        return "request" if self.asked_again else f"request {request}"


def events_are(*expected: tuple[int, str, str | None]) -> Callable[[Any], None]:
    """Exactly these (tool call index, kind, reason) events."""

    def check(events: list[tuple[int, str, str | None]]) -> None:
        assert events == list(expected)

    return check


def never_blocked(*, steers: int = 0) -> Callable[[Any], None]:
    """No block and no stop; at most `steers` steers."""

    def check(events: list[tuple[int, str, str | None]]) -> None:
        assert [e for e in events if e[1] != "steer"] == []
        assert len(events) <= steers, events

    return check


def steered_and_stopped(
    steer_by: int, block_by: int, stop_by: int | None = None
) -> Callable[[Any], None]:
    """A steer no later than call `steer_by`, a block no later than `block_by`, then a stop
    (no later than `stop_by`, when given)."""

    def check(events: list[tuple[int, str, str | None]]) -> None:
        kinds = [kind for _, kind, _ in events]
        assert "steer" in kinds, events
        assert "block" in kinds, events
        assert kinds[-1] == "stop", events
        assert next(i for i, kind, _ in events if kind == "steer") <= steer_by, events
        assert next(i for i, kind, _ in events if kind == "block") <= block_by, events
        assert stop_by is None or events[-1][0] <= stop_by, events

    return check


def _repeat(turn: Turn, times: int) -> list[Turn]:
    return [turn] * times


MISSING = call("read", path="missing.md")


def stop_ladder(steer_at: int, first_block: int, reason: str) -> Callable[[Any], None]:
    """Exactly the ladder: a steer, three blocks in a row, and the stop at the third."""
    blocks = [(first_block + n, "block", reason) for n in range(3)]
    stop = (first_block + 2, "stop", "abort_threshold")
    return events_are((steer_at, "steer", reason), *blocks, stop)


PI_STOP = stop_ladder(3, 5, "repeat")
"""The Pi ladder with the defaults: steer at 3, block 5-7, stop after the 3rd block."""
PING, PONG = call("read", path="/a.txt"), call("run", command="ls /workspace")

SCENARIOS = [
    # A. identical-call streaks
    Scenario(
        "A1 identical call, same result",
        _repeat([call("run", command="grep foo")], 30),
        steered_and_stopped(steer_by=3, block_by=5),
    ),
    Scenario(
        "A2 identical failing call, same error",
        _repeat([MISSING], 18),
        PI_STOP,
    ),
    Scenario(
        "A4 volatile result, by default: a near-repeat",
        _repeat([call("run", command="date")], 12),
        steered_and_stopped(steer_by=5, block_by=7),
    ),
    Scenario(
        "A5 a process still running, in fresh session ids and pids",
        _repeat([call("run", command="wait")], 12),
        steered_and_stopped(steer_by=5, block_by=7),
    ),
    Scenario(
        "A16 the same message sent again, fresh ids in every reply",
        _repeat([call("send", to="ops", text="deploy done")], 21),
        steered_and_stopped(steer_by=5, block_by=7),
    ),
    Scenario(
        "A18 the same file uploaded again, a new file id in every reply",
        _repeat([call("upload_file", path="report.pdf")], 21),
        steered_and_stopped(steer_by=5, block_by=7),
    ),
    Scenario(
        "A19 the same message sent through a plugin that answers a bare id",
        _repeat([call("plugin_send", to="ops", text="deploy done")], 21),
        steered_and_stopped(steer_by=5, block_by=7),
    ),
    Scenario(
        "A20 a blocked send stays blocked after another call",
        [
            *_repeat([call("send", to="ops", text="deploy done")], 7),
            [call("read", path="a.py")],
            *_repeat([call("send", to="ops", text="deploy done")], 3),
        ],
        events_are(
            (5, "steer", "repeat"),
            (7, "block", "repeat"),
            (9, "block", "returned"),
            (10, "block", "returned"),
            (10, "stop", "abort_threshold"),
        ),
    ),
    Scenario(
        "A17 the same call once per user turn, the same message",
        _repeat([call("read", path="a.py")], 4),
        events_are((3, "steer", "interleaved"), (4, "steer", "interleaved")),
        requests=(1, 1, 1, 1),
        asked_again=True,
    ),
    Scenario(
        "A17 the same call once per user turn, another call between",
        [
            [call("read", path="a.py")],
            [PONG],
            [call("read", path="a.py")],
            [call("read", path="a.py")],
        ],
        events_are((4, "steer", "interleaved")),
        requests=(1, 2, 1),
        asked_again=True,
    ),
    Scenario(
        "A4 volatile result, normalised (opt-in)",
        _repeat([call("run", command="date")], 12),
        steered_and_stopped(steer_by=3, block_by=5),
        {"volatile_results": True},
    ),
    Scenario(
        "A10 identical parallel siblings",
        _repeat([MISSING, MISSING, MISSING], 6),
        steered_and_stopped(steer_by=9, block_by=15),
    ),
    Scenario(
        "A15 whole batch repeated",
        _repeat([call("read", path="a.py"), PONG], 8),
        steered_and_stopped(steer_by=6, block_by=10),
    ),
    # B. alternation and cycles
    Scenario(
        "B1 ping-pong, stable results",
        [[PING], [PONG]] * 10,
        stop_ladder(6, 9, "cycle"),
    ),
    Scenario(
        "B2 ping-pong, progressing results",
        [[call("status", job="a")], [call("run", command="tail log")]] * 10,
        never_blocked(),
    ),
    Scenario(
        "B3 broken alternation",
        [
            [PING],
            [PONG],
            [PING],
            [PONG],
            [call("write", path="o", content="x")],
            [PING],
            [PONG],
            [PING],
            [PONG],
        ],
        never_blocked(steers=2),
    ),
    Scenario(
        "B4 edit/build cycle, zero net change",
        [[call("edit", path="f.c", old="missing", new="y")], [call("run", command="make")]] * 6,
        steered_and_stopped(steer_by=6, block_by=10),
    ),
    Scenario(
        "B5 edit/test with real edits, same red test",
        [
            t
            for n in range(8)
            for t in (
                [call("edit", path="f.c", old="a", new=f"v{n}")],
                [call("run", command="pytest -x")],
            )
        ],
        never_blocked(steers=1),
    ),
    Scenario(
        "B6 rotation over three files",
        [[call("read", path=p)] for p in "abc"] * 5,
        steered_and_stopped(steer_by=9, block_by=13),
    ),
    Scenario(
        "B7 rotation over five calls, stable results",
        [[call("read", path=p)] for p in "abcde"] * 20,
        steered_and_stopped(steer_by=15, block_by=25),
    ),
    Scenario(
        "B7 rotation over six calls, stable results",
        [[c] for _ in range(17) for c in (*(call("read", path=p) for p in "abcde"), PONG)],
        steered_and_stopped(steer_by=18, block_by=30),
    ),
    # C. interleaved and non-consecutive repetition
    Scenario(
        "C2 dominant call between distinct reads",
        [t for n in range(4) for t in ([MISSING], [call("read", path=f"doc{n}.md")])][:-1],
        events_are((5, "steer", "interleaved")),
    ),
    Scenario(
        "C9 the same edit submitted again, the same answer, reads between",
        [
            t
            for n in range(3)
            for t in ([call("edit", path="a.py", old="x", new="y")], [call("read", path=f"f{n}")])
        ][:-1],
        events_are((5, "steer", "interleaved")),
    ),
    Scenario(
        "C5 unknown tool, varying args",
        [[call("exec", command=f"cmd{n}")] for n in range(12)],
        stop_ladder(3, 5, "unknown_tool"),
    ),
    Scenario(
        "C1 runaway read between diagnostics",
        [
            *_repeat([MISSING], 3),
            [call("run", command="find . -name ROADMAP.md")],
            *_repeat([MISSING], 3),
            [call("run", command="ls -la missing.md")],
            *_repeat([MISSING], 3),
        ],
        steered_and_stopped(steer_by=3, block_by=8),
    ),
    Scenario(
        "C7 failing read between distinct diagnostics",
        [
            t
            for n in range(20)
            for t in ([MISSING], [call("run", command=f"grep -rn roadmap-{n} .")])
        ],
        # Steered at the 3rd read; the steer's backstop refuses the 10th: 9 reads run.
        steered_and_stopped(steer_by=5, block_by=19, stop_by=23),
    ),
    Scenario(
        "C6 broken tool, any args, irregular order",
        [
            [call("lookup", query=query)]
            for query in ("Machine Learning", "ML", "ML", "C1005", "ML", "Machine Learning") * 5
        ],
        stop_ladder(4, 6, "same_error"),
    ),
    Scenario(
        "C6 one more field per retry, same error",
        [[call("lookup", query="ML", fields=[f"f{k}" for k in range(n)])] for n in range(19)],
        stop_ladder(4, 6, "same_error"),
    ),
    Scenario(
        "C6 enumeration meeting the same error",
        [[call("fetch", issue=n)] for n in range(1, 5)],
        events_are((4, "steer", "same_error")),
    ),
    # D. must not trigger
    Scenario(
        "D1 polling with progress", _repeat([call("status", job="build")], 25), never_blocked()
    ),
    Scenario(
        "D3 fan-out over distinct targets, equal results",
        [[call("write", path=f"/tmp/file-{n}.md", content="same")] for n in range(30)],
        never_blocked(),
    ),
    Scenario(
        "D4 two-pass batch",
        [[call("write", path=f"batch-{n % 15}", content="x")] for n in range(30)],
        never_blocked(),
    ),
    Scenario(
        "D5 re-run after fix",
        [
            [call("read", path="missing-repro.py")],
            [call("edit", path="repro.py", old="a", new="b")],
            [call("read", path="repro.py")],
        ],
        never_blocked(),
    ),
    Scenario(
        "D7 same file, different ranges",
        [[call("read", path=f"p.c:{n * 100}")] for n in range(6)],
        never_blocked(),
    ),
    Scenario(
        "D8 sequential different reads",
        [
            [call("run", command="ls")],
            [call("read", path="f1")],
            [call("run", command="pwd")],
            [call("read", path="f2")],
            [call("run", command="pwd")],
            [call("read", path="f2")],
        ],
        never_blocked(),
    ),
    Scenario(
        "D10 write then verify",
        [
            t
            for n in range(5)
            for t in ([call("write", path="f", content=f"v{n}")], [call("status", job="f")])
        ],
        never_blocked(),
    ),
    Scenario(
        "D11 a new user message resets",
        _repeat([call("run", command="ls")], 6),
        events_are((3, "steer", "repeat")),
        requests=(4, 2),
    ),
    Scenario(
        "D18 different searches, the same empty answer",
        [[call("search", query=f"handler {n}")] for n in range(10)],
        never_blocked(),
    ),
    Scenario(
        "D19 different missing files, errors naming each: steered once at most",
        [[call("read", path=f"missing-{n}.md")] for n in range(10)],
        never_blocked(steers=1),
    ),
    Scenario(
        "C8 the same error naming each argument",
        [[call("get_plan", plan_id=f"P{1006 + n}")] for n in range(10)],
        events_are((4, "steer", "same_error")),
    ),
    Scenario(
        "D21 a sweep of shell checks that each exit 1: steered once at most",
        [[call("run", command=f"grep -q pattern{n} src/")] for n in range(12)],
        never_blocked(steers=1),
    ),
    Scenario(
        "D22 a check re-run after each different change",
        [
            t
            for n in range(6)
            for t in (
                [call("write", path=f"f{n}.c", content="fix")],
                [call("read", path="x.c")],
                [call("run", command="pytest -x")],
            )
        ],
        never_blocked(),
    ),
    Scenario(
        "D20 three variants failing alike",
        [[call("lookup", query=q)] for q in ("ML", "Machine Learning", "C1005")],
        never_blocked(),
    ),
    Scenario(
        "D23 the same lookup for each new question",
        _repeat([call("read", path="a.py")], 4),
        events_are(),
        requests=(1, 1, 1, 1),
    ),
    Scenario(
        "D14 many durable mutations",
        [[call("write", path=f"req-{n}", content="t")] for n in range(10)],
        never_blocked(),
    ),
    # E. bookkeeping
    Scenario(
        "E1 blocked calls count toward the stop",
        _repeat([MISSING], 10),
        PI_STOP,
    ),
    Scenario(
        "E5 a mixed batch does not terminate",
        [
            *_repeat([MISSING], 4),
            *_repeat([MISSING, call("read", path="x")], 1),
            [call("read", path="y.md")],
        ],
        events_are((3, "steer", "repeat"), (6, "block", "repeat")),
        {"use_terminate": True},
    ),
    Scenario(
        "E9 steered once per streak", _repeat([MISSING], 4), events_are((3, "steer", "repeat"))
    ),
]


def split(turns: list[Turn], requests: tuple[int, ...]) -> list[list[Turn]]:
    sizes = itertools.accumulate(requests or (len(turns),), initial=0)
    return [turns[start:end] for start, end in itertools.pairwise(sizes)]


class Recorder:
    """Numbers tool calls as the model issues them, and each event by the call it is at."""

    def __init__(self) -> None:
        self.issued = 0
        self.events: list[tuple[int, str, str | None]] = []

    def script(self, turns: list[Turn]) -> Script:
        inner = sequence(*turns)

        def script(messages: Sequence[BaseMessage], index: int) -> AIMessage:
            message = inner(messages, index)
            self.issued += len(message.tool_calls)
            return message

        return script

    def on_event(self, event: GuardEvent) -> None:
        self.events.append((self.issued, event.kind, event.reason))


def via_middleware(
    scenario: Scenario,
    recorder: Recorder,
    runs: Counter[str],
    config: LoopGuardConfig | None = None,
    *,
    sync: bool = True,
) -> list[Any]:
    """Run a scenario through `create_agent` with the middleware (`ainvoke` unless
    `sync`); the final messages."""
    middleware = LoopGuardMiddleware(config, on_event=recorder.on_event, **scenario.options)
    checkpointer = InMemorySaver()
    messages: list[Any] = []
    for n, part in enumerate(split(scenario.turns, scenario.requests)):
        model = ScriptedChatModel(script=recorder.script(part))
        agent = create_agent(
            model, toolbox(runs), middleware=[middleware], checkpointer=checkpointer
        )
        payload = {"messages": [HumanMessage(scenario.question(n))]}
        if sync:
            messages = agent.invoke(payload, THREAD)["messages"]
        else:
            messages = asyncio.run(agent.ainvoke(payload, THREAD))["messages"]
    return messages
