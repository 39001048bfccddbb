"""The demo and the command line: what a newcomer runs first."""

from __future__ import annotations

import io

import pytest

from loop_guard.cli import main
from loop_guard.demo import run_demo
from tests.support.cli import run_process


def test_demo_shows_the_guard_stopping_the_stubborn_agent() -> None:
    """The demo runs offline, exits 0, and reports the calls it saved."""
    out = io.StringIO()
    assert run_demo(out) == 0
    text = out.getvalue()
    assert "100 model calls, 100 tool runs, ended by LangGraph's recursion limit" in text
    assert text.count("7 model calls, 4 tool runs, ended by loop_guard") == 2
    assert "Saved 93 model calls and 96 tool runs." in text
    # The guard's count of the loop, and the scan's of the unguarded run: what it saved
    # there is what the live run saved.
    assert "6 model calls, 3 tool runs and 7,200 tokens spent in the loop; 3 tool runs" in text
    assert "saved by the guard: 93 model calls, 96 tool runs, 111,600 tokens" in text
    assert text.count("⛔ blocked") == 9
    assert text.count("⚠ steer") == 3
    assert "guard  ■ stopped  asked the model for its answer, with no tools" in text
    assert "8 model calls, 4 tool runs, ended by loop_guard, with the model's own answer" in text
    # A scripted person, asked where the guard would stop: approves once (the call runs,
    # 3 more are blocked), then stops the request.
    assert "after 7 model calls: read_file 4 times in a row, 3 calls blocked" in text
    assert "after 10 model calls: read_file 5 times in a row, 6 calls blocked" in text
    assert "10 model calls, 5 tool runs, ended by the person, asked by loop_guard" in text
    assert "\033[" not in text  # no colours when not on a terminal


def test_demo_command_runs_as_a_module() -> None:
    """`python -m loop_guard demo` works from a fresh interpreter."""
    done = run_process("demo")
    assert done.returncode == 0, done.stderr
    assert "Saved 93 model calls" in done.stdout
    assert done.stderr == ""


def test_unknown_model_gives_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    """--model with a provider that is not installed: exit 2, a hint, no traceback."""
    assert main(["demo", "--model", "no-such-provider:some-model"]) == 2
    err = capsys.readouterr().err
    assert "cannot start the model 'no-such-provider:some-model'" in err
    assert "Traceback" not in err


def test_a_real_chat_model_runs_through_the_same_agent() -> None:
    """Any BaseChatModel can stand in for the scripted one (here: a scripted one again)."""
    from loop_guard.testing import ScriptedChatModel, obedient

    out = io.StringIO()
    model = ScriptedChatModel(script=obedient(("read_file", {"path": "notes.md"})))
    assert run_demo(out, model=model) == 0
    assert "⚠ steer" in out.getvalue()
    assert "ended by the model's answer" in out.getvalue()
