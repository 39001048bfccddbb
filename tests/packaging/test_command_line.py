"""The `loop-guard` command and the package as a shell user meets them: the version, output
piped into a reader that stops early, no stray log lines, the scan's exit status and legend,
and JSON Lines files with a broken line."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import loop_guard
from tests.scan.test_scan import openai_healthy, openai_loop, scan, write
from tests.support.cli import run_process


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_version_is_the_distributions() -> None:
    assert loop_guard.__version__ == version("langchain-loop-guard")
    done = run_process("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"loop-guard {version('langchain-loop-guard')}"


def test_demo_piped_into_a_reader_that_stops_early_ends_without_a_traceback() -> None:
    """`loop-guard demo | head -3`: the reader closes the pipe, the demo ends quietly."""
    with subprocess.Popen(
        [sys.executable, "-m", "loop_guard", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as demo:
        assert demo.stdout is not None
        assert demo.stderr is not None
        first = [demo.stdout.readline() for _ in range(3)]
        demo.stdout.close()  # as `head` does once it has its lines
        err = demo.stderr.read()
        status = demo.wait(timeout=120)
    assert "A stubborn agent WITHOUT loop_guard" in "".join(first)
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert status == 1


AGENT = """
import logging
from langchain.agents import create_agent
from loop_guard import LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support.agents import ToolRuns, ask, make_tools
{setup}
model = ScriptedChatModel(script=stubborn(("read_file", {{"path": "notes.md"}})))
agent = create_agent(model, make_tools(ToolRuns()), middleware=[LoopGuardMiddleware()])
agent.invoke(ask())
"""


def test_an_app_that_never_configured_logging_gets_no_stray_warning() -> None:
    """The stop is a WARNING record: with logging never configured it goes nowhere; with
    logging configured it reaches the app's handlers as before."""
    quiet = python(AGENT.format(setup=""))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    configured = python(AGENT.format(setup="logging.basicConfig(level=logging.INFO)"))
    assert configured.returncode == 0, configured.stderr
    assert "loop guard stop: tool=read_file" in configured.stderr
    assert "loop guard steer: tool=read_file" in configured.stderr


def test_a_flagged_conversation_is_not_hidden_by_an_unreadable_file(tmp_path: Path) -> None:
    """Exit status 3: a loop found (1) and a file not read (2), both said."""
    loop = write(tmp_path / "loop.json", {"messages": openai_loop(9)})
    healthy = write(tmp_path / "healthy.json", {"messages": openai_healthy()})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert scan(str(loop))[0] == 1
    assert scan(str(healthy), str(broken))[0] == 2
    status, out, err = scan(str(loop), str(healthy), str(broken))
    assert status == 3
    assert "loop.json" in out
    assert "broken.json" in err


def test_the_table_says_what_its_columns_hold(tmp_path: Path) -> None:
    loop = write(tmp_path / "loop.json", {"messages": openai_loop(9)})
    _, out, _ = scan(str(loop))
    assert "steer, block, stop: the number of the tool call (from 1)" in out


def test_a_broken_line_loses_only_its_own_conversation(tmp_path: Path) -> None:
    """JSON Lines of conversations: the others are scanned, the broken line is named."""
    path = tmp_path / "threads.jsonl"
    lines = [
        json.dumps({"messages": openai_loop(9)}),
        '{"messages": [ truncated',
        json.dumps({"messages": openai_healthy()}),
    ]
    path.write_text("\n".join(lines) + "\n")
    status, out, err = scan("--json", str(path))
    assert status == 1 + 4  # a loop, and a line of a file read otherwise
    reports = {report["conversation"]: report for report in json.loads(out)}
    assert set(reports) == {"threads.jsonl#1", "threads.jsonl#3"}
    assert reports["threads.jsonl#1"]["stop"] is not None
    assert reports["threads.jsonl#3"]["findings"] == []
    assert "threads.jsonl: line 2 is not JSON" in err


def test_a_broken_line_among_messages_leaves_the_conversation_unread(tmp_path: Path) -> None:
    """JSON Lines of messages make one conversation: without a line it would be another
    conversation, so it is not read, and the line is named."""
    path = tmp_path / "messages.jsonl"
    rows = [json.dumps(message) for message in openai_loop(9)]
    rows[3] = rows[3][:10]
    path.write_text("\n".join(rows) + "\n")
    status, out, err = scan(str(path))
    assert status == 2
    assert out == ""
    assert "messages.jsonl: line 4 is not JSON" in err
