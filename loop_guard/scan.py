"""`loop-guard scan`: where the guard would have steered, blocked and stopped, offline.

Replays recorded conversations (conversation files and LangGraph checkpoint databases, read
by `loop_guard._readers`; traces, by `loop_guard._traces`) through the engine with the current
configuration, and prints what the guard would have done, as a table or as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from loop_guard._compaction import compacted, tokens_kept_out
from loop_guard._config import LoopGuardConfig
from loop_guard._engine import Engine
from loop_guard._events import GuardEvent, event_kinds
from loop_guard._history import is_user_message, replay
from loop_guard._langchain import calls_of, earlier_runs, keys_of, tokens_of
from loop_guard._messages import GUARD_NAME, REPLY
from loop_guard._readers import (
    CHECKPOINT_FLOOR,
    Conversation,
    Reading,
    ScanError,
    display_name,
    is_postgres_url,
    load,
    malformed,
    read,
)
from loop_guard._values import NO_COST, Call, Charge, Decision, LoopCost, Proceed, Stop
from loop_guard._window import Window

__all__ = [
    "CHECKPOINT_FLOOR",
    "EXIT_CLEAN",
    "EXIT_LOOP",
    "EXIT_PARTLY_UNREADABLE",
    "EXIT_UNREADABLE",
    "Conversation",
    "Finding",
    "Report",
    "ScanError",
    "display_name",
    "exit_status",
    "is_postgres_url",
    "load",
    "print_table",
    "run_scan",
    "scan_conversation",
    "scan_each",
]

EXIT_CLEAN, EXIT_LOOP, EXIT_UNREADABLE, EXIT_PARTLY_UNREADABLE = 0, 1, 2, 4
"""The exit status of a scan and of a report adds them up (`exit_status`): 1, the guard would
have stepped in (the scan's only); 2, a source could not be read; 4, parts of a source (threads,
lines) could not be read and the rest was. 5 is a loop found and a thread not read."""


def exit_status(looped: bool, readings: Iterable[Reading]) -> int:
    """The exit status of a scan or a report, from whether it found a loop and what it read
    of each source.

    Examples:
        >>> clean, partly = Reading(conversations=3), Reading(conversations=2, parts_unreadable=1)
        >>> exit_status(True, [clean, partly])
        5
    """
    readings = list(readings)
    return (
        (EXIT_LOOP if looped else EXIT_CLEAN)
        + (EXIT_UNREADABLE if any(r.unreadable for r in readings) else 0)
        + (EXIT_PARTLY_UNREADABLE if any(r.partly_unreadable for r in readings) else 0)
    )


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision the guard would have made, at a 1-based tool call index.

    `agent`: the agent that made the call (the name its model response carries, as
    `create_agent(..., name=...)` sets it; `None` when the response has none). `agents`:
    when the loop the decision is part of holds the calls of more than one agent, their
    names, sorted (a loop between agents); else empty.
    """

    call_index: int
    event: GuardEvent
    agent: str | None = None
    agents: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe finding: the agent fields only when there are agents."""
        found = {"call": self.call_index, **_without_conversation(dataclasses.asdict(self.event))}
        if self.agent is not None:
            found["agent"] = self.agent
        if self.agents:
            found["agents"] = list(self.agents)
        return found


@dataclass(slots=True)
class Report:
    """What the guard would have done in one conversation, and what its loops cost
    (`LoopCost`: what the guard would have saved is measured on the recording).

    `tokens_reported`: whether the model reported its token usage (`usage_metadata`) on any
    reply; when it did not, the cost's tokens are unknown, not zero. `callers`: the agent
    that made each call, in order (see `Finding.agent`); empty when no response names one.
    """

    name: str
    calls: int = 0
    callers: list[str | None] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    cost: LoopCost = NO_COST
    tokens_reported: bool = False

    def first(self, *kinds: str) -> Finding | None:
        """The first finding of one of these kinds (`GuardEvent.kind`)."""
        wanted = event_kinds(kinds)
        return next((f for f in self.findings if f.event.kind in wanted), None)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe summary with every finding."""
        steer, block, stop = self.first("steer"), self.first("block"), self.first("stop")
        stopped = None if stop is None else {"call": stop.call_index, "reason": stop.event.reason}
        return {
            "conversation": self.name,
            "calls": self.calls,
            "first_steer": None if steer is None else steer.call_index,
            "first_block": None if block is None else block.call_index,
            "stop": stopped,
            "cost": cost_json(self.cost, tokens_reported=self.tokens_reported),
            "findings": [finding.to_json() for finding in self.findings],
        }

    def between_agents(self) -> list[tuple[str, ...]]:
        """The agents of the loops between agents, each set once, in the order they came."""
        loops: list[tuple[str, ...]] = []
        for finding in self.findings:
            if finding.agents and finding.agents not in loops:
                loops.append(finding.agents)
        return loops


def cost_json(cost: LoopCost, *, tokens_reported: bool) -> dict[str, int | None]:
    """A cost, JSON-safe: its tokens `None` when the model reported none.

    Examples:
        >>> cost_json(LoopCost(model_calls=2), tokens_reported=False)["tokens"] is None
        True
    """
    counts: dict[str, int | None] = {**dataclasses.asdict(cost)}
    if not tokens_reported:
        counts.update(tokens=None, tokens_saved=None, tokens_kept_out=None)
    return counts


def _without_conversation(event: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in event.items() if key != "conversation"}


def scan_conversation(config: LoopGuardConfig, conversation: Conversation) -> Report:
    """Replay each request of a conversation through a fresh engine state."""
    engine = Engine(config)
    report = Report(conversation.name)
    report.tokens_reported = any(
        isinstance(message, AIMessage) and message.usage_metadata is not None
        for message in conversation.messages
    )
    # Every response gets an id: its calls are keyed by it, as a live graph keys them, so
    # tool-call ids a provider reused never merge two calls.
    messages = [
        message.model_copy(update={"id": f"response-{n}"})
        if isinstance(message, AIMessage) and not message.id
        else message
        for n, message in enumerate(conversation.messages)
    ]
    # Each call by its number and its agent; a reply that repeated its text by the calls
    # before it.
    index_of: dict[str, int] = {}
    agent_of: dict[str, str | None] = {}
    for message in messages:
        if isinstance(message, AIMessage):
            index_of[f"{REPLY}#{message.id}"] = len(report.callers)
            agent_of[f"{REPLY}#{message.id}"] = message.name
            for key in keys_of(message):
                report.callers.append(message.name)
                index_of[key] = len(report.callers)
                agent_of[key] = message.name
    report.calls = len(report.callers)
    if not any(report.callers):
        report.callers.clear()

    stopped_by: list[str] = []  # the key of the call whose batch stopped the request
    decided: list[Call] = []  # the calls the request's findings are about

    def observe(call: Call, decisions: Sequence[Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, Charge):
                report.cost += decision.cost
            elif not isinstance(decision, Proceed):
                if isinstance(decision, Stop):
                    stopped_by.append(call.key)
                decided.append(call)
                event = GuardEvent.of(conversation.name, decision)
                found = Finding(index_of.get(call.key, 0), event, agent_of.get(call.key))
                report.findings.append(found)

    state = None  # the recent steps outlive each request
    earlier = earlier_runs(messages, engine.config.normalizers)
    for request in _requests(messages):
        stopped_by.clear()
        decided.clear()
        first = len(report.findings)
        state = replay(
            engine, None, request, observe, before=state, earlier=earlier, unmarked_handoffs=True
        )
        if stopped_by:
            report.cost += _after_stop(request, stopped_by[0])
        agents = _loop_agents(request, decided, report.findings[first:])
        if len(agents) > 1:
            report.findings[first:] = [
                dataclasses.replace(found, agents=agents) for found in report.findings[first:]
            ]
    report.cost += _kept_out(messages)
    return report


def _kept_out(messages: Sequence[BaseMessage]) -> LoopCost:
    """What compaction (`compact_repeats`) would keep out of the recorded model calls'
    inputs: each model call was sent the messages before its response, which compaction
    sends in the same form at every call, so each message's saving counts once per model
    call after it. Tokens at the rate of each call's reported input tokens."""
    sent = compacted(messages)
    chars = tokens = 0
    input_chars = kept = 0  # of the messages before, as recorded; kept out of them
    for message, size, kept_out in zip(messages, sent.sizes, sent.kept_out, strict=True):
        if isinstance(message, AIMessage) and message.name != GUARD_NAME:
            chars += kept
            tokens += tokens_kept_out(kept, input_chars, tokens_of(message, "input_tokens"))
        input_chars += size + kept_out
        kept += kept_out
    return LoopCost(chars_kept_out=chars, tokens_kept_out=tokens)


def _loop_agents(
    request: Sequence[BaseMessage], decided: Sequence[Call], findings: Sequence[Finding]
) -> tuple[str, ...]:
    """The agents of the loop the guard found in a request, sorted: those of its findings,
    and those that made the calls from the first call like one the guard decided on (where
    the repeating began) to the last call it decided on."""
    if not findings:
        return ()
    agents = {finding.agent for finding in findings}
    steps = [
        (call, message.name)
        for message in request
        if isinstance(message, AIMessage)
        for call in calls_of(message)
    ]
    keys = {call.key for call in decided}
    start = next((n for n, (call, _) in enumerate(steps) if call in decided), None)
    end = max((n for n, (call, _) in enumerate(steps) if call.key in keys), default=None)
    if start is not None and end is not None:
        agents.update(agent for _, agent in steps[start : end + 1])
    return tuple(sorted(agent for agent in agents if agent is not None))


def scan_each(
    config: LoopGuardConfig, items: Iterable[Conversation | ScanError]
) -> Iterator[tuple[Conversation, Report] | ScanError]:
    """Each conversation read with its scan, and each error: those read, and a conversation
    whose messages are not valid messages (a damaged checkpoint's). The scan failing on valid
    messages is a bug, and raised."""
    for item in items:
        if isinstance(item, ScanError):
            yield item
            continue
        try:
            yield item, scan_conversation(config, item)
        except Exception:
            error = malformed(item)
            if error is None:
                raise
            yield error


def _after_stop(request: Sequence[BaseMessage], key: str) -> LoopCost:
    """What a recorded request spent after the response the guard would have stopped it
    at: the model calls, their tokens and the tool runs a stop saves."""
    model_calls = tokens = tool_runs = 0
    seen = False  # the stopping response (whose blocked calls the replay charged)
    for message in request:
        if message.name == GUARD_NAME:  # the guard's own words: no model call of the run
            continue
        if isinstance(message, AIMessage):
            if seen:
                model_calls += 1
                tokens += tokens_of(message)
            seen = seen or key in keys_of(message)
        elif model_calls and isinstance(message, ToolMessage):
            tool_runs += 1
    return LoopCost(tool_runs_saved=tool_runs, model_calls_saved=model_calls, tokens_saved=tokens)


def _requests(messages: Sequence[BaseMessage]) -> Iterator[Sequence[BaseMessage]]:
    """Split a conversation at each user message: every request starts fresh.

    See How the guard decides: reset.
    """
    start = 0
    for index, message in enumerate(messages):
        if is_user_message(message) and index > start:
            yield messages[start:index]
            start = index
    yield messages[start:]


def print_table(reports: Sequence[Report], out: TextIO) -> None:
    """One line per conversation, then the findings of those where the guard stepped in."""
    width = max([len(r.name) for r in reports] + [12])
    print(f"{'conversation':<{width}}  calls  steer  block  stop", file=out)
    for report in reports:
        steer, block, stop = report.first("steer"), report.first("block"), report.first("stop")
        cells = ["-" if found is None else str(found.call_index) for found in (steer, block)]
        stopped = "-" if stop is None else f"{stop.call_index} ({stop.event.reason})"
        print(f"{report.name:<{width}}  {report.calls:>5}  {cells[0]:>5}  {cells[1]:>5}  {stopped}",
              file=out)  # fmt: skip
    print(
        "\nsteer, block, stop: the number of the tool call (from 1) at which the guard would\n"
        'first have steered, blocked and stopped; "-": never.',
        file=out,
    )
    cost = sum((report.cost for report in reports), NO_COST)
    if cost:
        print(f"\n{describe_cost(cost)}", file=out)
        reported = sum(report.tokens_reported for report in reports)
        if reported < len(reports):
            print(f"tokens: {_tokens_reported(reported, len(reports), 'conversations')}", file=out)
    for report in reports:
        if report.findings:
            between = "".join(f"  loop between {', '.join(a)}" for a in report.between_agents())
            print(f"\n{report.name}{between}", file=out)
        for f in report.findings:
            args = json.dumps(f.event.args, default=str)[:60]
            why = f"({f.event.reason})" if f.event.reason else ""
            by = "" if f.agent is None else f"  by {f.agent}"
            print(f"  call {f.call_index:>4}  {f.event.kind:<5} {why:<17} {f.event.tool} {args}"
                  f"{by}", file=out)  # fmt: skip


def describe_cost(cost: LoopCost) -> str:
    """What loops cost and what the guard saved, in two lines (see `LoopCost`); a third
    says what compaction would keep out of the model's context, when it would.

    Examples:
        >>> print(describe_cost(LoopCost(model_calls=4, tool_runs=3, tool_runs_saved=1)))
        spent in loops: 4 model calls, 3 tool runs
        saved by the guard: 1 tool run
        >>> print(describe_cost(LoopCost(chars_kept_out=12_000, tokens_kept_out=3_000)))
        spent in loops: nothing
        saved by the guard: nothing
        compact_repeats would keep out of the context: 12,000 characters, 3,000 tokens
    """
    spent = _counted(("model call", cost.model_calls), ("tool run", cost.tool_runs),
                     ("token", cost.tokens))  # fmt: skip
    saved = _counted(("model call", cost.model_calls_saved), ("tool run", cost.tool_runs_saved),
                     ("token", cost.tokens_saved))  # fmt: skip
    described = f"spent in loops: {spent or 'nothing'}\nsaved by the guard: {saved or 'nothing'}"
    kept_out = _counted(("character", cost.chars_kept_out), ("token", cost.tokens_kept_out))
    if kept_out:
        described += f"\ncompact_repeats would keep out of the context: {kept_out}"
    return described


def _tokens_reported(reported: int, scanned: int, noun: str) -> str:
    """Whose tokens a total counts: the model reported usage in none, some or all of them.

    Examples:
        >>> _tokens_reported(3, 4, "threads")
        'reported by the model in 3 of 4 threads'
    """
    if not reported:
        return "not reported by the model"
    return f"reported by the model in {reported:,} of {scanned:,} {noun}"


def _counted(*counts: tuple[str, int]) -> str:
    return ", ".join(f"{n:,} {noun}{'' if n == 1 else 's'}" for noun, n in counts if n)


def run_scan(
    paths: Sequence[Path | str],
    config: LoopGuardConfig,
    *,
    thread: str | None = None,
    as_json: bool = False,
    window: Window | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Scan files and databases (paths, or PostgreSQL URLs); the exit status (`exit_status`):
    0 when the guard would not have stepped in, 1 when it would, plus 2 when a source could
    not be read, plus 4 when parts of one could not be (each is named with the reason).
    `window`: only the threads last changed in it."""
    out, err = out or sys.stdout, err or sys.stderr
    reports: list[Report] = []
    readings: list[Reading] = []
    progress = err.isatty() and len(paths) > 1
    for number, source in enumerate(paths, start=1):
        name = display_name(source)
        if progress:
            short = name if is_postgres_url(name) else Path(name).name
            print(f"\rscanning {number}/{len(paths)}: {short[:50]:<50}", end="", file=err)
        reading = Reading()
        for scanned in scan_each(config, read(source, thread, window)):
            if isinstance(scanned, ScanError):
                reading.count(scanned)
                print(f"loop-guard scan: {name}: {scanned}", file=err)
            else:
                reading.count(scanned[0])
                reports.append(scanned[1])
        if (summary := reading.summary()) is not None:
            print(f"loop-guard scan: {name}: {summary}", file=err)
        readings.append(reading)
    if progress:
        print("\r" + " " * 72 + "\r", end="", file=err)
    if as_json:
        json.dump([r.to_json() for r in reports], out, indent=2, default=str)
        print(file=out)
    elif reports:
        print_table(reports, out)
    return exit_status(any(r.findings for r in reports), readings)
