"""What `loop-guard` says when it cannot do what it was asked: one line on standard error and
a documented exit status, never a traceback.

Exit status of `scan` and `report`, added up: 1 the guard would have stepped in (scan only),
2 a source could not be read, 4 parts of a readable source (threads, lines) could not be;
70 a bug in loop-guard.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import BaseMessage

import loop_guard.scan
from loop_guard.testing import ScriptedChatModel
from tests.scan.test_scan import openai_healthy, openai_loop, write
from tests.support.cli import run_cli, run_process
from tests.support.fleet import sqlite_fleet

THREADS = 20
CORRUPT = "cycle-000001"


def corrupt_thread(database: Path, thread_id: str, blob: bytes, kind: str = "msgpack") -> None:
    """Overwrite a thread's stored checkpoint in the SQLite file itself."""
    with sqlite3.connect(database) as connection:
        connection.execute(
            "UPDATE checkpoints SET type = ?, checkpoint = ? WHERE thread_id = ?",
            (kind, blob, thread_id),
        )
    connection.close()


@pytest.fixture
def corrupt_fleet(tmp_path: Path) -> Path:
    """A fleet of real SqliteSaver checkpoints, one of whose rows holds a number where its
    checkpoint should be."""
    database = tmp_path / "fleet.sqlite"
    sqlite_fleet(database, THREADS)
    corrupt_thread(database, CORRUPT, ormsgpack.packb(5))
    return database


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- a corrupt row inside a readable database -------------------------------------------------


def test_report_names_a_corrupt_thread_and_reports_the_others(
    corrupt_fleet: Path, tmp_path: Path
) -> None:
    numbers = tmp_path / "r.json"
    status, _, err = run_cli("report", str(corrupt_fleet), "--json", str(numbers), "--jobs", "1")
    assert status == loop_guard.scan.EXIT_PARTLY_UNREADABLE == 4
    assert "Traceback" not in err
    assert f"thread '{CORRUPT}'" in err
    assert f"1 of {THREADS} threads could not be read" in err
    written = json.loads(numbers.read_text())
    assert (written["threads"], written["unreadable"]) == (THREADS - 1, 1)


def test_scan_names_a_corrupt_thread_and_adds_its_status_to_the_loops(corrupt_fleet: Path) -> None:
    status, out, err = run_cli("scan", "--json", str(corrupt_fleet))
    assert status == 1 + 4  # the fleet loops, and a thread could not be read
    assert "Traceback" not in err
    assert f"thread '{CORRUPT}'" in err
    assert f"1 of {THREADS} threads could not be read" in err
    assert len(json.loads(out)) == THREADS - 1


def test_report_of_the_corrupt_fleet_in_worker_processes(corrupt_fleet: Path) -> None:
    status, out, err = run_cli("report", str(corrupt_fleet), "--json", "-", "--jobs", "2")
    assert status == 4, err
    assert json.loads(out)["threads"] == THREADS - 1


def test_a_database_whose_only_thread_is_corrupt_is_unreadable(tmp_path: Path) -> None:
    """Nothing of it could be read: status 2, as for any unreadable source."""
    database = tmp_path / "one.sqlite"
    sqlite_fleet(database, 1)
    corrupt_thread(database, "repeat-000000", b"\xc1 not msgpack")
    status, _, err = run_cli("scan", str(database))
    assert status == 2
    assert "thread 'repeat-000000'" in one_line(err)


def test_a_broken_line_in_json_lines_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    lines = [json.dumps({"messages": openai_loop(6)}), "{broken", json.dumps({"messages": 7})]
    path.write_text("\n".join(lines) + "\n")
    status, _, err = run_cli("scan", str(path))
    assert status == 1 + 4
    assert "line 2" in err
    assert "line 3" in err
    assert "2 of 3 lines could not be read" in err


# --- a source that cannot be read at all ------------------------------------------------------


@pytest.fixture
def not_checkpoints(tmp_path: Path) -> Path:
    """A SQLite database of something else."""
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE checkpoints (name TEXT)")
    connection.close()
    return path


@pytest.mark.parametrize("command", ["scan", "report"])
def test_a_sqlite_file_that_is_not_a_checkpoint_database(
    command: str, not_checkpoints: Path, tmp_path: Path
) -> None:
    extra = ["-o", str(tmp_path / "r.html")] if command == "report" else []
    status, _, err = run_cli(command, str(not_checkpoints), *extra)
    assert status == 2
    line = one_line(err)
    assert str(not_checkpoints) in line
    assert "not a LangGraph checkpoint database" in line
    assert not (tmp_path / "r.html").exists()  # no report of nothing


@pytest.mark.parametrize("command", ["scan", "report"])
@pytest.mark.parametrize("case", ["missing", "folder", "empty folder", "not a conversation"])
def test_an_unreadable_source_is_one_line_and_status_2(
    command: str, case: str, tmp_path: Path
) -> None:
    source = tmp_path / "source"
    if case == "folder":
        source.mkdir()
        (source / "notes.txt").write_text("just some notes")
    elif case == "empty folder":
        source.mkdir()
    elif case == "not a conversation":
        source.write_text('{"answer": 42}')
    extra = ["--json", str(tmp_path / "r.json")] if command == "report" else []
    status, _, err = run_cli(command, str(source), *extra)
    assert status == 2
    assert str(source) in one_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
@pytest.mark.parametrize("command", ["scan", "report"])
def test_a_file_without_permission(command: str, tmp_path: Path) -> None:
    path = write(tmp_path / "secret.json", openai_healthy())
    path.chmod(0)
    extra = ["--json", str(tmp_path / "r.json")] if command == "report" else []
    status, _, err = run_cli(command, str(path), *extra)
    assert status == 2
    assert "Permission denied" in one_line(err)


def test_a_report_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "run.json", openai_healthy())
    status, _, err = run_cli("report", str(path), "-o", str(tmp_path / "no" / "r.html"))
    assert status == 2
    assert "r.html" in one_line(err)


def test_a_readable_and_an_unreadable_source_add_up(corrupt_fleet: Path, tmp_path: Path) -> None:
    """Each kind of trouble has its own bit: 1 + 2 + 4."""
    status, _, _ = run_cli("scan", str(corrupt_fleet), str(tmp_path / "missing.json"))
    assert status == 7


# --- demo --model: the provider fails ---------------------------------------------------------


class ProviderDown(Exception):
    """What a provider's client raises when its service refuses the call."""


def test_a_provider_that_fails_mid_run_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(messages: list[BaseMessage], index: int) -> Any:
        raise ProviderDown("Error code: 401 - invalid x-api-key")

    import langchain.chat_models

    def init_chat_model(name: str) -> ScriptedChatModel:
        assert name == "anthropic:claude-test"
        return ScriptedChatModel(script=refuse)

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", init_chat_model)
    status, _, err = run_cli("demo", "--model", "anthropic:claude-test")
    assert status == 2
    line = one_line(err)
    assert "anthropic:claude-test" in line
    assert "ProviderDown: Error code: 401 - invalid x-api-key" in line


@pytest.mark.slow
def test_a_provider_whose_package_is_missing_is_one_line() -> None:
    done = run_process("demo", "--model", "mistralai:mistral-small-latest")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "mistralai:mistral-small-latest" in line
    assert "langchain-mistralai" in line


# --- a bug in loop-guard ----------------------------------------------------------------------


def test_a_bug_while_scanning_is_one_line_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise KeyError("call-3")

    monkeypatch.setattr(loop_guard.scan, "scan_conversation", broken)
    monkeypatch.delenv("LOOP_GUARD_DEBUG", raising=False)
    path = write(tmp_path / "run.json", openai_loop(6))
    status, _, err = run_cli("scan", str(path))
    assert status == 70
    line = one_line(err)
    assert "KeyError: 'call-3'" in line
    assert "LOOP_GUARD_DEBUG=1" in line
    monkeypatch.setenv("LOOP_GUARD_DEBUG", "1")
    with pytest.raises(KeyError):
        run_cli("scan", str(path))


# --- as a real process ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_command_as_a_process(
    corrupt_fleet: Path, not_checkpoints: Path, tmp_path: Path
) -> None:
    report = run_process("report", str(corrupt_fleet), "--json", str(tmp_path / "r.json"))
    assert report.returncode == 4, report.stderr
    assert "Traceback" not in report.stderr
    assert f"thread '{CORRUPT}'" in report.stderr
    scan = run_process("scan", str(not_checkpoints))
    assert scan.returncode == 2
    assert "not a LangGraph checkpoint database" in one_line(scan.stderr)
    folder = run_process("report", str(tmp_path / "nothing-here"), "--json", "-")
    assert folder.returncode == 2
    one_line(folder.stderr)


def test_help_gives_the_table_of_exit_statuses() -> None:
    for command in ("scan", "report"):
        done = run_process(command, "--help")
        text = " ".join(done.stdout.split())
        assert "4 when" in text
        assert "70" in text
