"""`loop-guard scan` and `report` on traces: LangSmith run exports and OTLP JSON files give
the findings a checkpoint of the same runs gives, at the same calls; bad lines are named,
one line each, and the rest is read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from langsmith import RunTree

from loop_guard.report import build_report
from loop_guard.scan import LoopGuardConfig, load, scan_conversation
from tests.scan.traces_support import (
    HEALTHY,
    LOOPING,
    LangSmithExport,
    findings,
    record,
    traced,
)
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint database and the LangSmith export (shuffled) of the same two runs."""
    folder = tmp_path_factory.mktemp("traces")
    export = LangSmithExport()
    database = record(folder, [export])
    return database, export.write(folder / "runs.jsonl")


def test_langsmith_runs_give_the_checkpoints_findings(recorded: tuple[Path, Path]) -> None:
    database, runs = recorded
    expected = findings(load(database))
    assert [f[:2] for f in expected[LOOPING][:2]] == [(3, "steer"), (5, "block")]
    assert len(expected[HEALTHY]) == 1  # only its counts: no finding
    assert findings(load(runs)) == expected


def test_the_scan_prints_the_loop_of_a_langsmith_export(recorded: tuple[Path, Path]) -> None:
    status, out, err = run_cli("scan", str(recorded[1]))
    assert (status, err) == (1, "")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:3]}
    assert rows == {
        "runs.jsonl:healthy": ["3", "-", "-", "-"],
        "runs.jsonl:loops": ["7", "3", "5", "7", "(abort_threshold)"],
    }


def test_a_thread_of_several_traces_is_one_conversation(tmp_path: Path) -> None:
    """Two requests on one thread: two traces, one conversation, a request each."""
    export = LangSmithExport()
    record(tmp_path, [export])
    record(tmp_path, [export])  # the same threads asked again
    conversations = load(export.write(tmp_path / "runs.jsonl"))
    assert sorted(c.name for c in conversations) == ["runs.jsonl:healthy", "runs.jsonl:loops"]
    twice = next(c for c in conversations if c.name.endswith(LOOPING))
    asked = [m.content for m in twice.messages if m.type == "human"]
    assert asked == ["Summarise notes.md"] * 2
    # Each request is replayed fresh: its loop is found in each, at its own calls.
    assert [f[:2] for f in findings([twice])[LOOPING] if f[1] == "stop"] == [
        (7, "stop"),
        (14, "stop"),
    ]


def test_runs_without_a_response_are_calls_of_their_own(tmp_path: Path) -> None:
    """Tool runs traced with the SDK's `RunTree` alone (no model run): each is a call."""
    root = RunTree(name="poller", run_type="chain", inputs={"messages": [
        {"role": "user", "content": "wait for the job"}]})  # fmt: skip
    for _ in range(6):
        child = root.create_child(name="poll_job", run_type="tool", inputs={"job": 7})
        child.end(outputs={"output": "pending"})
    root.end(outputs={})
    lines = [RunTree.model_validate(run.model_dump(exclude={"child_runs"})).model_dump_json()
             for run in [root, *root.child_runs]]  # fmt: skip
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(reversed(lines)) + "\n")
    [conversation] = load(path)
    assert conversation.name == f"runs.jsonl:{root.trace_id}"
    found = findings([conversation])[str(root.trace_id)]
    assert (3, "steer", "repeat", "poll_job", '{"job": 7}') in found


def test_a_bad_line_is_named_and_the_rest_is_read(
    recorded: tuple[Path, Path], tmp_path: Path
) -> None:
    lines = recorded[1].read_text().splitlines()
    lines.insert(3, "{not json")
    lines.insert(5, json.dumps({"run_type": "tool", "trace_id": "t"}))  # no start, no name
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines) + "\n")
    status, out, err = run_cli("scan", str(damaged))
    assert status == 1 + 4, err
    problems = err.splitlines()
    assert problems[0].startswith(f"loop-guard scan: {damaged}: line 4 is not JSON: ")
    assert problems[1].startswith(f"loop-guard scan: {damaged}: line 6 is not a LangSmith run: ")
    assert (
        problems[2]
        == f"loop-guard scan: {damaged}: 2 of 4 lines could not be read; the rest are reported"
    )
    assert len(problems) == 3
    assert "damaged.jsonl:loops" in out


def test_a_window_rejects_trace_files(recorded: tuple[Path, Path]) -> None:
    status, _, err = run_cli("scan", "--since", "7d", str(recorded[1]))
    assert status == 2
    assert "LangSmith runs are not read by time" in err


def test_the_report_names_the_kind_of_source(recorded: tuple[Path, Path]) -> None:
    database, runs = recorded
    report = build_report([database, runs], LoopGuardConfig()).to_json()
    assert report["source_kinds"] == {
        str(database): "LangGraph checkpoints (SQLite)",
        str(runs): "LangSmith runs",
    }
    assert report["threads"] == 4
    assert report["outcomes"]["stopped"] == 2


def test_agents_of_a_swarm_are_told_apart(tmp_path: Path) -> None:
    """A swarm's handoff ping-pong traced to LangSmith: the loop between alice and bob, each
    finding by the agent that made its call, as in the checkpoint."""
    from tests.scan.test_multi_agent_scan import record_ping_pong

    database = tmp_path / "swarm.sqlite"
    with traced() as export:
        record_ping_pong(database)
    runs = export.write(tmp_path / "runs.jsonl")

    def by_agent(source: Path) -> list[tuple[int, str, str | None, tuple[str, ...]]]:
        [conversation] = load(source)
        report = scan_conversation(LoopGuardConfig(), conversation)
        return [(f.call_index, f.event.kind, f.agent, f.agents) for f in report.findings]

    expected = by_agent(database)
    assert expected[0][2:] == ("bob", ("alice", "bob"))
    assert by_agent(runs) == expected


def test_without_the_phoenix_client_the_scan_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "phoenix.client", None)  # as if not installed
    status, out, err = run_cli("scan", "phoenix://127.0.0.1:6006/agents")
    assert (status, out) == (2, "")
    assert err.startswith("loop-guard scan: phoenix://127.0.0.1:6006/agents: reading a Phoenix "
                          "project needs arize-phoenix-client (")  # fmt: skip
    assert err.endswith(': pip install "langchain-loop-guard[phoenix]"\n')
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "kept"),
    [
        ("[" * 100_000 + "]" * 100_000, "[" * 100_000 + "]" * 100_000),  # too deep to build
        ('["a", "b"]', '["a", "b"]'),  # JSON, but no object
    ],
)
def test_arguments_that_are_no_json_object_are_kept_as_text(
    tmp_path: Path, arguments: str, kept: str
) -> None:
    """A tool run's input text that is no JSON object is its arguments, whole, as a
    conversation file's would be: never a traceback, never another value."""
    root = RunTree(name="agent", run_type="chain", inputs={"messages": [
        {"role": "user", "content": "run it"}]})  # fmt: skip
    root.create_child(name="run", run_type="tool", inputs={"input": arguments}).end(
        outputs={"output": "done"}
    )
    root.end(outputs={})
    lines = [RunTree.model_validate(run.model_dump(exclude={"child_runs"})).model_dump_json()
             for run in [root, *root.child_runs]]  # fmt: skip
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    [conversation] = load(path)
    [call] = conversation.messages[1].tool_calls  # type: ignore[attr-defined]
    assert call["args"] == {"$unparsed": kept}
