"""Spans of the OpenTelemetry GenAI conventions (`chat` and `execute_tool` operations), made
with the OpenTelemetry SDK and written as OTLP JSON, are read as conversations: a polling loop
is found at its calls, with the token usage the chat spans report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from loop_guard.scan import load
from tests.scan.traces_support import findings

encoder = pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.common.trace_encoder",
    reason="the OTLP encoder (opentelemetry-exporter-otlp-proto-common, the phoenix extra's)",
)
json_format = pytest.importorskip("google.protobuf.json_format")


def _chat(tracer, calls: list[tuple[str, str, dict]], usage: tuple[int, int]) -> None:
    with tracer.start_as_current_span("chat model") as span:
        parts = [{"type": "tool_call", "id": i, "name": n, "arguments": a} for i, n, a in calls]
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.agent.name", "poller")
        span.set_attribute("gen_ai.output.messages", json.dumps([{"role": "assistant",
                                                                   "parts": parts}]))  # fmt: skip
        span.set_attribute("gen_ai.usage.input_tokens", usage[0])
        span.set_attribute("gen_ai.usage.output_tokens", usage[1])


def _tool(tracer, call_id: str, name: str, args: dict, result: str, failed: bool) -> None:
    with tracer.start_as_current_span(f"execute_tool {name}") as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", name)
        span.set_attribute("gen_ai.tool.call.id", call_id)
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
        span.set_attribute("gen_ai.tool.call.result", result)
        if failed:
            span.set_status(Status(StatusCode.ERROR, result))


def test_genai_spans_are_read(tmp_path: Path) -> None:
    kept = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent poller") as root:
        request = [{"role": "user", "parts": [{"type": "text", "content": "wait for job 7"}]}]
        root.set_attribute("gen_ai.input.messages", json.dumps(request))
        root.set_attribute("gen_ai.conversation.id", "job-7")
        for n in range(6):
            _chat(tracer, [(f"c{n}", "poll_job", {"job": 7})], (500, 20))
            _tool(tracer, f"c{n}", "poll_job", {"job": 7}, "job 7: no such job", failed=True)
    request = encoder.encode_spans(kept.get_finished_spans())
    path = tmp_path / "spans.jsonl"
    path.write_text(json_format.MessageToJson(request, indent=None) + "\n")
    [conversation] = load(path)
    assert conversation.name == "spans.jsonl:job-7"
    assert [m.type for m in conversation.messages[:3]] == ["human", "ai", "tool"]
    assert conversation.messages[0].content == "wait for job 7"
    assert conversation.messages[1].name == "poller"
    assert conversation.messages[2].status == "error"
    found = findings([conversation])["job-7"]
    assert found[0][:4] == (3, "steer", "repeat", "poll_job")
    assert found[-1][3].tokens == 5 * 520  # the responses from the first repeat on, as reported
