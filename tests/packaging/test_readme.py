"""The README's Python snippets run as written, given the names a user would have.

Snippets fenced as `py` instead of `python` talk to a served agent; `tests/deploy/test_server.py`
runs that code against `langgraph dev`.
"""

from __future__ import annotations

from tests.support import ROOT
from tests.support.snippets import run_snippets, snippets, user_namespace

README = ROOT / "README.md"


def test_every_readme_snippet_runs() -> None:
    """Executed in order in one namespace holding a model, tools and the like."""
    assert len(snippets(README)) >= 5
    namespace = user_namespace()
    run_snippets(README, namespace)
    graph = namespace["graph"]
    answer = graph.invoke(namespace["inputs"], {"configurable": {"thread_id": "readme"}})
    assert answer["messages"][-1].content == "Giving up on that; here is my answer."
    assert any(m.name == "loop_guard" for m in answer["messages"])
    assert namespace["steer"] is None  # one call is no streak
