"""`loop-guard scan`: recorded conversations in every format, exit statuses, bad files."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import messages_to_dict
from langgraph.checkpoint.sqlite import SqliteSaver

from loop_guard import LoopGuardConfig
from loop_guard.cli import main
from loop_guard.scan import Conversation, load, run_scan, scan_conversation
from tests.support.agents import record_unguarded_loops
from tests.support.cli import run_cli
from tests.support.texts import LOOPS, NOT_LOOPS


def openai_call(n: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
        ],
    }


def openai_loop(repeats: int, *, is_error: bool = True) -> list[dict[str, Any]]:
    """A user asks; the assistant reads the same missing file `repeats` times."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise notes.md"}]
    for n in range(1, repeats + 1):
        messages.append(openai_call(n, "read", {"path": "notes.md"}))
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{n}", "content": "File not found",
             "is_error": is_error}
        )  # fmt: skip
    messages.append({"role": "assistant", "content": "I could not read it."})
    return messages


def openai_healthy() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List and read"}]
    for n in range(1, 9):
        messages.append(openai_call(n, "read", {"path": f"file{n}.md"}))
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": "same text"})
    return messages


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def scan(*args: str) -> tuple[int, str, str]:
    return run_cli("scan", *args)


def test_a_recorded_loop_is_reported_with_call_indices(tmp_path: Path) -> None:
    """Steer at the 3rd identical call, blocks at 5-7, stop at the 7th; exit status 1."""
    path = write(tmp_path / "loop.json", {"messages": openai_loop(12)})
    status, out, _ = scan("--json", str(path))
    assert status == 1
    [report] = json.loads(out)
    assert (report["calls"], report["first_steer"], report["first_block"]) == (12, 3, 5)
    assert report["stop"] == {"call": 7, "reason": "abort_threshold"}
    assert [f["kind"] for f in report["findings"]] == ["steer", "block", "block", "block", "stop"]
    assert report["findings"][0]["args"] == {"path": "notes.md"}


@pytest.mark.parametrize(
    "name", ["fenced_digits", "fenced_counting", "counted_steps", "index_table", "sql_inserts"]
)
def test_a_recorded_reply_is_read_by_the_rules_of_repeated_text(name: str, tmp_path: Path) -> None:
    """The scan reads a reply as the guard watches one: the catalogue's loops near the rules
    for run-ons and counted sentences are findings, its look-alikes are not."""
    (text,) = [text for text in LOOPS + NOT_LOOPS if text.name == name]
    messages = [
        {"role": "user", "content": "Find the order."},
        {"role": "assistant", "content": text.text},
    ]
    status, out, _ = scan("--json", str(write(tmp_path / "reply.json", messages)))
    [report] = json.loads(out)
    found = [(f["kind"], f["reason"]) for f in report["findings"]]
    assert (status, found) == ((1, [("steer", "repeated_text")]) if text.loop else (0, []))


def test_a_healthy_conversation_is_clean(tmp_path: Path) -> None:
    """Different args with equal results: nothing to report, exit status 0."""
    path = write(tmp_path / "ok.json", openai_healthy())
    status, out, err = scan(str(path))
    assert status == 0
    assert "ok.json" in out
    assert err == ""


def test_configuration_flags_and_variables_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags win over LOOP_GUARD_* variables; ignore_errors hides error retries."""
    path = write(tmp_path / "loop.json", {"messages": openai_loop(12)})
    monkeypatch.setenv("LOOP_GUARD_WARN_THRESHOLD", "4")
    _, out, _ = scan("--json", "--block-threshold", "8", str(path))
    [report] = json.loads(out)
    assert (report["first_steer"], report["first_block"]) == (4, 8)
    status, out, _ = scan("--json", "--ignore-errors", str(path))
    assert status == 0
    assert json.loads(out)[0]["findings"] == []
    status, _, err = scan("--warn-threshold", "9", str(path))
    assert status == 2
    assert "warn_threshold" in err


def test_langchain_message_dicts_give_the_same_findings(tmp_path: Path) -> None:
    """messages_to_dict output is read like the OpenAI form of the same conversation."""
    [conversation] = load(write(tmp_path / "loop.json", openai_loop(9)))
    dicts = write(tmp_path / "lc.json", messages_to_dict(list(conversation.messages)))
    _, from_openai, _ = scan("--json", str(tmp_path / "loop.json"))
    _, from_langchain, _ = scan("--json", str(dicts))
    strip = lambda text: [  # noqa: E731
        {k: v for k, v in r.items() if k != "conversation"} for r in json.loads(text)
    ]
    assert strip(from_openai) == strip(from_langchain)


def test_json_lines_of_messages_and_of_conversations(tmp_path: Path) -> None:
    """One message per line is one conversation; one conversation per line is several."""
    by_message = tmp_path / "messages.jsonl"
    by_message.write_text("\n".join(json.dumps(m) for m in openai_loop(8)) + "\n")
    by_conversation = tmp_path / "conversations.jsonl"
    by_conversation.write_text(
        json.dumps({"messages": openai_loop(8)}) + "\n" + json.dumps({"messages": openai_healthy()})
    )
    _, out, _ = scan("--json", str(by_message), str(by_conversation))
    reports = json.loads(out)
    assert [r["conversation"] for r in reports] == [
        "messages.jsonl",
        "conversations.jsonl#1",
        "conversations.jsonl#2",
    ]
    assert [r["first_block"] for r in reports] == [5, 5, None]


def test_reused_tool_call_ids_are_paired_by_position(tmp_path: Path) -> None:
    """Some recorders reuse ids; results still pair with the right calls."""
    messages = openai_loop(6)
    for message in messages:
        for call in message.get("tool_calls", ()):
            call["id"] = "call_0"
        if message["role"] == "tool":
            message["tool_call_id"] = "call_0"
    _, out, _ = scan("--json", str(write(tmp_path / "reused.json", messages)))
    assert json.loads(out)[0]["first_block"] == 5


def test_each_user_message_starts_a_new_request(tmp_path: Path) -> None:
    """Two identical calls per request never add up to a streak across requests (see How
    the guard decides: reset and scope); a third request making them would be a repeat
    across turns."""
    messages = []
    for turn in range(2):
        messages += openai_loop(2)
        messages[-5]["content"] = f"request {turn}"
    for n, message in enumerate(m for m in messages if m.get("tool_calls")):
        message["tool_calls"][0]["id"] = f"c{n}"
    for n, message in enumerate(m for m in messages if m["role"] == "tool"):
        message["tool_call_id"] = f"c{n}"
    status, _, _ = scan(str(write(tmp_path / "turns.json", messages)))
    assert status == 0


def test_a_langgraph_sqlite_checkpoint(tmp_path: Path) -> None:
    """A thread of an unguarded agent, read from its SQLite checkpoints, with --thread."""
    database = tmp_path / "agent.sqlite"
    saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    record_unguarded_loops(saver, ("looping", "other"))
    status, out, _ = scan("--json", "--thread", "looping", str(database))
    assert status == 1
    [report] = json.loads(out)
    assert report["conversation"] == "agent.sqlite:looping"
    assert report["first_block"] == 5
    _, out, _ = scan("--json", str(database))
    assert [r["conversation"] for r in json.loads(out)] == [
        "agent.sqlite:looping",
        "agent.sqlite:other",
    ]
    status, _, err = scan("--thread", "missing", str(database))
    assert status == 2
    assert "no thread 'missing'" in err


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file"),
        (b"{not json", "line 1 is not JSON"),
        (b"\xff\xfe\x00binary", "not UTF-8"),
        (b'{"no": "messages"}', "expected a list of messages"),
        (b'{"messages": [1, 2]}', "must be a list of message objects"),
        (b'[{"role": "robot", "content": "x"}]', "unknown role 'robot'"),
        (b'[{"role": "tool", "tool_call_id": "x", "content": "y"}]', "no pending call"),
        (b"SQLite format 3\x00garbage", "not a LangGraph checkpoint database"),
    ],
)
def test_unreadable_input_is_named_with_its_reason(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    """Exit status 2, the file and the reason on stderr, and the other files still scanned."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    good = write(tmp_path / "good.json", openai_healthy())
    status, out, err = scan(str(bad), str(good))
    assert status == 2
    assert str(bad) in err
    assert reason in err
    assert "good.json" in out
    assert "Traceback" not in err


def test_a_missing_file_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    """A path that does not exist is reported like any unreadable file."""
    status, _, err = scan(str(tmp_path / "nowhere.json"))
    assert status == 2
    assert "nowhere.json" in err


def test_the_command_line_never_shows_a_traceback(tmp_path: Path) -> None:
    """Run as a real process on a directory and on garbage: a message, no traceback."""
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\x01\x02")
    done = subprocess.run(
        [sys.executable, "-m", "loop_guard", "scan", str(garbage), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert str(tmp_path) in done.stderr


def test_progress_is_shown_on_a_terminal_only(tmp_path: Path) -> None:
    """A long scan reports progress on stderr when it is a terminal."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    paths = [write(tmp_path / f"c{n}.json", openai_healthy()) for n in range(3)]
    terminal, piped = Terminal(), io.StringIO()
    run_scan(paths, LoopGuardConfig(), out=io.StringIO(), err=terminal)
    run_scan(paths, LoopGuardConfig(), out=io.StringIO(), err=piped)
    assert "scanning 3/3" in terminal.getvalue()
    assert piped.getvalue() == ""


def test_scan_conversation_directly() -> None:
    """The scanner is usable from Python on LangChain messages."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    messages: list[Any] = [HumanMessage("go")]
    for n in range(5):
        messages.append(AIMessage("", tool_calls=[{"name": "ls", "args": {}, "id": f"c{n}"}]))
        messages.append(ToolMessage("same", tool_call_id=f"c{n}"))
    report = scan_conversation(LoopGuardConfig(), Conversation("direct", messages))
    assert [(f.call_index, f.event.kind) for f in report.findings] == [(3, "steer"), (5, "block")]


def test_a_finding_is_found_by_its_kind_and_for_one_release_by_its_retired_kind(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "loop.json", {"messages": openai_loop(12)})
    [conversation] = load(path)
    report = scan_conversation(LoopGuardConfig(), conversation)
    steer, stop = report.first("steer"), report.first("stop")
    assert (steer and steer.call_index, stop and stop.call_index) == (3, 7)
    with pytest.warns(DeprecationWarning, match="'warn' is deprecated: use 'steer'"):
        assert report.first("warn") is steer
    for retired in ("abort", "terminate"):
        with pytest.warns(DeprecationWarning, match=f"'{retired}' is deprecated: use 'stop'"):
            assert report.first(retired) is stop


def test_main_rejects_a_missing_subcommand() -> None:
    """`loop-guard` alone prints usage and exits with argparse's status."""
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2


def test_scan_names_the_same_error_detector_and_takes_its_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken tool asked for something new each time."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the course"}]
    for n in range(1, 9):
        messages.append(openai_call(n, "lookup", {"q": f"query {n}"}))
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{n}", "is_error": True,
             "content": "'str' object has no attribute 'get'"}
        )  # fmt: skip
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(messages))
    assert main(["scan", str(path)]) == 1
    out = capsys.readouterr().out
    assert "call    4  steer (same_error)" in out
    assert "call    6  block (same_error)" in out
    assert main(["scan", "--json", "--same-error-threshold", "6", str(path)]) == 1
    [report] = json.loads(capsys.readouterr().out)
    first = report["findings"][0]
    assert (first["call"], first["kind"], first["reason"]) == (6, "steer", "same_error")


def test_scan_with_the_guard_disabled_refuses_instead_of_reporting_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "loop.json"
    path.write_text(json.dumps(openai_loop(8)))
    monkeypatch.setenv("LOOP_GUARD_ENABLED", "false")
    assert main(["scan", str(path)]) == 2
    assert "disabled" in capsys.readouterr().err
    assert main(["scan", "--enabled", str(path)]) == 1


def test_scan_reads_the_guards_own_steer_in_openai_messages_as_no_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guarded run exported as OpenAI messages: the steer (`role: user`, `name:
    loop_guard`) does not start a request, so the stop is found as in the live run."""
    messages = openai_loop(8)
    steer = {"role": "user", "name": "loop_guard", "content": "LOOP GUARD: stop repeating"}
    messages.insert(7, steer)  # after the 3rd result
    path = tmp_path / "guarded.json"
    path.write_text(json.dumps(messages))
    assert main(["scan", "--json", str(path)]) == 1
    [report] = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in report["findings"]][-1] == "stop"


def test_tokens_the_model_never_reported_are_not_a_measured_zero(tmp_path: Path) -> None:
    """OpenAI messages carry no usage: the scan says so instead of counting 0 tokens; LangChain
    messages whose replies report `usage_metadata` have their tokens counted."""
    path = write(tmp_path / "loop.json", {"messages": openai_loop(12)})
    _, out, _ = scan("--json", str(path))
    [report] = json.loads(out)
    assert report["cost"]["model_calls"] > 0
    unknown = ("tokens", "tokens_saved", "tokens_kept_out")
    assert [report["cost"][key] for key in unknown] == [None, None, None]
    _, text, _ = scan(str(path))
    assert "tokens: not reported by the model" in text

    [conversation] = load(path)
    usage = {"input_tokens": 90, "output_tokens": 10, "total_tokens": 100}
    with_usage = [
        m.model_copy(update={"usage_metadata": usage}) if m.type == "ai" else m
        for m in conversation.messages
    ]
    measured = write(tmp_path / "lc.json", messages_to_dict(with_usage))
    _, out, _ = scan("--json", str(measured))
    [report] = json.loads(out)
    assert report["cost"]["tokens"] == 100 * report["cost"]["model_calls"]
    _, text, _ = scan(str(path), str(measured))
    assert "tokens: reported by the model in 1 of 2 conversations" in text


def test_the_scan_says_what_compaction_would_keep_out_of_each_model_call(tmp_path: Path) -> None:
    """An unguarded loop over a large result, recorded: each model call was sent the
    messages before its reply, and what `compact_repeats` keeps out of each is summed, its
    tokens at the call's rate (its reported input tokens per character it was sent)."""
    from langchain.agents import create_agent
    from langchain_core.messages import BaseMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError

    from loop_guard import compact_repeats
    from loop_guard.testing import ScriptedChatModel, stubborn, with_usage

    @tool
    def read_file(path: str) -> str:
        """Read a file."""
        return "the same page\n" * 300

    database = tmp_path / "threads.sqlite"
    saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
    script = with_usage(stubborn(("read_file", {"path": "notes.md"})), 900, 10)
    agent = create_agent(ScriptedChatModel(script=script), [read_file], checkpointer=saver)
    config = {"configurable": {"thread_id": "t"}, "recursion_limit": 20}
    with pytest.raises(GraphRecursionError):
        agent.invoke({"messages": [HumanMessage("Summarise notes.md")]}, config)

    def chars(messages: list[BaseMessage]) -> int:
        return sum(len(str(message.content)) for message in messages)

    [conversation] = load(database)
    history = conversation.messages
    sent = compact_repeats(history)
    inputs = [n for n, message in enumerate(history) if message.type == "ai"]
    kept = [chars(history[:n]) - chars(sent[:n]) for n in inputs]
    tokens = sum(round(k * 900 / chars(history[:n])) for k, n in zip(kept, inputs, strict=True))
    assert sum(kept) > 20 * len("the same page\n" * 300)  # each repeat, again at every call
    _, out, _ = scan("--json", str(database))
    [report] = json.loads(out)
    assert (report["cost"]["chars_kept_out"], report["cost"]["tokens_kept_out"]) == (
        sum(kept),
        tokens,
    )
    _, text, _ = scan(str(database))
    said = f"compact_repeats would keep out of the context: {sum(kept):,} characters, {tokens:,}"
    assert said in text
