"""The guarded example agent served by `langgraph dev`, driven over HTTP with `langgraph-sdk`.

One in-memory server (loopback, a free port, no reload, no browser, no tracing) serves
`examples/server/` for the whole module; each test talks to it on a thread of its own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

pytest.importorskip(
    "langchain.agents", reason="the example needs langchain: pip install -e .[agents]"
)
pytest.importorskip("langgraph_cli", reason='needs the CLI: pip install "langgraph-cli[inmem]"')
langgraph_sdk = pytest.importorskip(
    "langgraph_sdk", reason="needs the client: pip install langgraph-sdk"
)

pytestmark = pytest.mark.timeout(90)

EXAMPLE = ROOT / "examples" / "server"
LANGGRAPH = Path(sys.executable).parent / "langgraph"
READY_TIMEOUT = 60.0
TASK = "Summarise notes.md for me."
READ_NOTES = {"path": "notes.md"}
EXPECTED_KINDS = ["steer", "block", "block", "block", "stop"]
EVENT_KEYS = {
    "event",
    "kind",
    "reason",
    "conversation",
    "tool",
    "args",
    "streak",
    "blocks",
    "message",
    "cost",
}

if not all(importlib.util.find_spec(name) for name in ("langgraph_api", "langgraph_runtime_inmem")):
    pytest.skip(
        '`langgraph dev` needs the in-memory server: pip install "langgraph-cli[inmem]"'
        " (Python >= 3.11)",
        allow_module_level=True,
    )
if os.name != "posix":
    pytest.skip("the server is stopped as a POSIX process group", allow_module_level=True)
if not LANGGRAPH.exists():
    pytest.skip(f"no `langgraph` executable next to {sys.executable}", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`langgraph dev` serving a copy of examples/server/; yields its URL; always stopped.

    The copy keeps the in-memory runtime's `.langgraph_api/` files out of the source tree
    (the server writes them to its working directory); `loop_guard` itself is imported from
    the installed package.
    """
    workdir = tmp_path_factory.mktemp("served") / "server"
    shutil.copytree(
        EXAMPLE, workdir, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__")
    )
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOP_GUARD_")}
    env.update(
        LOOP_GUARD_EXAMPLE_MODEL="scripted",
        LANGSMITH_TRACING="false",
        LANGCHAIN_TRACING_V2="false",
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGGRAPH_NO_VERSION_CHECK="true",  # no PyPI look-up at start
        NO_COLOR="1",
    )
    log_path = workdir.parent / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(LANGGRAPH),
                "dev",
                "--config",
                "langgraph.json",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-browser",
                "--no-reload",
            ],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped as one
        )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until_ready(url, process, log_path)
        yield url
    finally:
        _stop(process)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"langgraph dev exited with {process.returncode}:\n{_tail(log_path)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"langgraph dev not ready after {READY_TIMEOUT:.0f} s:\n{_tail(log_path)}")


def _tail(log_path: Path, lines: int = 40) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def run_request(client: Any, thread_id: str) -> tuple[list[Any], list[dict[str, Any]]]:
    """One request on the thread, streamed with `updates` and `custom`: (parts, messages).

    `messages` are the thread's messages of this request, from its last user message on.
    """
    parts = list(
        client.runs.stream(
            thread_id,
            "agent",
            input={"messages": [{"role": "user", "content": TASK}]},
            stream_mode=["updates", "custom"],
        )
    )
    errors = [part.data for part in parts if part.event == "error"]
    assert not errors, errors
    messages = client.threads.get_state(thread_id)["values"]["messages"]
    start = max(
        i for i, m in enumerate(messages) if m["type"] == "human" and m.get("name") != "loop_guard"
    )
    return parts, messages[start:]


def guard_event(data: Any) -> dict[str, Any] | None:
    """A guard event on the `custom` stream: a dict tagged `"event": "loop_guard"`."""
    if isinstance(data, dict) and data.get("event") == "loop_guard":
        return data
    return None


def is_steer(message: dict[str, Any]) -> bool:
    return message["type"] == "human" and message.get("name") == "loop_guard"


def is_blocked(message: dict[str, Any]) -> bool:
    return message["type"] == "tool" and message["response_metadata"].get("loop_guard") == "blocked"


def check_request(messages: list[dict[str, Any]]) -> None:
    """Steered once at the 3rd identical result, calls 5-7 blocked, stopped after 7 model calls."""
    assert messages[0]["type"] == "human"
    assert messages[0]["content"] == TASK
    steers = [i for i, m in enumerate(messages) if is_steer(m)]
    assert len(steers) == 1, "steered exactly once"
    before_steer = messages[: steers[0]]
    assert sum(m["type"] == "tool" for m in before_steer) == 3, "steered at the 3rd identical step"
    assert all(
        m["status"] == "error" and m["content"] == "File not found: notes.md"
        for m in before_steer
        if m["type"] == "tool"
    )
    assert "LOOP GUARD" in messages[steers[0]]["content"]

    blocked = [m for m in messages if is_blocked(m)]
    assert len(blocked) == 3
    assert all(m["status"] == "error" and "LOOP GUARD" in m["content"] for m in blocked)

    stop = messages[-1]
    assert stop["type"] == "ai"
    assert stop["name"] == "loop_guard"
    assert stop["content"].startswith("Stopped by loop_guard")
    assert not stop["tool_calls"]

    model_calls = [m for m in messages if m["type"] == "ai" and m.get("name") != "loop_guard"]
    assert len(model_calls) == 7, "the request ended after 7 model calls"
    assert all(
        [(c["name"], c["args"]) for c in m["tool_calls"]] == [("read_file", READ_NOTES)]
        for m in model_calls
    )
    answered = {m["tool_call_id"] for m in messages if m["type"] == "tool"}
    asked = {c["id"] for m in model_calls for c in m["tool_calls"]}
    assert answered == asked, "every tool call answered: the thread stays valid"


def check_custom_events(
    parts: list[Any], messages: list[dict[str, Any]], thread_id: str
) -> list[dict[str, Any]]:
    """Each warning, block and stop arrives on the `custom` stream once, as a JSON-safe dict."""
    custom = [part.data for part in parts if part.event == "custom"]
    events = [event for event in map(guard_event, custom) if event is not None]
    assert len(events) == len(custom), "the example writes nothing else to the stream"
    assert [event["kind"] for event in events] == EXPECTED_KINDS, custom
    for event in events:
        assert set(event) >= EVENT_KEYS, sorted(event)
        assert json.loads(json.dumps(event)) == event
        assert event["conversation"] == thread_id
        assert event["tool"] == "read_file"
        assert event["args"] == READ_NOTES, "args as a JSON object, not a repr"
        assert isinstance(event["streak"], int)
        assert isinstance(event["message"], str)
    steer, *blocks, stop = events
    assert [event["reason"] for event in events] == ["repeat"] * 4 + ["abort_threshold"]
    assert steer["streak"] == 3
    assert steer["blocks"] == 0
    assert stop["blocks"] == 3
    assert steer["message"] == next(m["content"] for m in messages if is_steer(m))
    assert [event["blocks"] for event in blocks] == [1, 2, 3]
    assert [event["message"] for event in blocks] == [
        m["content"] for m in messages if is_blocked(m)
    ]
    assert stop["message"] == messages[-1]["content"]
    return events


@pytest.fixture
def client(server: str) -> Iterator[Any]:
    client = langgraph_sdk.get_sync_client(url=server, api_key=None)
    yield client
    client.close()


def test_served_agent_is_steered_blocked_and_stopped(client: Any) -> None:
    """Over HTTP: the steer, three blocked calls and the stop are in the thread, and the run
    ends after 7 model calls, with the thread idle and its history valid."""
    thread_id = client.threads.create()["thread_id"]
    parts, messages = run_request(client, thread_id)

    check_request(messages)
    updates = [part.data for part in parts if part.event == "updates"]
    assert updates, "the `updates` stream carried the graph's steps"
    streamed = json.dumps(updates)
    assert "Stopped by loop_guard" in streamed
    assert '"loop_guard": "blocked"' in streamed
    assert client.threads.get(thread_id)["status"] == "idle"
    runs = client.runs.list(thread_id)
    assert [run["status"] for run in runs] == ["success"]


def test_guard_events_arrive_on_the_custom_stream(client: Any) -> None:
    """steer, block x3, stop: each once on the `custom` stream, matching what the thread shows."""
    thread_id = client.threads.create()["thread_id"]
    parts, messages = run_request(client, thread_id)
    check_request(messages)
    check_custom_events(parts, messages, thread_id)


def test_a_second_request_on_the_thread_starts_clean(client: Any) -> None:
    """After a stop, the next request on the same thread is guarded afresh: steered again at
    the 3rd identical step, blocked at the 5th, stopped after 7 model calls, and its own
    warn, blocks and stop on the `custom` stream, counted from zero."""
    thread_id = client.threads.create()["thread_id"]
    _, first = run_request(client, thread_id)
    check_request(first)

    parts, second = run_request(client, thread_id)
    check_request(second)
    history = client.threads.get_state(thread_id)["values"]["messages"]
    assert len(history) == 2 * len(first)
    assert sum(is_steer(m) for m in history) == 2
    assert [run["status"] for run in client.runs.list(thread_id)] == ["success", "success"]

    events = check_custom_events(parts, second, thread_id)
    assert [event["blocks"] for event in events] == [0, 1, 2, 3, 3], "blocks counted afresh"


def test_a_served_agent_asks_a_person_and_resumes(client: Any) -> None:
    """Over HTTP, the asking agent pauses where it would stop: the thread is interrupted
    with the request `HumanInTheLoopMiddleware` makes; an approval resumes it (the call
    runs once more) until it asks again; a rejection ends it with the guard's stop."""
    thread_id = client.threads.create()["thread_id"]
    task = {"messages": [{"role": "user", "content": TASK}]}
    client.runs.wait(thread_id, "ask", input=task)
    thread = client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    (pending,) = [i for task_interrupts in thread["interrupts"].values() for i in task_interrupts]
    question = pending["value"]
    assert question["action_requests"][0]["name"] == "read_file"
    assert question["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"]
    assert question["loop_guard"]["blocks"] == 3

    approve = {"resume": {"decisions": [{"type": "approve"}]}}
    client.runs.wait(thread_id, "ask", command=approve)
    assert client.threads.get(thread_id)["status"] == "interrupted"
    reject = {"resume": {"decisions": [{"type": "reject"}]}}
    client.runs.wait(thread_id, "ask", command=reject)
    assert client.threads.get(thread_id)["status"] == "idle"
    messages = client.threads.get_state(thread_id)["values"]["messages"]
    assert messages[-1]["name"] == "loop_guard"
    assert messages[-1]["content"].startswith("Stopped by loop_guard")
    ran = [m for m in messages if m["type"] == "tool" and "File not found" in str(m["content"])]
    assert len(ran) == 4 + 1  # the loop's runs, and the one the approval allowed
    asked = {c["id"] for m in messages if m["type"] == "ai" for c in m.get("tool_calls") or []}
    answered = {m["tool_call_id"] for m in messages if m["type"] == "tool"}
    assert answered == asked, "every tool call answered: the thread stays valid"


def _example_module() -> Any:
    spec = importlib.util.spec_from_file_location("loop_guard_server_example", EXAMPLE / "agent.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_graph_brings_no_checkpointer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server provides persistence: the served graph is compiled without its own."""
    monkeypatch.delenv("LOOP_GUARD_EXAMPLE_MODEL", raising=False)
    module = _example_module()
    assert module.graph.checkpointer is None
    config = json.loads((EXAMPLE / "langgraph.json").read_text())
    assert config["graphs"] == {"agent": "./agent.py:graph", "ask": "./agent.py:ask_graph"}
    assert module.ask_graph.checkpointer is None
    assert (EXAMPLE / config["dependencies"][0] / "loop_guard" / "__init__.py").is_file()


def test_the_example_model_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset or `scripted`: the offline script; anything else goes to `init_chat_model`."""
    from loop_guard.testing import ScriptedChatModel

    module = _example_module()
    monkeypatch.delenv("LOOP_GUARD_EXAMPLE_MODEL", raising=False)
    assert isinstance(module.make_model(), ScriptedChatModel)
    monkeypatch.setenv("LOOP_GUARD_EXAMPLE_MODEL", "Scripted")
    assert isinstance(module.make_model(), ScriptedChatModel)
    monkeypatch.setenv("LOOP_GUARD_EXAMPLE_MODEL", "no-such-provider:some-model")
    with pytest.raises(ValueError, match="no-such-provider"):
        module.make_model()
