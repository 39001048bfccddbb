"""A mistake in a `LOOP_GUARD_*` variable never switches the guard off: a stubborn agent is
stopped exactly as with the defaults on every face, and the warning reaches the stderr of a
plain script that never set up logging (SPEC §6)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from loop_guard import LoopGuardConfigWarning, _config
from loop_guard.testing import ScriptedChatModel, stubborn
from tests.support.agents import ToolRuns, ask, guarded_agent, make_tools, run, timeline

BAD_VALUES = [
    {"LOOP_GUARD_WARN_THRESHOLD": "abc"},
    {"LOOP_GUARD_BLOCK_THRESHOLD": "2"},  # not above warn
    {"LOOP_GUARD_WARN_THRESHOLD": "5", "LOOP_GUARD_BLOCK_THRESHOLD": "5"},
    {"LOOP_GUARD_ABORT_THRESHOLD": "0"},
    {"LOOP_GUARD_ENABLED": "ture"},
    {"LOOP_GUARD_IGNORE_ERRORS": "sometimes"},
    {"LOOP_GUARD_TOOLS": "{not json"},
    {"LOOP_GUARD_REPEAT_WINDOW": "1"},
]


def stubborn_run(face: str) -> tuple[list[str], int]:
    """A model that keeps listing the same directory, guarded on `face`: its timeline (or
    what ended it, for the handler alone stops by raising) and the tool's runs."""
    model = ScriptedChatModel(script=stubborn(("list_dir", {"path": "."})))
    runs = ToolRuns()
    agent, config = guarded_agent(face, model, make_tools(runs))
    try:
        ended = timeline(run(agent, ask(), {**config, "recursion_limit": 40}, "invoke"))
    except Exception as error:
        ended = [type(error).__name__]
    return ended, runs.counts["list_dir"]


@pytest.mark.parametrize("face", ["middleware", "graph", "handler"])
@pytest.mark.parametrize(
    "env", BAD_VALUES, ids=lambda env: ",".join(f"{k}={v}" for k, v in env.items())
)
def test_a_bad_variable_stops_a_stubborn_agent_as_the_defaults_do(
    face: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = stubborn_run(face)
    assert defaults[1] == 4  # stopped, not run to the recursion limit
    monkeypatch.setattr(_config, "_said", set())
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    with pytest.warns(LoopGuardConfigWarning, match=next(iter(env))):
        guarded = stubborn_run(face)
    assert guarded == defaults


def test_disabled_by_the_one_switch_it_runs_unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast: `LOOP_GUARD_ENABLED=false` is the only way to turn it off."""
    monkeypatch.setenv("LOOP_GUARD_ENABLED", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoopGuardConfigWarning)  # nothing to say
        ended, runs = stubborn_run("middleware")
    assert ended == ["GraphRecursionError"]
    assert runs > 4


# The agent both scripts run: a stubborn model calling a tool that keeps failing.
AGENT = """
@tool
def read_file(path: str) -> str:
    \"\"\"Read a text file.\"\"\"
    return f"File not found: {path}"


model = ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
"""

SCRIPT = (
    """
from langchain.agents import create_agent
from langchain_core.tools import tool
from loop_guard import LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, stubborn

"""
    + AGENT
    + """for _ in range(3):  # a guard built three times says it once
    agent = create_agent(model, [read_file], middleware=[LoopGuardMiddleware()])
result = agent.invoke({"messages": [("user", "Summarise notes.md")]})
print(result["messages"][-1].content.splitlines()[0])
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "LOOP_GUARD_WARN_THRESHOLD",
            "abc",
            "LOOP_GUARD_WARN_THRESHOLD='abc' is not an integer >= 1; "
            "using the default warn_threshold=3",
        ),
        (
            "LOOP_GUARD_BLOCK_THRESHOLD",
            "2",
            "LOOP_GUARD_BLOCK_THRESHOLD='2': warn_threshold (3) must be less than "
            "block_threshold (2); using block_threshold=5",
        ),
        (  # a short name, the setting it begins named
            "LOOP_GUARD_WARN",
            "abc",
            "LOOP_GUARD_WARN is not a loop guard setting and is ignored; "
            "did you mean LOOP_GUARD_WARN_THRESHOLD?",
        ),
        (
            "LOOP_GUARD_BLOCK",
            "2",
            "LOOP_GUARD_BLOCK is not a loop guard setting and is ignored; "
            "did you mean LOOP_GUARD_BLOCK_THRESHOLD?",
        ),
        (
            "LOOP_GUARD_COLOUR",
            "red",
            "LOOP_GUARD_COLOUR is not a loop guard setting and is ignored; no setting is named so",
        ),
    ],
)
def test_a_plain_script_shows_the_warning_on_stderr(
    variable: str, value: str, said: str, tmp_path: Path
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    env: dict[str, Any] = {
        k: v for k, v in os.environ.items() if not k.startswith(("LOOP_GUARD_", "PYTHONWARN"))
    }
    env[variable] = value
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Stopped by loop_guard")
    assert done.stderr.count("LoopGuardConfigWarning") == 1
    assert f"agent.py:16: LoopGuardConfigWarning: {said}" in done.stderr


ASK_SCRIPT = (
    """
import sys

from langchain.agents import create_agent
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from loop_guard import LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, stubborn

"""
    + AGENT
    + """agent = create_agent(
    model, [read_file], middleware=[LoopGuardMiddleware(exit_behavior="ask")],
    checkpointer=InMemorySaver(),
)
config = {"configurable": {"thread_id": "t"}}
assert "__interrupt__" in agent.invoke({"messages": [("user", "Summarise notes.md")]}, config)
result = agent.invoke(Command(resume=eval(sys.argv[1])), config)
print(result["messages"][-1].content.splitlines()[0])
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("answer", ['"approv"', '{"type": "maybe"}'])
def test_a_mistyped_answer_to_ask_is_said_on_stderr(answer: str, tmp_path: Path) -> None:
    """A person's answer that is none of the accepted ones stops the request, as it did;
    a plain script that set up no logging now sees why, on stderr, with what is accepted."""
    script = tmp_path / "ask.py"
    script.write_text(ASK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOP_GUARD_", "PYTHONWARN"))}
    done = subprocess.run(
        [sys.executable, str(script), answer], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Stopped by loop_guard")
    said = f"UserWarning: loop guard: the answer {eval(answer)!r} is none of the accepted ones"
    assert said in done.stderr
    assert '"allow", "raise", "stop" or "answer"' in done.stderr
