"""Readers of recorded conversations: conversation files and LangGraph checkpoint databases.

Formats: OpenAI chat-completions messages (a list, or an object with `"messages"`), LangChain
message dicts (`messages_to_dict`), JSON Lines of either (one message per line, or one
conversation per line), and the databases of LangGraph's SQLite and PostgreSQL checkpointers
(one thread, else every thread).

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

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol


class ScanError(Exception):
    """A file that cannot be read as a conversation; the message says why."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """A recorded conversation: where it came from and its messages."""

    name: str
    messages: Sequence[BaseMessage]


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


def read(source: Path | str, thread: str | None) -> list[Conversation | ScanError]:
    """The conversations of a source, and an error for each thread that cannot be read;
    raises `ScanError` when nothing can be read."""
    return list(stream(source, [thread] if thread else None))


def stream(
    source: Path | str, threads: Sequence[str] | None = None
) -> Iterator[Conversation | ScanError]:
    """`read`, one conversation at a time: a checkpoint database's threads are read as they
    are needed (`threads`, else every thread), so memory stays flat however many it holds."""
    database = _database_of(source)
    if database is not None:
        yield from _read_checkpoints(database, threads)
        return
    yield from _read_file(Path(source))


def thread_pages(source: Path | str, size: int) -> Iterator[list[str]]:
    """A checkpoint database's thread ids, `size` at a time, in order; a file has none
    (`[]`: read it whole)."""
    database = _database_of(source)
    if database is None:
        return
    with database() as opened:
        yield from _pages(opened, size)


def _database_of(source: Path | str) -> Callable[[], AbstractContextManager[_Database]] | None:
    """What opens `source` when it is a checkpoint database (`None`: a file)."""
    if isinstance(source, str) and is_postgres_url(source):
        url = source
        return lambda: _postgres(url)
    path = Path(source)
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
        data = json.loads(text)
    except json.JSONDecodeError:
        return _json_lines(path.name, text)
    found: list[Conversation | ScanError] = [*_conversations(path.name, data)]
    return found


def _json_lines(name: str, text: str) -> list[Conversation | ScanError]:
    """A JSON Lines file: one conversation per line (an object with `messages`), or one
    message per line. A line that is not JSON loses only its own conversation, when
    lines are conversations; when they are messages, it changes the one conversation
    they make, which is then not read."""
    rows: list[tuple[int, Any]] = []
    broken: list[tuple[int, ScanError]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                broken.append((number, ScanError(f"line {number} is not JSON: {error.msg}")))
    if not rows and not broken:
        msg = "empty file"
        raise ScanError(msg)
    if not rows or not all(isinstance(row, Mapping) and "messages" in row for _, row in rows):
        if broken:
            raise broken[0][1]
        return [*_conversations(name, [row for _, row in rows])]
    found: list[Conversation | ScanError] = [error for _, error in broken]
    found.extend(
        Conversation(f"{name}#{number}", _messages(row["messages"])) for number, row in rows
    )
    return found


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
        return [str(row[0]) for row in connection.execute(_THREADS.format("?"), (after, limit))]

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


def _read_checkpoints(
    open_database: Callable[[], AbstractContextManager[_Database]],
    threads: Sequence[str] | None,
) -> Iterator[Conversation | ScanError]:
    """Each thread of a checkpointer as a conversation: the messages of its latest checkpoint.

    A thread that cannot be read is an error of its own; the others are still read.
    """
    with open_database() as database:
        try:
            for thread_id in _each_thread(database, threads):
                yield _read_thread(database, thread_id)
        except database.errors as error:
            detail = " ".join(str(error).split())
            msg = f"not a LangGraph checkpoint database: {detail}"
            raise ScanError(msg) from error


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
        return ScanError(f"thread {thread_id!r} cannot be read: {type(error).__name__}: {error}")
    if found is None:
        return ScanError(f"no thread {thread_id!r} in this checkpoint database")
    messages = found.checkpoint.get("channel_values", {}).get("messages", [])
    if not isinstance(messages, list):
        return ScanError(f"thread {thread_id!r}: its 'messages' are not a list")
    # Values the serializer would not restore stay inert data, and are left out.
    kept = [message for message in messages if isinstance(message, BaseMessage)]
    return Conversation(f"{database.name}:{thread_id}", kept)
