"""Readers of recorded conversations: conversation files and LangGraph checkpoint databases.

Formats: OpenAI chat-completions messages (a list, or an object with `"messages"`), LangChain
message dicts (`messages_to_dict`), JSON Lines of either (one message per line, or one
conversation per line), and the databases of LangGraph's SQLite and PostgreSQL checkpointers
(one thread, else every thread). Traces (LangSmith runs, OTLP JSON, Phoenix projects) are read
by `loop_guard._traces` into the same conversations.

A checkpoint database may come from elsewhere: it is read with LangGraph's serializer
restricted to the types it was built to restore (messages, datetimes, UUIDs and the like),
so its data can never make the scan import a module, call a function or unpickle an object.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    messages_from_dict,
)
from pydantic import ValidationError

from loop_guard._window import Window

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol


class ScanError(Exception):
    """What cannot be read, and why (the message).

    Either a whole source (a file, a database), or, with `part`, one part of a source whose
    other parts are read: a database's thread, a line of JSON Lines, a conversation of a
    list (`part` names which kind).
    """

    def __init__(self, reason: str, *, part: str | None = None) -> None:
        super().__init__(" ".join(reason.split()))  # one line, whatever a driver said
        self.part = part


@dataclass(frozen=True, slots=True)
class Conversation:
    """A recorded conversation: where it came from, its messages, and when it last changed
    (a checkpoint database's thread: its latest checkpoint's time; a file records none)."""

    name: str
    messages: Sequence[BaseMessage]
    updated: datetime | None = None


@dataclass(slots=True)
class Reading:
    """What was read of one source: its conversations, and its parts that could not be read
    (`ScanError.part`), or that the source itself could not be.

    Examples:
        >>> reading = Reading()
        >>> for item in [Conversation("a", []), ScanError("line 2 is not JSON", part="line")]:
        ...     reading.count(item)
        >>> reading.partly_unreadable, reading.summary()
        (True, '1 of 2 lines could not be read; the rest are reported')
    """

    conversations: int = 0
    parts_unreadable: int = 0
    part: str = "part"
    source_unreadable: bool = False

    def count(self, item: Conversation | ScanError) -> None:
        """Count one conversation read, or one error."""
        if isinstance(item, Conversation):
            self.conversations += 1
        elif item.part is None:
            self.source_unreadable = True
        else:
            self.parts_unreadable += 1
            self.part = item.part

    def add(self, other: Reading) -> None:
        """Add what was read of other parts of the same source."""
        self.conversations += other.conversations
        self.parts_unreadable += other.parts_unreadable
        self.part = other.part if other.parts_unreadable else self.part
        self.source_unreadable = self.source_unreadable or other.source_unreadable

    @property
    def unreadable(self) -> bool:
        """Nothing could be read: the source, or every one of its parts."""
        return self.source_unreadable or (self.parts_unreadable > 0 and not self.conversations)

    @property
    def partly_unreadable(self) -> bool:
        """Some parts could not be read, and the others were."""
        return self.parts_unreadable > 0 and not self.unreadable

    def summary(self) -> str | None:
        """How many parts could not be read, when some were and others were not."""
        if not self.partly_unreadable:
            return None
        total = self.parts_unreadable + self.conversations
        read = f"{self.parts_unreadable:,} of {total:,} {self.part}s could not be read"
        return f"{read}; the rest are reported"


def load(source: Path | str, thread: str | None = None) -> list[Conversation]:
    """Read the conversations in a file or database; `ScanError` says why one cannot be read.

    `source` is a path, or a PostgreSQL URL (`postgresql://user@host:5432/db`) of a LangGraph
    checkpointer. A checkpoint database gives one conversation per thread (`thread`, else
    every thread).
    """
    conversations = []
    for item in read(source, thread):
        if isinstance(item, ScanError):
            raise item
        conversations.append(item)
    return conversations


def read(
    source: Path | str, thread: str | None, window: Window | None = None
) -> list[Conversation | ScanError]:
    """The conversations of a source (in `window`, when given), and an error for each part
    that cannot be read; an error for the source itself comes last (after what was read
    before it failed)."""
    return list(stream(source, [thread] if thread else None, window))


def stream(
    source: Path | str, threads: Sequence[str] | None = None, window: Window | None = None
) -> Iterator[Conversation | ScanError]:
    """`read`, one conversation at a time: a checkpoint database's threads are read as they
    are needed (`threads`, else every thread), so memory stays flat however many it holds.

    With a `window`, only the threads last changed in it; a conversation file records no
    times, so it is rejected (`ScanError`) rather than read whole.
    """
    from loop_guard import _traces

    try:
        if isinstance(source, str) and _traces.is_phoenix_url(source):
            _no_window(window, "a Phoenix project is not read by time")
            yield from _traces.read_phoenix(source)
            return
        database = _database_of(source)
        if database is not None:
            for item in _read_checkpoints(database, threads):
                if window and isinstance(item, Conversation):
                    if item.updated is None:
                        item = ScanError(f"{item.name}: its latest checkpoint has no time ('ts')")
                    elif not window.contains(item.updated):
                        continue
                yield item
            return
        kind = _traces.trace_kind(Path(source))
        what = (
            "a conversation file records no times"
            if kind is None
            else f"{kind} are not read by time"
        )
        _no_window(window, what)
        if kind is not None:
            yield from _traces.read_traces(Path(source), kind)
            return
        yield from _read_file(Path(source))
    except ScanError as error:
        yield error


def _no_window(window: Window | None, why: str) -> None:
    """Reject a time window for a source whose conversations are not read by time."""
    if window:
        msg = f"{why}: --since and --until read only checkpoint databases (scan it without them)"
        raise ScanError(msg)


def source_kind(source: Path | str) -> str:
    """What kind of source a scan reads, as the report names it.

    Examples:
        >>> source_kind("postgresql://reader@db/agents"), source_kind("phoenix://h:6006/p")
        ('LangGraph checkpoints (PostgreSQL)', 'Phoenix project')
    """
    from loop_guard import _traces

    if isinstance(source, str) and is_postgres_url(source):
        return "LangGraph checkpoints (PostgreSQL)"
    if isinstance(source, str) and _traces.is_phoenix_url(source):
        return _traces.PHOENIX
    path = Path(source)
    if path.is_dir():
        return "folder"
    try:
        if _database_of(path) is not None:
            return "LangGraph checkpoints (SQLite)"
    except ScanError:
        return "unreadable"
    return _traces.trace_kind(path) or "conversations"


def thread_pages(source: Path | str, size: int) -> Iterator[list[str]]:
    """A checkpoint database's thread ids, `size` at a time, in order; a file has none
    (`[]`: read it whole)."""
    from loop_guard._traces import is_phoenix_url

    database = None if is_phoenix_url(str(source)) else _database_of(source)
    if database is None:
        return
    with _checkpoints(database) as opened:
        yield from _pages(opened, size)


def _database_of(source: Path | str) -> Callable[[], AbstractContextManager[_Database]] | None:
    """What opens `source` when it is a checkpoint database (`None`: a file)."""
    if isinstance(source, str) and is_postgres_url(source):
        url = source
        return lambda: _postgres(url)
    path = Path(source)
    if path.is_dir():
        if any(found.is_file() for found in path.rglob("*")):
            msg = "a folder (`loop-guard scan` reads files; `loop-guard report`, folders)"
        else:
            msg = "a folder with no files in it"
        raise ScanError(msg)
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError as error:
        raise ScanError(error.strerror or str(error)) from error
    return (lambda: _sqlite(path)) if head.startswith(b"SQLite format 3") else None


def _read_file(path: Path) -> list[Conversation | ScanError]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScanError(f"not UTF-8 text: {error}") from error
    try:
        data = parse_json(text)
    except json.JSONDecodeError:
        return _json_lines(path.name, text)
    return _conversations(path.name, data)


def parse_json(text: str) -> Any:
    """`json.loads`, with JSON it will not build (nested too deep, a number of thousands of
    digits) as a decode error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise json.JSONDecodeError(reason, text, 0) from error


def _json_lines(name: str, text: str) -> list[Conversation | ScanError]:
    """A JSON Lines file: one conversation per line (an object with `messages`), or one
    message per line. A line that cannot be read loses only its own conversation, when
    lines are conversations; when they are messages, it changes the one conversation
    they make, which is then not read."""
    rows: list[tuple[int, Any]] = []
    broken: list[tuple[int, ScanError]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((number, parse_json(line)))
            except json.JSONDecodeError as error:
                reason = f"line {number} is not JSON: {error.msg}"
                broken.append((number, ScanError(reason, part="line")))
    if not rows and not broken:
        msg = "empty file"
        raise ScanError(msg)
    if not rows or not all(_is_conversation(row) for _, row in rows):
        if broken:
            raise ScanError(str(broken[0][1]))
        return _conversations(name, [row for _, row in rows])
    found = [*broken, *((number, _conversation(name, row, number, "line")) for number, row in rows)]
    return [item for _, item in sorted(found, key=lambda numbered: numbered[0])]


def _conversations(name: str, data: Any) -> list[Conversation | ScanError]:
    if _is_conversation(data):
        return [Conversation(name, _messages(data["messages"]))]
    if isinstance(data, list) and data and all(_is_conversation(row) for row in data):
        return [
            _conversation(name, row, number, "conversation")
            for number, row in enumerate(data, start=1)
        ]
    if isinstance(data, list):
        return [Conversation(name, _messages(data))]
    msg = "expected a list of messages or an object with 'messages'"
    raise ScanError(msg)


def _is_conversation(data: Any) -> bool:
    return isinstance(data, Mapping) and "messages" in data


def _conversation(
    name: str, row: Mapping[str, Any], number: int, part: str
) -> Conversation | ScanError:
    """The conversation numbered `number` of a source that holds several (its lines, or the
    items of its list); an error of its own when it cannot be read."""
    try:
        return Conversation(f"{name}#{number}", _messages(row["messages"]))
    except ScanError as error:
        return ScanError(f"{part} {number}: {error}", part=part)


def _messages(rows: Any) -> list[BaseMessage]:
    if not isinstance(rows, list) or not all(isinstance(row, Mapping) for row in rows):
        msg = "'messages' must be a list of message objects"
        raise ScanError(msg)
    if rows and all("type" in row and "data" in row for row in rows):
        try:
            return list(messages_from_dict(rows))
        except Exception as error:
            msg = f"not LangChain message dicts: {_reason(error)}"
            raise ScanError(msg) from error
    return _from_openai(rows)


def _from_openai(rows: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """OpenAI chat messages to LangChain's, pairing results with calls by id or position.

    Every call gets a fresh id: some recorders reuse ids within a conversation.
    """
    messages: list[BaseMessage] = []
    pending: list[tuple[str, str]] = []  # (recorded id, fresh id) of unanswered calls
    for number, row in enumerate(rows, start=1):
        try:
            messages.append(_from_openai_message(row, number, pending))
        except ValidationError as error:  # fields of the wrong types
            msg = f"message {number}: {_reason(error)}"
            raise ScanError(msg) from error
    return messages


def _reason(error: Exception) -> str:
    """Why data was rejected: a validation error's first few fields and what is wrong with
    each (without pydantic's links), any other error's message."""
    if not isinstance(error, ValidationError):
        return f"{type(error).__name__}: {error}"
    fields = [f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors()]
    more = f" (and {len(fields) - 3} more)" if len(fields) > 3 else ""
    return "; ".join(fields[:3]) + more


def _from_openai_message(
    row: Mapping[str, Any], number: int, pending: list[tuple[str, str]]
) -> BaseMessage:
    """One OpenAI chat message; `pending` holds the calls not yet answered."""
    role, content = row.get("role"), row.get("content")
    text = (
        content if isinstance(content, (str, list)) else ("" if content is None else str(content))
    )
    if role == "assistant":
        calls: list[ToolCall] = []
        recorded = row.get("tool_calls") or []
        if not isinstance(recorded, list) or not all(isinstance(c, Mapping) for c in recorded):
            msg = f"message {number}: 'tool_calls' must be a list of objects"
            raise ScanError(msg)
        for call in recorded:
            function = call.get("function") or {}
            if not isinstance(function, Mapping):
                msg = f"message {number}: a tool call's 'function' must be an object"
                raise ScanError(msg)
            fresh = f"call-{number}-{len(calls)}"
            pending.append((str(call.get("id")), fresh))
            arguments = call_arguments(function.get("arguments"))
            name = str(function.get("name"))
            calls.append({"name": name, "args": arguments, "id": fresh, "type": "tool_call"})
        author = row.get("name")  # the agent, in a recorded chat between agents
        return AIMessage(
            content=text, tool_calls=calls, name=author if isinstance(author, str) else None
        )
    if role == "tool":
        match = [p for p in pending if p[0] == str(row.get("tool_call_id"))] or pending[:1]
        if not match:
            msg = f"message {number}: a tool result with no pending call"
            raise ScanError(msg)
        pending.remove(match[0])
        status = "error" if row.get("is_error") else "success"
        return ToolMessage(content=text, tool_call_id=match[0][1], status=status)
    if role == "user":  # its name tells the guard's own steer from a user's request
        author = row.get("name")
        return HumanMessage(content=text, name=author if isinstance(author, str) else None)
    if role in ("system", "developer"):
        return SystemMessage(content=text)
    msg = f"message {number}: unknown role {role!r}"
    raise ScanError(msg)


def malformed(conversation: Conversation) -> ScanError | None:
    """The first message of a conversation that is not a valid message, as the error of its
    thread. Only a checkpoint's can be: the serializer builds a message whose stored fields
    do not validate without validating them (pydantic's `model_construct`)."""
    for number, message in enumerate(conversation.messages, start=1):
        try:
            type(message).model_validate(message.__dict__)
        except Exception as error:  # pydantic's, or what a message's own validators raise
            what = f"message {number} is not a valid {type(message).__name__}"
            return ScanError(f"{conversation.name}: {what}: {_reason(error)}", part="thread")
    return None


def call_arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments, as an object: anything else (text that is not a JSON object, a
    list) is kept whole under `$unparsed`, still comparable: identical text, identical args."""
    if raw is None:
        return {}
    parsed = raw
    if isinstance(raw, str):
        try:
            parsed = parse_json(raw)
        except json.JSONDecodeError:
            parsed = None
    return dict(parsed) if isinstance(parsed, Mapping) else {"$unparsed": raw}


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

    Examples:
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
    threads: Callable[[str, int], list[str]]  # (after, at most): the next thread ids, in order
    errors: tuple[type[Exception], ...]


# Keyset pages: a database of any size is listed a page at a time.
_THREADS = (
    "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' AND thread_id > {0} "
    "ORDER BY thread_id LIMIT {0}"
)
_PAGE = 1000  # thread ids listed at a time


def _missing(what: str, package: str, extra: str, error: ImportError) -> ScanError:
    return ScanError(
        f'reading {what} needs {package} ({error}): pip install "langchain-loop-guard[{extra}]"'
    )


def _safe_serializer(extra: str) -> SerializerProtocol:
    """LangGraph's serializer, rejecting every object it was not built to restore.

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

    def threads(after: str, limit: int) -> list[str]:
        try:
            return [str(row[0]) for row in connection.execute(_THREADS.format("?"), (after, limit))]
        except UnicodeDecodeError as error:  # a damaged file: its listing cannot go on
            msg = f"a thread id is not UTF-8 text: {error}"
            raise sqlite3.DataError(msg) from error

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

    def threads(after: str, limit: int) -> list[str]:
        rows = connection.execute(_THREADS.format("%s"), (after, limit))
        return [str(row["thread_id"]) for row in rows]

    try:
        saver = PostgresSaver(connection, serde=serde)
        yield _Database(connection.info.dbname, saver, threads, (psycopg.Error,))
    finally:
        connection.close()


@contextmanager
def _checkpoints(
    open_database: Callable[[], AbstractContextManager[_Database]],
) -> Iterator[_Database]:
    """An open checkpoint database whose driver's errors say it cannot be read as one."""
    with open_database() as database:
        try:
            yield database
        except database.errors as error:
            msg = f"not a LangGraph checkpoint database: {error}"
            raise ScanError(msg) from error


def _read_checkpoints(
    open_database: Callable[[], AbstractContextManager[_Database]],
    threads: Sequence[str] | None,
) -> Iterator[Conversation | ScanError]:
    """Each thread of a checkpointer as a conversation: the messages of its latest checkpoint.

    A thread that cannot be read is an error of its own; the others are still read.
    """
    with _checkpoints(open_database) as database:
        for thread_id in _each_thread(database, threads):
            yield _read_thread(database, thread_id)


def _each_thread(database: _Database, threads: Sequence[str] | None) -> Iterator[str]:
    if threads is not None:
        yield from threads
        return
    for page in _pages(database, _PAGE):
        yield from page


def _pages(database: _Database, size: int) -> Iterator[list[str]]:
    """The database's thread ids, `size` at a time, in order (keyset pages)."""
    after = ""
    while page := database.threads(after, size):
        yield page
        after = page[-1]


def _read_thread(database: _Database, thread_id: str) -> Conversation | ScanError:
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    try:
        found = database.saver.get_tuple(config)
    except database.errors:
        raise  # the database itself: not one thread's problem
    except Exception as error:  # data the safe serializer rejects, or does not know
        reason = f"thread {thread_id!r} cannot be read: {type(error).__name__}: {error}"
        return ScanError(reason, part="thread")
    if found is None:
        return ScanError(f"no thread {thread_id!r} in this checkpoint database")
    # A checkpoint is a mapping whose channel values hold the messages; a damaged row may
    # hold anything.
    checkpoint = found.checkpoint
    values = checkpoint.get("channel_values", {}) if isinstance(checkpoint, Mapping) else None
    messages = values.get("messages", []) if isinstance(values, Mapping) else None
    if not isinstance(messages, list):
        return ScanError(f"thread {thread_id!r} holds no list of messages", part="thread")
    # Values the serializer would not restore stay inert data, and are left out.
    kept = [message for message in messages if isinstance(message, BaseMessage)]
    return Conversation(f"{database.name}:{thread_id}", kept, _time_of(found.checkpoint.get("ts")))


def _time_of(ts: object) -> datetime | None:
    """A checkpoint's `ts` (ISO 8601, written by LangGraph in UTC), in UTC; `None` when it
    has none that reads as a time."""
    if not isinstance(ts, str):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return (
        when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)
    )
