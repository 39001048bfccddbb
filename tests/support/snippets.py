"""Running the Python snippets of a Markdown file (the README, the documentation pages) as a
user would: in order, in one namespace that holds what a user already has (a chat model, tools,
a node function, a checkpointer, inputs, `create_agent`).

Only fences marked `python` run; snippets fenced `py` talk to a served agent, a database or a
real model provider and are exempt (`tests/deploy/test_server.py` runs the served ones against
`langgraph dev`).
"""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard.demo import demo_tools
from loop_guard.testing import ScriptedChatModel, obedient

SNIPPET = re.compile(r"```python\n(.*?)```", re.DOTALL)
# deepagents needs Python 3.11, so its snippets run only where it is installed.
DEEPAGENTS = importlib.util.find_spec("deepagents") is not None


def snippets(path: Path) -> list[str]:
    """The `python` snippets of a Markdown file, in order."""
    return SNIPPET.findall(path.read_text())


def user_namespace() -> dict[str, Any]:
    """The names a user has before a snippet runs: a scripted model that reads a file once
    and answers, the demo's tools, a node function calling the model, and the like."""
    model = ScriptedChatModel(script=obedient(("read_file", {"path": "notes.md"})))
    return {
        "model": model,
        "tools": demo_tools(Counter()),
        "call_model": lambda state: {"messages": [model.invoke(state["messages"])]},
        "checkpointer": InMemorySaver(),
        "inputs": {"messages": [HumanMessage("Summarise notes.md")]},
        "create_agent": create_agent,
    }


def run_snippets(path: Path, namespace: dict[str, Any]) -> int:
    """Execute the file's `python` snippets in order in `namespace`; returns how many ran
    (those that need deepagents are skipped where it is not installed)."""
    ran = 0
    for snippet in snippets(path):
        if "deepagents" in snippet and not DEEPAGENTS:
            continue
        exec(compile(snippet, str(path), "exec"), namespace)
        ran += 1
    return ran
