"""The README's Python snippets run as written, given the names a user would have.

Snippets fenced as `py` instead of `python` talk to a served agent; `tests/deploy/test_server.py`
runs that code against `langgraph dev`.
"""

from __future__ import annotations

import importlib.util
import re
from collections import Counter
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from loop_guard.demo import demo_tools
from loop_guard.testing import ScriptedChatModel, obedient
from tests.support import ROOT

README = ROOT / "README.md"
SNIPPET = re.compile(r"```python\n(.*?)```", re.DOTALL)
# deepagents needs Python 3.11, so its snippets run only where it is installed.
DEEPAGENTS = importlib.util.find_spec("deepagents") is not None


def test_every_readme_snippet_runs() -> None:
    """Executed in order in one namespace holding a model, tools and the like."""
    snippets = SNIPPET.findall(README.read_text())
    assert len(snippets) >= 5
    model = ScriptedChatModel(script=obedient(("read_file", {"path": "notes.md"})))
    namespace: dict[str, Any] = {
        "model": model,
        "tools": demo_tools(Counter()),
        "call_model": lambda state: {"messages": [model.invoke(state["messages"])]},
        "checkpointer": InMemorySaver(),
        "inputs": {"messages": [HumanMessage("Summarise notes.md")]},
        "create_agent": create_agent,
    }
    for snippet in snippets:
        if "deepagents" in snippet and not DEEPAGENTS:
            continue
        exec(compile(snippet, str(README), "exec"), namespace)
    graph = namespace["graph"]
    answer = graph.invoke(namespace["inputs"], {"configurable": {"thread_id": "readme"}})
    assert answer["messages"][-1].content == "Giving up on that; here is my answer."
    assert any(m.name == "loop_guard" for m in answer["messages"])
    assert namespace["steer"] is None  # one call is no streak
