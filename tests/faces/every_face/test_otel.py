"""Steers, blocks and stops as OpenTelemetry span events and counters (the `otel` extra),
read back with the SDK's in-memory exporters; and no OpenTelemetry import without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard import LoopGuardStop
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support import ROOT
from tests.support.agents import Mode, ask, guarded_agent, run

otel_sdk = pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (dev)")

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

# The global providers can be set once per process: this module sets both, for all its tests.
SPANS = InMemorySpanExporter()
READER = InMemoryMetricReader()
_tracer_provider = TracerProvider()
_tracer_provider.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(_tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
TRACER = trace.get_tracer("tests")


def guarded(face: str, model: Any) -> tuple[Any, dict[str, Any]]:
    return guarded_agent(face, model, checkpointer=InMemorySaver())


def counts() -> Counter[tuple[str, str, str]]:
    """Every loop_guard counter's cumulative sum, by (name, tool, reason)."""
    found: Counter[tuple[str, str, str]] = Counter()
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "loop_guard":
                continue
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    reason = attributes.get("loop_guard.reason", "")
                    key = (metric.name, str(attributes.get("gen_ai.tool.name")), str(reason))
                    found[key] += int(point.value)
    return found


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@pytest.mark.parametrize(
    "face", ["middleware", "graph", "handler"], ids=["middleware", "node", "handler"]
)
def test_each_steer_block_and_stop_is_a_span_event_and_a_count(face: str, mode: Mode) -> None:
    """A stuck read: one steer, three blocks and the stop land on the span current during
    the run, with the tool's name and call id, and the counters grow by as many."""
    SPANS.clear()
    before = counts()
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    agent, extra = guarded(face, model)
    config = {"configurable": {"thread_id": "t"}, **extra}
    with TRACER.start_as_current_span("agent run"):
        try:
            run(agent, ask(), config, mode)
        except LoopGuardStop:
            assert face == "handler"  # the handler's stop raises
    (span,) = [span for span in SPANS.get_finished_spans() if span.name == "agent run"]
    names = [event.name for event in span.events]
    assert names == ["loop_guard.steer", *["loop_guard.block"] * 3, "loop_guard.stop"]
    for event in span.events:
        attributes = event.attributes or {}
        assert attributes["gen_ai.tool.name"] == "read_file"
        assert attributes["loop_guard.conversation"] == "t"
        assert str(attributes["loop_guard.message"]).strip()
    steer, block = span.events[0].attributes or {}, span.events[1].attributes or {}
    assert steer["loop_guard.reason"] == "repeat"
    assert steer["loop_guard.streak"] == 3
    assert str(steer["gen_ai.tool.call.id"])
    assert block["loop_guard.blocks"] == 1
    stop = span.events[-1].attributes or {}
    assert stop["loop_guard.reason"] == "abort_threshold"
    # What the loop cost the request, at its end (see What a loop cost).
    assert (stop["loop_guard.loop.model_calls"], stop["loop_guard.loop.tool_runs"]) == (6, 3)
    assert stop["loop_guard.loop.tool_runs_saved"] == 3
    grown = counts() - before
    assert grown == Counter(
        {
            ("loop_guard.steers", "read_file", "repeat"): 1,
            ("loop_guard.blocks", "read_file", "repeat"): 3,
            ("loop_guard.stops", "read_file", "abort_threshold"): 1,
        }
    )


def test_outside_any_span_only_the_counters_move() -> None:
    """No span current during the run: nothing to add an event to, and no error."""
    SPANS.clear()
    before = counts()
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    agent, _ = guarded("middleware", model)
    run(agent, ask(), {"configurable": {"thread_id": "t"}}, "invoke")
    assert sum((counts() - before).values()) == 5
    assert SPANS.get_finished_spans() == ()


@pytest.mark.slow  # a fresh interpreter
def test_without_opentelemetry_nothing_imports_it() -> None:
    """With `opentelemetry` not importable, a guard steers as before and never tries it."""
    script = textwrap.dedent(
        """
        import sys

        sys.modules["opentelemetry"] = None  # as if not installed: importing it fails
        from langchain.agents import create_agent
        from loop_guard import LoopGuardMiddleware
        from loop_guard.testing import ScriptedChatModel, stubborn
        from tests.support.agents import ToolRuns, ask, make_tools

        events = []
        model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
        middleware = LoopGuardMiddleware(on_event=events.append)
        create_agent(model, make_tools(ToolRuns()), middleware=[middleware]).invoke(ask())
        assert [e.kind for e in events] == ["steer", "block", "block", "block", "stop"], events
        assert not [name for name in sys.modules if name.startswith("opentelemetry.")]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_each_event_carries_what_compaction_kept_out_of_the_context() -> None:
    """A stuck read of a large file with `compact_repeats=True`: the stop's span event
    carries the characters kept out of the model's context up to the stop."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from loop_guard import LoopGuardMiddleware

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return "the same page\n" * 300

    SPANS.clear()
    model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    guard = LoopGuardMiddleware(compact_repeats=True)
    agent = create_agent(model, [read_file], middleware=[guard], checkpointer=InMemorySaver())
    with TRACER.start_as_current_span("agent run"):
        run(agent, ask(), {"configurable": {"thread_id": "t"}}, "invoke")
    (span,) = [span for span in SPANS.get_finished_spans() if span.name == "agent run"]
    stop = span.events[-1].attributes or {}
    kept_out = guard.guard.stats.cost.chars_kept_out
    assert stop["loop_guard.loop.chars_kept_out"] == kept_out > 3 * 14 * 300
    assert stop["loop_guard.loop.tokens_kept_out"] == 0  # the model reported no usage
