"""OpenTelemetry spans of a LangChain agent (OpenInference's instrumentation): written as
OTLP JSON, and sent to a real Phoenix server, they give the findings a checkpoint of the same
runs gives, at the same calls."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

import loop_guard._traces
from loop_guard.report import build_report
from loop_guard.scan import LoopGuardConfig, load
from tests.scan.traces_support import LOOPING, Spans, findings, record
from tests.support.cli import run_cli

pytest.importorskip(
    "openinference.instrumentation.langchain",
    reason="needs openinference-instrumentation-langchain (not in an extra; .ci/run installs it)",
)

PHOENIX = os.environ.get("LOOP_GUARD_TEST_PHOENIX_URL")


def test_otlp_json_gives_the_checkpoints_findings(tmp_path: Path) -> None:
    with Spans() as spans:
        database = record(tmp_path)
    otlp = spans.write(tmp_path / "spans.jsonl")
    expected = findings(load(database))
    assert findings(load(otlp)) == expected
    assert [f[:2] for f in expected[LOOPING] if f[1] == "stop"] == [(7, "stop")]
    status, out, err = run_cli("scan", "--json", str(otlp))
    assert (status, err) == (1, "")
    stops = {r["conversation"]: r["stop"] for r in json.loads(out)}
    assert stops == {"spans.jsonl:healthy": None,
                     "spans.jsonl:loops": {"call": 7, "reason": "abort_threshold"}}  # fmt: skip


def test_a_line_that_is_no_export_request_is_named(tmp_path: Path) -> None:
    with Spans() as spans:
        record(tmp_path)
    otlp = spans.write(tmp_path / "spans.jsonl")
    lines = otlp.read_text().splitlines()
    lines.insert(1, json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{}]}]}]}))
    otlp.write_text("\n".join(lines) + "\n")
    status, _, err = run_cli("scan", str(otlp))
    assert status == 1 + 4
    assert err.splitlines()[0] == (
        f"loop-guard scan: {otlp}: line 2 is not an OTLP export request: KeyError: 'traceId'"
    )


def _spans_in(url: str, project: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/v1/projects/{project}/spans?limit=1000") as reply:
            return len(json.load(reply)["data"])
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.skipif(
    PHOENIX is None,
    reason="no Phoenix server: set LOOP_GUARD_TEST_PHOENIX_URL (.ci/phoenix.sh starts one)",
)
@pytest.mark.internals("pages of 7 spans, so that the project is read over several")
def test_a_phoenix_project_gives_the_checkpoints_findings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("phoenix.client", reason="the phoenix extra's arize-phoenix-client")
    assert PHOENIX is not None
    monkeypatch.setattr(loop_guard._traces, "_PHOENIX_PAGE", 7)
    project = f"agents-{uuid.uuid4().hex[:8]}"
    with Spans(PHOENIX, project) as spans:
        database = record(tmp_path)
    sent = len(spans.kept.get_finished_spans())
    deadline = time.monotonic() + 60  # Phoenix writes what it receives in the background
    while _spans_in(PHOENIX, project) < sent and time.monotonic() < deadline:
        time.sleep(0.5)
    source = f"phoenix://{PHOENIX.split('://', 1)[1].rstrip('/')}/{project}"
    expected = findings(load(database))
    assert findings(load(source)) == expected
    assert findings(load(spans.write(tmp_path / "spans.jsonl"))) == expected
    report = build_report([source], LoopGuardConfig()).to_json()
    assert report["source_kinds"] == {source: "Phoenix project"}
    assert (report["threads"], report["outcomes"]["stopped"]) == (2, 1)


def test_an_unreachable_phoenix_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("phoenix.client", reason="the phoenix extra's arize-phoenix-client")
    status, out, err = run_cli("scan", "phoenix://127.0.0.1:9/agents")
    assert (status, out) == (2, "")
    assert err.startswith("loop-guard scan: phoenix://127.0.0.1:9/agents: cannot read project "
                          "'agents': ConnectError")  # fmt: skip
    assert len(err.splitlines()) == 1
