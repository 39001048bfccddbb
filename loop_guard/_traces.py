"""Readers of agent traces: LangSmith run exports, OTLP JSON files and Phoenix projects.

Each trace becomes a conversation of the shape a checkpoint gives (`_readers.Conversation`):
the user's request, then each model response (from the model runs or spans, with its tool
calls and token usage) and each tool result (from the tool runs or spans, errors included),
in the order they ran. Traces that carry one thread id (LangSmith's `thread_id`,
`session_id` or `conversation_id` metadata; OpenInference's `session.id`; the GenAI
conventions' `gen_ai.conversation.id`) are one conversation, a request each.

Records may come in any order and a trace's may be far apart, so each reader first spools
what it needs of every record into a temporary SQLite file, then reads it back a
conversation at a time: memory stays flat in the size of the export.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage

from loop_guard._readers import Conversation, ScanError, call_arguments, parse_json

LANGSMITH, OTLP, PHOENIX = "LangSmith runs", "OTLP JSON spans", "Phoenix project"
"""The kinds of trace source, as the report names them."""

_THREAD_KEYS = ("thread_id", "session_id", "conversation_id")  # LangSmith's thread metadata
_ERROR_DETAIL = "Traceback (most recent call last)"  # LangChain's tracers append it to errors


_FIRST_LINE = 1 << 24  # what is read of a file to tell whether it is a trace export


def trace_kind(path: Path) -> str | None:
    """The kind of trace export a file is, from its first line (`None`: not one)."""
    try:
        with path.open("rb") as handle:
            line = handle.readline(_FIRST_LINE).strip()
        record = json.loads(line) if line.startswith(b"{") else None
    except (OSError, ValueError, RecursionError):
        return None  # the conversation files' reader says what is wrong
    if not isinstance(record, dict):
        return None
    if "resourceSpans" in record or "resource_spans" in record:
        return OTLP
    return LANGSMITH if "run_type" in record and "trace_id" in record else None


def read_traces(path: Path, kind: str) -> Iterator[Conversation | ScanError]:
    """The conversations of a LangSmith runs export or an OTLP JSON file; a line that is
    not JSON, or not a run or an export request, is an error of its own."""
    parse = _langsmith_steps if kind == LANGSMITH else _otlp_steps
    with _spool() as spool:
        try:
            with path.open("rb") as handle:
                for number, line in enumerate(handle, start=1):
                    if line.strip():
                        error = _spool_line(spool, parse, line, number)
                        if error is not None:
                            yield error
        except OSError as error:
            raise ScanError(error.strerror or str(error)) from error
        yield from spool.conversations(path.name)


def _spool_line(
    spool: _Spool, parse: Callable[[Any], Iterator[_Row]], line: bytes, number: int
) -> ScanError | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        return ScanError(f"line {number} is not JSON: {reason}", part="line")
    try:
        spool.add(list(parse(record)))  # all of a line, or none of it
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        what = "a LangSmith run" if parse is _langsmith_steps else "an OTLP export request"
        reason = f"line {number} is not {what}: {type(error).__name__}: {error}"
        return ScanError(reason, part="line")
    return None


# --- the spool: steps by trace, read back a conversation at a time -----------------------------

_Row = tuple[str, str | None, str, list[Any]]
"""(trace id, thread id or None, order within the trace, step)."""


class _Spool:
    """Steps of every trace in a temporary SQLite file, read back grouped by conversation."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        db.executescript(
            "CREATE TABLE steps (trace TEXT, ord TEXT, step TEXT);"
            "CREATE TABLE threads (trace TEXT PRIMARY KEY, thread TEXT);"
        )

    def add(self, rows: Iterable[_Row]) -> None:
        for trace, thread, order, step in rows:
            self.db.execute("INSERT INTO steps VALUES (?, ?, ?)", (trace, order, json.dumps(step)))
            if thread is not None:
                self.db.execute("INSERT OR IGNORE INTO threads VALUES (?, ?)", (trace, thread))

    def conversations(self, source: str) -> Iterator[Conversation]:
        """Each thread (else trace) as a conversation named `source:thread`, its traces in
        the order they started, the steps of each in the order they ran."""
        self.db.execute("CREATE INDEX by_trace ON steps (trace, ord)")
        rows = self.db.execute(
            "SELECT COALESCE(th.thread, s.trace) AS conv, s.trace, s.step FROM steps s "
            "LEFT JOIN threads th ON th.trace = s.trace "
            "JOIN (SELECT trace, MIN(ord) AS start FROM steps GROUP BY trace) t "
            "ON t.trace = s.trace ORDER BY conv, t.start, s.trace, s.ord"
        )
        name: str | None = None  # the conversation being gathered
        traces: list[tuple[str, list[list[Any]]]] = []  # its traces' steps
        for conv, trace, step in rows:
            if conv != name:
                if name is not None:
                    yield Conversation(f"{source}:{name}", _messages(traces))
                name, traces = conv, []
            if not traces or traces[-1][0] != trace:
                traces.append((trace, []))
            traces[-1][1].append(json.loads(step))
        if name is not None:
            yield Conversation(f"{source}:{name}", _messages(traces))


@contextmanager
def _spool() -> Iterator[_Spool]:
    handle, path = tempfile.mkstemp(prefix="loop-guard-", suffix=".sqlite")
    os.close(handle)
    try:
        with closing(sqlite3.connect(path)) as db:
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            yield _Spool(db)
    finally:
        os.unlink(path)


# --- steps to messages ------------------------------------------------------------------------

# A step is a JSON list: ["user", text], ["model", content, [[id, name, args], ...], usage, agent]
# or ["tool", name, args, call id, result, error].


def _messages(traces: list[tuple[str, list[list[Any]]]]) -> list[BaseMessage]:
    """A conversation's messages from its traces' steps: the request each trace starts with
    (its first user step), each response, and each tool result answering the call it names
    (by id, else the first unanswered call of that tool); a tool run no response asked for
    is a call of its own."""
    messages: list[BaseMessage] = []
    for trace, steps in traces:
        user = next((step[1] for step in steps if step[0] == "user"), None)
        if user is not None:
            messages.append(HumanMessage(content=user))
        pending: list[tuple[str | None, str, str]] = []  # (recorded id, tool, id given)
        for number, step in enumerate(steps):
            if step[0] == "model":
                _, content, recorded, usage, agent = step
                given = [f"{trace}-{number}-{n}" for n in range(len(recorded))]
                calls = [
                    _call(name, args, i) for (_, name, args), i in zip(recorded, given, strict=True)
                ]
                pending.extend((r[0], r[1], i) for r, i in zip(recorded, given, strict=True))
                messages.append(
                    AIMessage(content=content, tool_calls=calls, usage_metadata=usage, name=agent)
                )
            elif step[0] == "tool":
                _, name, args, recorded_id, result, error = step
                call_id = _answered(pending, name, recorded_id)
                if call_id is None:  # a tool run with no recorded response asking for it
                    call_id = f"{trace}-{number}"
                    messages.append(AIMessage(content="", tool_calls=[_call(name, args, call_id)]))
                status = "error" if error else "success"
                messages.append(
                    ToolMessage(content=result, tool_call_id=call_id, status=status, name=name)
                )
    return messages


def _call(name: str, args: dict[str, Any], call_id: str) -> ToolCall:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def _answered(
    pending: list[tuple[str | None, str, str]], name: str, recorded_id: str | None
) -> str | None:
    """The id of the unanswered call a tool result answers, taken off `pending`."""
    match = [c for c in pending if recorded_id and c[0] == recorded_id] or [
        c for c in pending if c[1] == name
    ]
    if not match:
        return None
    pending.remove(match[0])
    return match[0][2]


def _text(value: Any) -> str:
    """Content as the scan compares it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _usage(inputs: Any, outputs: Any) -> dict[str, int] | None:
    if not isinstance(inputs, int) or not isinstance(outputs, int):
        return None
    return {"input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs}


def _agent_of(metadata: Any) -> str | None:
    """The agent a model call belongs to in a graph of agents: the graph node that holds
    the model's node (`langgraph_checkpoint_ns` "alice:…|model:…"); `None` for one agent."""
    if not isinstance(metadata, Mapping):
        return None
    namespace = metadata.get("langgraph_checkpoint_ns") or metadata.get("checkpoint_ns")
    if not isinstance(namespace, str) or "|" not in namespace:
        return None
    return namespace.split("|")[-2].split(":")[0] or None


# --- LangSmith runs ---------------------------------------------------------------------------


def _langsmith_steps(run: Mapping[str, Any]) -> Iterator[_Row]:
    """The steps of one LangSmith run (`langsmith.schemas.Run`, as `Client.list_runs` gives
    it): a root run's user request, a model run's response, a tool run's result."""
    trace, order = str(run["trace_id"]), str(run.get("dotted_order") or run["start_time"])
    extra = run.get("extra") or {}
    metadata = {**(extra.get("metadata") or {}), **(run.get("metadata") or {})}
    thread = next((str(metadata[k]) for k in _THREAD_KEYS if metadata.get(k)), None)
    kind, inputs, outputs = run["run_type"], run.get("inputs") or {}, run.get("outputs") or {}
    if run.get("parent_run_id") is None:
        yield trace, thread, order, ["user", _last_request(inputs.get("messages"))]
    elif kind == "llm":
        yield from _langsmith_model(trace, thread, order, run, metadata)
    elif kind == "tool":
        error = run.get("error")
        if error:
            result: Any = str(error).split(_ERROR_DETAIL)[0].strip()
        else:
            output = outputs.get("output", outputs)
            message = _tool_message(output)
            result = message.get("content", output) if message else output
            error = message.get("status") == "error"
        call_id = extra.get("tool_call_id")
        args = call_arguments(inputs.get("input", inputs) if set(inputs) == {"input"} else inputs)
        yield trace, thread, order, ["tool", run["name"], args, call_id, _text(result), bool(error)]


def _langsmith_model(
    trace: str, thread: str | None, order: str, run: Mapping[str, Any], metadata: Mapping[str, Any]
) -> Iterator[_Row]:
    """A model run's response: the first generation's message."""
    generations = (run.get("outputs") or {}).get("generations") or [[]]
    first = generations[0][0] if generations and generations[0] else None
    message = _lc_fields(first.get("message")) if isinstance(first, Mapping) else {}
    if not message:
        return  # a model call that failed: no response in the conversation
    calls = [
        [call.get("id"), call["name"], call_arguments(call.get("args"))]
        for call in message.get("tool_calls") or []
    ]
    usage = message.get("usage_metadata")
    if usage is None and isinstance(run.get("prompt_tokens"), int):
        usage = _usage(run.get("prompt_tokens"), run.get("completion_tokens"))
    agent = message.get("name") or _agent_of(metadata)
    yield trace, thread, order, ["model", message.get("content", ""), calls, usage, agent]


def _lc_fields(value: Any) -> dict[str, Any]:
    """A serialized LangChain message's fields: `dumpd`'s form, `messages_to_dict`'s or
    `model_dump`'s."""
    if not isinstance(value, Mapping):
        return {}
    if value.get("lc") == 1 and isinstance(value.get("kwargs"), Mapping):
        return dict(value["kwargs"])
    if isinstance(value.get("data"), Mapping) and "content" in value["data"]:
        return dict(value["data"])
    return dict(value) if "content" in value else {}


def _tool_message(output: Any) -> dict[str, Any]:
    """The fields of the tool message a tool returned: itself, or the last tool message of
    the graph update it returned (`Command(update={"messages": [...]})`, as handoffs do)."""
    update = output.get("update") if isinstance(output, Mapping) else None
    if isinstance(update, Mapping) and isinstance(update.get("messages"), list):
        replies = [_lc_fields(m) for m in update["messages"]]
        return next((m for m in reversed(replies) if m.get("type") == "tool"), {})
    return _lc_fields(output)


def _last_request(messages: Any) -> str | None:
    """The text of the last user message of a graph's input (LangChain dicts, `dumpd`'s
    form, or chat-completions roles)."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        fields = _lc_fields(message) if isinstance(message, Mapping) else {}
        role = fields.get("type") or fields.get("role")
        if isinstance(message, Mapping) and message.get("lc") == 1:
            role = "human" if str(message.get("id", [""])[-1]) == "HumanMessage" else role
        if role in ("human", "user"):
            return _text(fields.get("content", ""))
    return None


# --- OpenTelemetry spans: OpenInference and GenAI attributes ----------------------------------


def _otlp_steps(request: Mapping[str, Any]) -> Iterator[_Row]:
    """The steps of one OTLP export request (`ExportTraceServiceRequest` as JSON)."""
    for resource in request.get("resourceSpans") or request.get("resource_spans") or []:
        for scope in resource.get("scopeSpans") or resource.get("scope_spans") or []:
            for span in scope.get("spans") or []:
                status = span.get("status") or {}
                failed = status.get("code") in (2, "STATUS_CODE_ERROR")
                attributes = span.get("attributes") or []
                yield from _span_steps(
                    _otlp_id(span["traceId"]),
                    f"{int(span.get('startTimeUnixNano') or 0):020d}",
                    not span.get("parentSpanId"),
                    {a["key"]: _otlp_value(a.get("value") or {}) for a in attributes},
                    (status.get("message") or "error") if failed else None,
                )


def _otlp_id(raw: str) -> str:
    """A trace id as hex: OTLP JSON writes hex; protobuf's own JSON writes base64."""
    if re.fullmatch(r"[0-9a-fA-F]{32}", raw):
        return raw.lower()
    try:
        return base64.b64decode(raw, validate=True).hex()
    except binascii.Error as error:
        msg = f"trace id {raw!r} is neither hex nor base64"
        raise ValueError(msg) from error


def _otlp_value(value: Mapping[str, Any]) -> Any:
    """An OTLP `AnyValue`."""
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [_otlp_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        pairs = value["kvlistValue"].get("values", [])
        return {kv["key"]: _otlp_value(kv.get("value") or {}) for kv in pairs}
    return None


def _span_steps(
    trace: str, order: str, root: bool, attributes: Mapping[str, Any], error: str | None
) -> Iterator[_Row]:
    """The steps of one span, by its OpenInference or GenAI attributes (flat keys)."""
    flat = {k[9:]: v for k, v in attributes.items() if k.startswith("metadata.")}  # Phoenix's
    metadata = _json_object(attributes.get("metadata")) or flat
    thread = attributes.get("session.id") or attributes.get("gen_ai.conversation.id")
    if thread is None:
        thread = next((metadata[k] for k in _THREAD_KEYS if metadata.get(k)), None)
    thread = None if thread is None else str(thread)
    kind = attributes.get("openinference.span.kind")
    operation = attributes.get("gen_ai.operation.name")
    if root:
        request = _last_request(_json_object(attributes.get("input.value")).get("messages"))
        yield trace, thread, order, ["user", request or _genai_request(attributes)]
    if kind == "LLM" or operation in ("chat", "text_completion", "generate_content"):
        step = _openinference_model(attributes) if kind == "LLM" else _genai_model(attributes)
        if step is not None:
            step.append(attributes.get("gen_ai.agent.name") or _agent_of(metadata))
            yield trace, thread, order, step
    elif kind == "TOOL" or operation == "execute_tool":
        name = attributes.get("tool.name") or attributes.get("gen_ai.tool.name") or "?"
        args = attributes.get("gen_ai.tool.call.arguments", attributes.get("input.value"))
        call_id = attributes.get("tool_call.id") or attributes.get("gen_ai.tool.call.id")
        result = attributes.get("gen_ai.tool.call.result", attributes.get("output.value"))
        fields = _tool_message(_json_object(result))
        if fields:  # LangChain's ToolMessage, as OpenInference records a tool's output
            result, call_id = fields.get("content", ""), call_id or fields.get("tool_call_id")
            error = error or ("error" if fields.get("status") == "error" else None)
        text = error if error is not None else _text("" if result is None else result)
        step = ["tool", name, call_arguments(args), call_id, text, error is not None]
        yield trace, thread, order, step


def _decoded(value: Any) -> Any:
    """An attribute as the value it holds: JSON text decoded (`None` when it is not JSON, or
    too deep to build), anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        return parse_json(value)
    except ValueError:
        return None


def _json_object(value: Any) -> dict[str, Any]:
    decoded = _decoded(value)
    return dict(decoded) if isinstance(decoded, Mapping) else {}


def _openinference_model(attributes: Mapping[str, Any]) -> list[Any] | None:
    prefix = "llm.output_messages.0.message."
    if prefix + "role" not in attributes and prefix + "content" not in attributes:
        return None  # a model call that failed, or recorded no output
    calls = []
    for n in range(len(attributes)):
        call = f"{prefix}tool_calls.{n}.tool_call."
        if call + "function.name" not in attributes:
            break
        calls.append([attributes.get(call + "id"), attributes[call + "function.name"],
                      call_arguments(attributes.get(call + "function.arguments"))])  # fmt: skip
    usage = _usage(attributes.get("llm.token_count.prompt"),
                   attributes.get("llm.token_count.completion"))  # fmt: skip
    return ["model", attributes.get(prefix + "content") or "", calls, usage]


def _genai_messages(raw: Any) -> list[Mapping[str, Any]]:
    decoded = _decoded(raw)
    return [m for m in decoded if isinstance(m, Mapping)] if isinstance(decoded, list) else []


def _genai_model(attributes: Mapping[str, Any]) -> list[Any] | None:
    """A model span of the OpenTelemetry GenAI conventions (`gen_ai.output.messages`)."""
    messages = _genai_messages(attributes.get("gen_ai.output.messages"))
    if not messages:
        return None
    parts = [p for p in messages[0].get("parts") or [] if isinstance(p, Mapping)]
    text = "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")
    calls = [[p.get("id"), p.get("name"), call_arguments(p.get("arguments"))]
             for p in parts if p.get("type") == "tool_call"]  # fmt: skip
    usage = _usage(attributes.get("gen_ai.usage.input_tokens"),
                   attributes.get("gen_ai.usage.output_tokens"))  # fmt: skip
    return ["model", text, calls, usage]


def _genai_request(attributes: Mapping[str, Any]) -> str | None:
    for message in reversed(_genai_messages(attributes.get("gen_ai.input.messages"))):
        if message.get("role") == "user":
            parts = message.get("parts") or []
            return "".join(str(p.get("content", "")) for p in parts if isinstance(p, Mapping))
    return None


# --- Phoenix ----------------------------------------------------------------------------------

PHOENIX_SCHEMES = ("phoenix://", "phoenixs://")
_PHOENIX_PAGE = 1000  # spans asked for at a time


def is_phoenix_url(source: str) -> bool:
    """Whether a command-line source names a Phoenix project (`phoenix://host:port/PROJECT`)."""
    return source.startswith(PHOENIX_SCHEMES)


def read_phoenix(url: str) -> Iterator[Conversation | ScanError]:
    """The conversations of a Phoenix project, read a page of spans at a time through
    `arize-phoenix-client` (`phoenixs://` for HTTPS; `PHOENIX_API_KEY` is sent when set)."""
    try:
        from phoenix.client import Client  # type: ignore[import-not-found, unused-ignore]
    except ImportError as error:
        msg = (
            f"reading a Phoenix project needs arize-phoenix-client ({error}): "
            'pip install "langchain-loop-guard[phoenix]"'
        )
        raise ScanError(msg) from error
    parts = urlsplit(url)
    project = parts.path.strip("/")
    if not parts.netloc or not project:
        msg = "a Phoenix source is phoenix://HOST:PORT/PROJECT"
        raise ScanError(msg)
    scheme = "https" if parts.scheme == "phoenixs" else "http"
    client = Client(
        base_url=f"{scheme}://{parts.netloc}", api_key=os.environ.get("PHOENIX_API_KEY")
    )
    with _spool() as spool:
        try:
            for span in _phoenix_spans(client, project):
                spool.add(_phoenix_steps(span))
        except ScanError:
            raise
        except Exception as error:  # the client's and the transport's errors alike
            msg = f"cannot read project {project!r}: {type(error).__name__}: {error}"
            raise ScanError(msg) from error
        yield from spool.conversations(project)


def _phoenix_spans(client: Any, project: str) -> Iterator[Mapping[str, Any]]:
    """Every span of a project, a page at a time: the endpoint `Client.spans.get_spans`
    pages through, on the client's own connection (`get_spans` gathers every page into one
    list, which memory would not hold for a large project)."""
    cursor = None
    while True:
        page = client._client.get(
            f"v1/projects/{project}/spans",
            params={"limit": _PHOENIX_PAGE, **({"cursor": cursor} if cursor else {})},
        )
        if page.status_code == 404:
            msg = f"no project {project!r} on this Phoenix server"
            raise ScanError(msg)
        page.raise_for_status()
        body = page.json()
        yield from body.get("data") or []
        cursor = body.get("next_cursor")
        if not cursor:
            return


def _phoenix_steps(span: Mapping[str, Any]) -> Iterator[_Row]:
    """The steps of a span as Phoenix's REST API gives it (`v1` spans: flat attributes)."""
    context = span.get("context") or {}
    attributes = dict(span.get("attributes") or {})
    attributes.setdefault("openinference.span.kind", span.get("span_kind"))
    failed = str(span.get("status_code", "")).upper() == "ERROR"
    yield from _span_steps(
        str(context["trace_id"]),
        str(span.get("start_time") or ""),
        not span.get("parent_id"),
        attributes,
        (span.get("status_message") or "error") if failed else None,
    )
