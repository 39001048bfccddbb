"""`loop-guard scan`: where the guard would have warned, blocked and stopped, offline.

Reads recorded conversations and replays them through the engine with the current
configuration. Formats: OpenAI chat-completions messages (a list, or an object with
`"messages"`), LangChain message dicts (`messages_to_dict`), JSON Lines of either (one
message per line, or one conversation per line), and LangGraph SQLite checkpoint
databases (one thread with `--thread`, else every thread).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    messages_from_dict,
)

from loop_guard._config import LoopGuardConfig
from loop_guard._engine import Engine
from loop_guard._guard import GuardEvent
from loop_guard._langchain import is_user_message, replay
from loop_guard._values import Call, Decision, Proceed

EXIT_CLEAN, EXIT_LOOP, EXIT_UNREADABLE = 0, 1, 2


class ScanError(Exception):
    """A file that cannot be read as a conversation; the message says why."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """A recorded conversation: where it came from and its messages."""

    name: str
    messages: Sequence[BaseMessage]


@dataclass(frozen=True, slots=True)
class Finding:
    """One decision the guard would have made, at a 1-based tool call index."""

    call_index: int
    event: GuardEvent


@dataclass(slots=True)
class Report:
    """What the guard would have done in one conversation."""

    name: str
    calls: int = 0
    findings: list[Finding] = field(default_factory=list)

    def first(self, *kinds: str) -> Finding | None:
        """The first finding of one of these kinds."""
        return next((f for f in self.findings if f.event.kind in kinds), None)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe summary with every finding."""
        warn, block = self.first("warn"), self.first("block")
        stop = self.first("abort", "terminate")
        return {
            "conversation": self.name,
            "calls": self.calls,
            "first_warn": None if warn is None else warn.call_index,
            "first_block": None if block is None else block.call_index,
            "stop": None if stop is None else {"call": stop.call_index, "kind": stop.event.kind},
            "findings": [
                {"call": f.call_index, **_without_conversation(dataclasses.asdict(f.event))}
                for f in self.findings
            ],
        }


def _without_conversation(event: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in event.items() if key != "conversation"}


def scan_conversation(config: LoopGuardConfig, conversation: Conversation) -> Report:
    """Replay each request of a conversation through a fresh engine state."""
    engine = Engine(config)
    report = Report(conversation.name)
    index_of: dict[str, int] = {}
    for message in conversation.messages:
        if isinstance(message, AIMessage):
            for tool_call in message.tool_calls:
                index_of[tool_call["id"] or ""] = len(index_of) + 1
    report.calls = len(index_of)

    def observe(call: Call, decisions: Sequence[Decision]) -> None:
        report.findings.extend(
            Finding(index_of.get(call.id, 0), GuardEvent.of(conversation.name, decision))
            for decision in decisions
            if not isinstance(decision, Proceed)
        )

    state = None  # the recent steps outlive each request
    for request in _requests(conversation.messages):
        state = replay(engine, None, request, observe, before=state)
    return report


def _requests(messages: Sequence[BaseMessage]) -> Iterator[Sequence[BaseMessage]]:
    """Split a conversation at each user message: every request starts fresh (SPEC §5)."""
    start = 0
    for index, message in enumerate(messages):
        if is_user_message(message) and index > start:
            yield messages[start:index]
            start = index
    yield messages[start:]


def load(path: Path, thread: str | None = None) -> list[Conversation]:
    """Read the conversations in a file; `ScanError` says why one cannot be read."""
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise ScanError(error.strerror or str(error)) from error
    if head.startswith(b"SQLite format 3"):
        return _load_checkpoints(path, thread)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScanError(f"not UTF-8 text: {error}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _json_lines(text)
    return _conversations(path.name, data)


def _json_lines(text: str) -> list[Any]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                msg = f"line {number} is not JSON: {error.msg}"
                raise ScanError(msg) from error
    if not rows:
        msg = "empty file"
        raise ScanError(msg)
    return rows


def _conversations(name: str, data: Any) -> list[Conversation]:
    if isinstance(data, Mapping) and "messages" in data:
        return [Conversation(name, _messages(data["messages"]))]
    if (
        isinstance(data, list)
        and data
        and all(isinstance(row, Mapping) and "messages" in row for row in data)
    ):
        return [
            Conversation(f"{name}#{n}", _messages(row["messages"]))
            for n, row in enumerate(data, start=1)
        ]
    if isinstance(data, list):
        return [Conversation(name, _messages(data))]
    msg = "expected a list of messages or an object with 'messages'"
    raise ScanError(msg)


def _messages(rows: Any) -> list[BaseMessage]:
    if not isinstance(rows, list) or not all(isinstance(row, Mapping) for row in rows):
        msg = "'messages' must be a list of message objects"
        raise ScanError(msg)
    if rows and all("type" in row and "data" in row for row in rows):
        try:
            return list(messages_from_dict(rows))
        except Exception as error:
            msg = f"not LangChain message dicts: {error}"
            raise ScanError(msg) from error
    return _from_openai(rows)


def _from_openai(rows: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """OpenAI chat messages to LangChain's, pairing results with calls by id or position.

    Every call gets a fresh id: some recorders reuse ids within a conversation.
    """
    messages: list[BaseMessage] = []
    pending: list[tuple[str, str]] = []  # (recorded id, fresh id) of unanswered calls
    for number, row in enumerate(rows, start=1):
        role, content = row.get("role"), row.get("content")
        text = (
            content
            if isinstance(content, (str, list))
            else ("" if content is None else str(content))
        )
        if role == "assistant":
            calls: list[ToolCall] = []
            for call in row.get("tool_calls") or ():
                function = call.get("function") or {}
                fresh = f"call-{number}-{len(calls)}"
                pending.append((str(call.get("id")), fresh))
                arguments = _arguments(function.get("arguments"))
                name = str(function.get("name"))
                calls.append({"name": name, "args": arguments, "id": fresh, "type": "tool_call"})
            messages.append(AIMessage(content=text, tool_calls=calls))
        elif role == "tool":
            match = [p for p in pending if p[0] == str(row.get("tool_call_id"))] or pending[:1]
            if not match:
                msg = f"message {number}: a tool result with no pending call"
                raise ScanError(msg)
            pending.remove(match[0])
            status = "error" if row.get("is_error") else "success"
            messages.append(ToolMessage(content=text, tool_call_id=match[0][1], status=status))
        elif role == "user":
            messages.append(HumanMessage(content=text))
        elif role in ("system", "developer"):
            messages.append(SystemMessage(content=text))
        else:
            msg = f"message {number}: unknown role {role!r}"
            raise ScanError(msg)
    return messages


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {"$unparsed": raw}  # still comparable: identical text, identical args
    return raw if raw is not None else {}


def _load_checkpoints(path: Path, thread: str | None) -> list[Conversation]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        saver = SqliteSaver(connection)
        threads = [thread] if thread else sorted(
            {str(c.config["configurable"]["thread_id"]) for c in saver.list(None)}
        )  # fmt: skip
        conversations = []
        for thread_id in threads:
            found = saver.get_tuple({"configurable": {"thread_id": thread_id}})
            if found is None:
                msg = f"no thread {thread_id!r} in this checkpoint database"
                raise ScanError(msg)
            messages = found.checkpoint["channel_values"].get("messages", [])
            conversations.append(Conversation(f"{path.name}:{thread_id}", list(messages)))
        return conversations
    except sqlite3.Error as error:
        msg = f"not a LangGraph checkpoint database: {error}"
        raise ScanError(msg) from error


def print_table(reports: Sequence[Report], out: TextIO) -> None:
    """One line per conversation, then the findings of those where the guard stepped in."""
    width = max([len(r.name) for r in reports] + [12])
    print(f"{'conversation':<{width}}  calls  steer  block  stop", file=out)
    for report in reports:
        warn, block = report.first("warn"), report.first("block")
        stop = report.first("abort", "terminate")
        cells = ["-" if found is None else str(found.call_index) for found in (warn, block)]
        stopped = "-" if stop is None else f"{stop.call_index} ({stop.event.kind})"
        print(f"{report.name:<{width}}  {report.calls:>5}  {cells[0]:>5}  {cells[1]:>5}  {stopped}",
              file=out)  # fmt: skip
    for report in reports:
        if report.findings:
            print(f"\n{report.name}", file=out)
        for f in report.findings:
            args = json.dumps(f.event.args, default=str)[:60]
            why = f"({f.event.reason})" if f.event.reason else ""
            print(f"  call {f.call_index:>4}  {f.event.kind:<9} {why:<14} {f.event.tool} {args}",
                  file=out)  # fmt: skip


def run_scan(
    paths: Sequence[Path],
    config: LoopGuardConfig,
    *,
    thread: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Scan files; 0 when the guard would not have stepped in, 1 when it would, 2 when a
    file could not be read (each such file is named with the reason)."""
    out, err = out or sys.stdout, err or sys.stderr
    reports: list[Report] = []
    unreadable = False
    progress = err.isatty() and len(paths) > 1
    for number, path in enumerate(paths, start=1):
        if progress:
            print(f"\rscanning {number}/{len(paths)}: {path.name[:50]:<50}", end="", file=err)
        try:
            conversations = load(path, thread)
        except ScanError as error:
            unreadable = True
            print(f"loop-guard scan: {path}: {error}", file=err)
            continue
        reports.extend(scan_conversation(config, c) for c in conversations)
    if progress:
        print("\r" + " " * 72 + "\r", end="", file=err)
    if as_json:
        json.dump([r.to_json() for r in reports], out, indent=2, default=str)
        print(file=out)
    elif reports:
        print_table(reports, out)
    if unreadable:
        return EXIT_UNREADABLE
    return EXIT_LOOP if any(r.findings for r in reports) else EXIT_CLEAN
