"""`--since` and `--until` of `loop-guard scan` and `loop-guard report`: a thread is in the
window when its latest checkpoint's time is; conversation files record no time and are
refused under a window; a bad time is an argparse error."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from tests.support.agents import record_unguarded_loops
from tests.support.cli import run_cli

OLD = "2025-01-06T10:00:00+00:00"  # the time the "old" thread last changed


def restamp(saver: SqliteSaver, thread: str, ts: str) -> None:
    """Checkpoint a thread's latest state once more, stamped `ts`: as if it last changed then."""
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    found = saver.get_tuple(config)
    assert found is not None
    checkpoint = {**found.checkpoint, "id": empty_checkpoint()["id"], "ts": ts}
    saver.put(found.config, checkpoint, found.metadata, checkpoint["channel_versions"])


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """Two threads of an unguarded, looping agent: `recent` (now) and `old` (`OLD`)."""
    path = tmp_path / "agent.sqlite"
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    record_unguarded_loops(saver, ("old", "recent"))
    restamp(saver, "old", OLD)
    return path


def scanned(*args: str) -> list[str]:
    status, out, err = run_cli("scan", "--json", *args)
    assert status in (0, 1), err
    return [report["conversation"] for report in json.loads(out)]


def test_a_scan_reads_the_threads_whose_latest_checkpoint_is_in_the_window(
    database: Path,
) -> None:
    both = ["agent.sqlite:old", "agent.sqlite:recent"]
    assert scanned(str(database)) == both
    assert scanned(str(database), "--since", "2025-06-01") == ["agent.sqlite:recent"]
    assert scanned(str(database), "--until", "2025-06-01") == ["agent.sqlite:old"]
    assert scanned(str(database), "--since", "7d") == ["agent.sqlite:recent"]
    # `--since` takes its moment in, `--until` leaves it out; a time without a zone is UTC.
    assert scanned(str(database), "--since", "2025-01-06T10:00:00") == both
    assert scanned(str(database), "--since", "2025-01-06T09:00Z",
                   "--until", "2025-01-06T10:00Z") == []  # fmt: skip
    assert scanned(str(database), "--since", "2025-01-06T11:00+01:00",
                   "--until", "2025-01-06T10:00:01+00:00") == ["agent.sqlite:old"]  # fmt: skip
    assert scanned(str(database), "--thread", "old", "--since", "1w") == []


def test_a_conversation_file_under_a_window_is_refused_not_read_whole(
    database: Path, tmp_path: Path
) -> None:
    recorded = tmp_path / "run.json"
    recorded.write_text(json.dumps([{"role": "user", "content": "hello"}]))
    status, out, err = run_cli("scan", "--json", "--since", "2025-06-01", str(recorded),
                           str(database))  # fmt: skip
    assert status == 3  # the recent thread loops; the file could not be read in the window
    assert [r["conversation"] for r in json.loads(out)] == ["agent.sqlite:recent"]
    assert "run.json: a conversation file records no times" in err
    assert "--since" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "last tuesday"], "--since: not a time"),
        (["--until", "2025-13-01"], "--until: not a time"),
        (["--since", "0d"], "--since: not a time"),
        (["--since", "2025-06-02", "--until", "2025-06-01"], "is not before"),
    ],
)
@pytest.mark.parametrize("command", ["scan", "report"])
def test_a_bad_time_is_a_usage_error(
    database: Path, command: str, args: list[str], says: str
) -> None:
    status, out, err = run_cli(command, str(database), *args)
    assert status == 2
    assert says in err
    assert "Traceback" not in err
    assert out == ""


def test_a_report_counts_the_threads_of_its_window_and_says_which(
    database: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    window = ["--since", "2025-01-01", "--until", "2025-02-01T00:00"]
    status, out, err = run_cli("report", str(database), *window, "--json", "-", "-o", str(page))
    assert status == 0, err
    numbers: dict[str, Any] = json.loads(out)
    assert numbers["threads"] == 1
    assert numbers["window"] == {
        "since": "2025-01-01T00:00:00+00:00",
        "until": "2025-02-01T00:00:00+00:00",
    }
    assert numbers["span"] == {"first": OLD, "last": OLD}
    assert numbers["sources"] == [str(database)]
    generated = datetime.fromisoformat(numbers["generated"])
    assert abs(generated - datetime.now(timezone.utc)) < timedelta(minutes=5)
    html = page.read_text()
    for words in ("2025-01-06 10:00 UTC", "since 2025-01-01 00:00 UTC",
                  "until 2025-02-01 00:00 UTC", str(database)):  # fmt: skip
        assert words in html, words
