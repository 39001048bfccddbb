"""A guarded agent for `langgraph dev` (and LangSmith Deployment): see README.md here.

`graph` is a `create_agent` agent with `LoopGuardMiddleware`; `ask_graph` the same agent
whose guard asks a person where it would stop. Its model comes from the
`LOOP_GUARD_EXAMPLE_MODEL` environment variable:

- unset or `scripted` (the default): a scripted model, offline, no API key, that keeps
  reading a file that does not exist, so the guard steers it, blocks it, then stops it;
- anything else, e.g. `openai:gpt-4o-mini`: `langchain.chat_models.init_chat_model(value)`
  (the provider's package and API key must be installed).

The graph is compiled without a checkpointer: the server provides persistence, so
the guard's state lives in each thread's checkpoints.
"""

from __future__ import annotations

import os
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool, ToolException, tool

from loop_guard import ExitBehavior, LoopGuardMiddleware
from loop_guard.testing import ScriptedChatModel, stubborn

MODEL_VARIABLE = "LOOP_GUARD_EXAMPLE_MODEL"
"""The environment variable that chooses the model; unset or `scripted` for the script."""

FILES = {"README.md": "# Project\nloop_guard stops agents that repeat themselves.\n"}
"""The files `read_file` can read: `notes.md` is not one of them."""

SYSTEM_PROMPT = "You are a helpful assistant with a small read-only file system."


@tool
def read_file(path: str) -> str:
    """Read a text file."""
    if path not in FILES:
        raise ToolException(f"File not found: {path}")
    return FILES[path]


read_file.handle_tool_error = True  # the model sees the error as a tool result


@tool
def list_dir(path: str = ".") -> str:
    """List the files in a directory."""
    return "  ".join(sorted(FILES))


TOOLS: list[BaseTool] = [read_file, list_dir]


def make_model(name: str | None = None) -> BaseChatModel:
    """The model named by `name` (default: the environment variable), or the script."""
    name = (os.environ.get(MODEL_VARIABLE) if name is None else name) or "scripted"
    if name.strip().lower() == "scripted":
        return ScriptedChatModel(script=stubborn(("read_file", {"path": "notes.md"})))
    from langchain.chat_models import init_chat_model

    return init_chat_model(name)


def make_graph(model: BaseChatModel | None = None, exit_behavior: ExitBehavior = "end") -> Any:
    """The guarded agent, compiled without a checkpointer (the server brings one)."""
    return create_agent(
        model or make_model(),
        TOOLS,
        system_prompt=SYSTEM_PROMPT,
        middleware=[LoopGuardMiddleware(exit_behavior=exit_behavior)],
    )


graph = make_graph()
ask_graph = make_graph(exit_behavior="ask")
"""The same agent whose guard asks a person where it would stop (`exit_behavior="ask"`)."""
