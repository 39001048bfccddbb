"""Agent runs recorded at once as a LangGraph checkpoint and as traces: LangSmith runs (the
SDK's own `RunTree`s, exported as its `Run` schema) and OpenTelemetry spans (OpenInference's
LangChain instrumentation, written as OTLP JSON)."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import ToolException, tool
from langchain_core.tracers.context import register_configure_hook
from langchain_core.tracers.langchain import LangChainTracer
from langgraph.checkpoint.sqlite import SqliteSaver
from langsmith import Client, schemas
from langsmith.run_trees import RunTree

import loop_guard.scan
from loop_guard import LoopGuardConfig
from loop_guard.scan import Conversation
from loop_guard.testing import ScriptedChatModel, sequence, with_usage

# langsmith's RunTree names pathlib.Path for type checkers only: under pydantic 2.9 (the
# dependency floors) the model stays undefined, and LangChain's tracer fails, until told.
RunTree.model_rebuild(_types_namespace={"Path": Path})

LOOPING = "loops"
HEALTHY = "healthy"


@tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    if path == "locked.md":
        msg = f"permission denied: {path}"
        raise ToolException(msg)
    return "File not found" if path == "notes.md" else f"contents of {path}"


read_file.handle_tool_error = True  # its error is the call's result, as ToolNode gives it


def _agent(checkpointer: Any) -> Any:
    reads = [[("read_file", {"path": "notes.md"})]] * 7  # the same call, the same result
    healthy = [[("read_file", {"path": p})] for p in ("a.md", "locked.md", "b.md")]

    def script(messages: Sequence[Any], index: int) -> Any:
        asked = str(messages[0].content)
        turns = reads if "notes" in asked else healthy
        return sequence(*turns, answer="done")(messages, index)

    model = ScriptedChatModel(script=with_usage(script, 120, 30))
    return create_agent(model, [read_file], checkpointer=checkpointer)


REQUESTS = {LOOPING: "Summarise notes.md", HEALTHY: "Read a.md, locked.md and b.md"}


class _Kept(Client):
    """A LangSmith client that sends nothing: the runs finished, as `Client.list_runs`
    returns them (`langsmith.schemas.Run`)."""

    def __init__(self) -> None:
        super().__init__(
            api_key="unused",
            api_url="http://127.0.0.1:9",
            info=schemas.LangSmithInfo(),
            auto_batch_tracing=False,
        )
        self.kept: list[schemas.Run] = []

    def create_run(self, *args: Any, **kwargs: Any) -> None:
        pass  # what LangChain would send (the tracer keeps the runs as they end)

    def update_run(self, *args: Any, **kwargs: Any) -> None:
        pass


class LangSmithExport(LangChainTracer):
    """LangChain's LangSmith tracer, keeping each finished run instead of sending it (the
    tracer copies itself for nested runs; the copies share its client)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("client", _Kept())
        super().__init__(**kwargs)

    @property
    def runs(self) -> list[schemas.Run]:
        return self.client.kept  # type: ignore[attr-defined, no-any-return]

    def _persist_run_single(self, run: Any) -> None:
        pass  # created runs are kept when they end

    def _update_run_single(self, run: Any) -> None:  # type: ignore[override]
        fields = run.model_dump(exclude={"child_runs", "ls_client"})
        self.runs.append(schemas.Run(**fields))

    def write(self, path: Path, *, shuffle: bool = True) -> Path:
        """The runs as JSON Lines, one run a line, in any order."""
        lines = [run.model_dump_json() for run in self.runs]
        if shuffle:
            random.Random(7).shuffle(lines)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return path


def record(folder: Path, callbacks: Sequence[Any] = ()) -> Path:
    """A looping and a healthy run of one agent, checkpointed to SQLite (threads `loops`
    and `healthy`), traced through `callbacks`; the checkpoint database."""
    database = folder / "checkpoints.sqlite"
    with sqlite3.connect(database, check_same_thread=False) as connection:
        agent = _agent(SqliteSaver(connection))
        for thread, request in REQUESTS.items():
            config = {"configurable": {"thread_id": thread}, "callbacks": list(callbacks)}
            agent.invoke({"messages": [{"role": "user", "content": request}]}, config)
    return database


def findings(conversations: Sequence[Conversation]) -> dict[str, list[tuple[Any, ...]]]:
    """Each conversation's findings under the default settings, by the thread it names
    (the part of its name after the last colon)."""
    config = LoopGuardConfig()
    found = {}
    for conversation in conversations:
        report = loop_guard.scan.scan_conversation(config, conversation)
        thread = conversation.name.rpartition(":")[2]
        found[thread] = [
            (f.call_index, f.event.kind, f.event.reason, f.event.tool, json.dumps(f.event.args))
            for f in report.findings
        ] + [("calls", report.calls, "cost", report.cost)]
    return found


class Spans:
    """OpenInference's LangChain instrumentation, its spans kept in memory and, given a
    Phoenix server's URL, sent to it too (project `project`)."""

    def __init__(self, phoenix: str | None = None, project: str = "default") -> None:
        from openinference.instrumentation.langchain import LangChainInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        self.provider = TracerProvider(resource=Resource({"openinference.project.name": project}))
        self.kept = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.kept))
        if phoenix is not None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(f"{phoenix.rstrip('/')}/v1/traces")
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.instrumentor = LangChainInstrumentor()

    def __enter__(self) -> Spans:
        self.instrumentor.instrument(tracer_provider=self.provider)
        return self

    def __exit__(self, *exc: object) -> None:
        self.instrumentor.uninstrument()
        self.provider.force_flush()

    def write(self, path: Path) -> Path:
        """The spans as the OpenTelemetry Collector's file exporter writes them: OTLP JSON,
        one export request a line (here, one request of ten spans a line)."""
        from google.protobuf.json_format import MessageToJson
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        spans = list(self.kept.get_finished_spans())
        lines = [MessageToJson(encode_spans(spans[n : n + 10]), indent=None)
                 for n in range(0, len(spans), 10)]  # fmt: skip
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return path


_TRACED: ContextVar[LangSmithExport | None] = ContextVar("loop_guard_traced", default=None)
register_configure_hook(_TRACED, inheritable=True)


@contextmanager
def traced() -> Iterator[LangSmithExport]:
    """Every run started inside, traced to a `LangSmithExport` (as `tracing_v2_enabled`
    traces to LangSmith): for agents whose invocation takes no callbacks."""
    export = LangSmithExport()
    token = _TRACED.set(export)
    try:
        yield export
    finally:
        _TRACED.reset(token)
