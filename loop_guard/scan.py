"""`loop-guard scan`: where the guard would have warned, blocked and stopped, offline.

Reads recorded conversations and replays them through the engine with the current
configuration. Formats: OpenAI chat-completions messages (a list, or an object with
`"messages"`), LangChain message dicts (`messages_to_dict`), JSON Lines of either (one
message per line, or one conversation per line), and the databases of LangGraph's SQLite
and PostgreSQL checkpointers (one thread with `--thread`, else every thread).

A checkpoint database may come from elsewhere: it is read with LangGraph's serializer
restricted to the types it was built to restore (messages, datetimes, UUIDs and the like),
so its data can never make the scan import a module, call a function or unpickle an object.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

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
from loop_guard._history import is_user_message, replay
from loop_guard._langchain import keys_of
from loop_guard._values import Call, Decision, Proceed

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol

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
    # Every response gets an id: its calls are keyed by it, as a live graph keys them, so
    # tool-call ids a provider reused never merge two calls.
    messages = [
        message.model_copy(update={"id": f"response-{n}"})
        if isinstance(message, AIMessage) and not message.id
        else message
        for n, message in enumerate(conversation.messages)
    ]
    index_of: dict[str, int] = {}
    for message in messages:
        if isinstance(message, AIMessage):
            for key in keys_of(message):
                index_of[key] = len(index_of) + 1
    report.calls = len(index_of)

    def observe(call: Call, decisions: Sequence[Decision]) -> None:
        report.findings.extend(
            Finding(index_of.get(call.key, 0), GuardEvent.of(conversation.name, decision))
            for decision in decisions
            if not isinstance(decision, Proceed)
        )

    state = None  # the recent steps outlive each request
    for request in _requests(messages):
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


def load(source: Path | str, thread: str | None = None) -> list[Conversation]:
    """Read the conversations in a file or database; `ScanError` says why one cannot be read.

    `source` is a path, or a PostgreSQL URL (`postgresql://user@host:5432/db`) of a LangGraph
    checkpointer. A checkpoint database gives one conversation per thread (`thread`, else
    every thread).
    """
    conversations = []
    for item in _read(source, thread):
        if isinstance(item, ScanError):
            raise item
        conversations.append(item)
    return conversations


def _read(source: Path | str, thread: str | None) -> list[Conversation | ScanError]:
    """The conversations of a source, and an error for each thread that cannot be read;
    raises `ScanError` when nothing can be read."""
    if isinstance(source, str) and is_postgres_url(source):
        return _read_checkpoints(_postgres, source, thread)
    path = Path(source)
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise ScanError(error.strerror or str(error)) from error
    if head.startswith(b"SQLite format 3"):
        return _read_checkpoints(_sqlite, path, thread)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScanError(f"not UTF-8 text: {error}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _json_lines(text)
    found: list[Conversation | ScanError] = [*_conversations(path.name, data)]
    return found


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
        elif role == "user":  # its name tells the guard's own steer from a user's request
            author = row.get("name")
            author = author if isinstance(author, str) else None
            messages.append(HumanMessage(content=text, name=author))
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


# --- LangGraph checkpoint databases -----------------------------------------------------------

CHECKPOINT_FLOOR = (4, 1, 1)
"""The oldest `langgraph-checkpoint` the readers trust: it never unpickles by default (4.0.0),
restricts the objects msgpack data may construct when asked to (4.0.1), and no longer calls a
method named in lc:2 JSON data (4.1.1)."""

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(source: str) -> bool:
    """Whether a command-line source names a PostgreSQL database rather than a file."""
    return source.startswith(_POSTGRES_SCHEMES)


def display_name(source: Path | str) -> str:
    """A source as printed: a PostgreSQL URL without its password.

    Example:
        >>> display_name("postgresql://ops:s3cret@db.internal:5432/agents?password=s3cret")
        'postgresql://ops:***@db.internal:5432/agents?password=***'
    """
    if isinstance(source, str) and is_postgres_url(source):
        source = re.sub(r"^(\w+://[^:/@?#]*):[^@/?#]*@", r"\1:***@", source)
        return re.sub(r"([?&]password=)[^&#]*", r"\1***", source)
    return str(source)


@dataclass(frozen=True, slots=True)
class _Database:
    """An open checkpoint database: its saver, its threads and the errors its driver raises."""

    name: str
    saver: BaseCheckpointSaver[Any]
    threads: Callable[[], list[str]]
    errors: tuple[type[Exception], ...]


_THREADS = "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' ORDER BY thread_id"


def _missing(what: str, package: str, extra: str, error: ImportError) -> ScanError:
    return ScanError(
        f'reading {what} needs {package} ({error}): pip install "langchain-loop-guard[{extra}]"'
    )


def _safe_serializer(extra: str) -> SerializerProtocol:
    """LangGraph's serializer, refusing every object it was not built to restore.

    Its defaults would import and call whatever a msgpack checkpoint names (GHSA-g48c-2wqr-h844
    leaves that opt-in): a database from elsewhere must never run code here.
    """
    try:
        version = metadata.version("langgraph-checkpoint")
    except metadata.PackageNotFoundError:
        version = "0"
    if _release(version) < CHECKPOINT_FLOOR:
        floor = ".".join(map(str, CHECKPOINT_FLOOR))
        msg = (
            f"langgraph-checkpoint {version} may run code stored in a checkpoint; reading one "
            f"needs langgraph-checkpoint>={floor}: "
            f'pip install --upgrade "langchain-loop-guard[{extra}]"'
        )
        raise ScanError(msg)
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    return JsonPlusSerializer(
        pickle_fallback=False, allowed_json_modules=None, allowed_msgpack_modules=None
    )


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


@contextmanager
def _sqlite(path: Path) -> Iterator[_Database]:
    """A LangGraph SQLite checkpoint database, opened read-only."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError as error:
        what = "a LangGraph SQLite checkpoint database"
        raise _missing(what, "langgraph-checkpoint-sqlite", "sqlite", error) from error
    serde = _safe_serializer("sqlite")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as error:
        raise ScanError(f"cannot open: {error}") from error

    def threads() -> list[str]:
        return [str(row[0]) for row in connection.execute(_THREADS)]

    try:
        yield _Database(path.name, SqliteSaver(connection, serde=serde), threads, (sqlite3.Error,))
    finally:
        connection.close()


@contextmanager
def _postgres(url: str) -> Iterator[_Database]:
    """A LangGraph PostgreSQL checkpointer's database, in read-only transactions."""
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
        from psycopg.rows import dict_row
    except ImportError as error:
        what = "a LangGraph PostgreSQL checkpointer"
        package = "langgraph-checkpoint-postgres and psycopg"
        raise _missing(what, package, "postgres", error) from error
    serde = _safe_serializer("postgres")
    try:
        if "connect_timeout" not in conninfo_to_dict(url):  # fail in seconds, not minutes
            url = make_conninfo(url, connect_timeout=10)
        connection = psycopg.connect(
            url, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        connection.execute("SET default_transaction_read_only = on")  # never write
    except psycopg.Error as error:
        detail = " ".join(str(error).split())
        raise ScanError(f"cannot connect: {detail}") from error

    def threads() -> list[str]:
        return [str(row["thread_id"]) for row in connection.execute(_THREADS)]

    try:
        saver = PostgresSaver(connection, serde=serde)
        yield _Database(connection.info.dbname, saver, threads, (psycopg.Error,))
    finally:
        connection.close()


_Source = TypeVar("_Source", Path, str)


def _read_checkpoints(
    open_database: Callable[[_Source], AbstractContextManager[_Database]],
    source: _Source,
    thread: str | None,
) -> list[Conversation | ScanError]:
    """Each thread of a checkpointer as a conversation: the messages of its latest checkpoint.

    A thread that cannot be read is an error of its own; the others are still read.
    """
    results: list[Conversation | ScanError] = []
    with open_database(source) as database:
        try:
            threads = [thread] if thread else sorted(database.threads())
            for thread_id in threads:
                results.append(_read_thread(database, thread_id))
        except database.errors as error:
            detail = " ".join(str(error).split())
            msg = f"not a LangGraph checkpoint database: {detail}"
            raise ScanError(msg) from error
    return results


def _read_thread(database: _Database, thread_id: str) -> Conversation | ScanError:
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    try:
        found = database.saver.get_tuple(config)
    except database.errors:
        raise  # the database itself: not one thread's problem
    except Exception as error:  # data the safe serializer refuses, or does not know
        return ScanError(f"thread {thread_id!r} cannot be read: {type(error).__name__}: {error}")
    if found is None:
        return ScanError(f"no thread {thread_id!r} in this checkpoint database")
    messages = found.checkpoint.get("channel_values", {}).get("messages", [])
    if not isinstance(messages, list):
        return ScanError(f"thread {thread_id!r}: its 'messages' are not a list")
    # Values the serializer refused to restore stay inert data, and are left out.
    kept = [message for message in messages if isinstance(message, BaseMessage)]
    return Conversation(f"{database.name}:{thread_id}", kept)


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
    paths: Sequence[Path | str],
    config: LoopGuardConfig,
    *,
    thread: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Scan files and databases (paths, or PostgreSQL URLs); 0 when the guard would not have
    stepped in, 1 when it would, 2 when a file or a thread could not be read (each is named
    with the reason)."""
    out, err = out or sys.stdout, err or sys.stderr
    reports: list[Report] = []
    unreadable = False
    progress = err.isatty() and len(paths) > 1
    for number, source in enumerate(paths, start=1):
        name = display_name(source)
        if progress:
            short = name if is_postgres_url(name) else Path(name).name
            print(f"\rscanning {number}/{len(paths)}: {short[:50]:<50}", end="", file=err)
        try:
            items = _read(source, thread)
        except ScanError as error:
            items = [error]
        for item in items:
            if isinstance(item, ScanError):
                unreadable = True
                print(f"loop-guard scan: {name}: {item}", file=err)
            else:
                reports.append(scan_conversation(config, item))
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
