"""Damaged sources, generated: conversation files (JSON, JSON Lines) of every wrong shape, cut
short or full of junk, and real SQLite checkpoint databases with damaged rows and pages.

Whatever it reads, `loop-guard scan` and `loop-guard report` give a report, or name what they
could not read, one line each, with the documented exit status: never a traceback. The two
agree on how many conversations there were.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.scan.test_scan import openai_loop
from tests.support import examples
from tests.support.cli import run_cli
from tests.support.fleet import sqlite_fleet

FUZZ = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# What each command may answer with one source (`loop-guard --help`): the scan adds its 1 for
# a loop; a source is read (0), partly read (4), or fails (2), maybe after some threads.
SCAN_STATUSES = {0, 1, 2, 3, 4, 5}
REPORT_STATUSES = {0, 2, 4}


@pytest.fixture(autouse=True)
def bugs_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in loop-guard raises with its traceback, for the test to show."""
    monkeypatch.setenv("LOOP_GUARD_DEBUG", "1")


def check(source: Path) -> None:
    """Scan and report `source`: the statuses, the lines on stderr, and the same count."""
    status, out, err = run_cli("scan", "--json", str(source))
    assert status in SCAN_STATUSES, err
    lines = err.splitlines()
    assert all(line.startswith(f"loop-guard scan: {source}: ") for line in lines), err
    assert bool(lines) == bool(status & 6), err  # trouble, and only trouble, is named
    scanned = len(json.loads(out))
    status_report, out, err = run_cli("report", str(source), "--json", "-", "--jobs", "1")
    assert status_report in REPORT_STATUSES, err
    assert status_report == status & 6, err
    assert all(line.startswith(f"loop-guard report: {source}: ") for line in err.splitlines())
    if scanned or status_report != 2:
        assert json.loads(out)["threads"] == scanned
    else:
        assert out == ""  # no report of nothing


# --- conversation files ------------------------------------------------------------------------

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return value | junk


tool_call = st.fixed_dictionaries(
    {},
    optional={
        "id": maybe(st.sampled_from(["c1", "c2"])),
        "type": st.just("function"),
        "function": maybe(
            st.fixed_dictionaries(
                {"name": maybe(st.sampled_from(["read", "ls"]))},
                optional={
                    "arguments": maybe(st.sampled_from(['{"path": "a"}', "{", "[1]", '"x"']))
                },
            )
        ),
    },
)
openai_message = st.fixed_dictionaries(
    {"role": maybe(st.sampled_from(["user", "assistant", "tool", "system", "developer"]))},
    optional={
        "content": maybe(st.text(max_size=10)),
        "tool_calls": maybe(st.lists(maybe(tool_call), max_size=2)),
        "tool_call_id": maybe(st.sampled_from(["c1", "c2"])),
        "name": junk,
        "is_error": junk,
    },
)
langchain_message = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["human", "ai", "tool"])), "data": maybe(st.fixed_dictionaries(
        {"content": maybe(st.text(max_size=10))},
        optional={"tool_calls": junk, "tool_call_id": junk, "id": junk},
    ))}
)  # fmt: skip
messages = st.lists(maybe(openai_message | langchain_message), max_size=6)
conversation = maybe(messages | st.fixed_dictionaries({"messages": maybe(messages)}))
document = maybe(conversation | st.lists(conversation, min_size=1, max_size=3))


@st.composite
def conversation_files(draw: st.DrawFn) -> bytes:
    """JSON or JSON Lines of conversations, maybe cut short or with junk bytes in it."""
    if draw(st.booleans()):
        text = json.dumps(draw(document))
    else:
        lines = draw(st.lists(conversation | st.text(max_size=12), min_size=1, max_size=4))
        text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    data = text.encode()
    damage = draw(st.sampled_from(["none", "truncate", "insert"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "insert":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=6)) + data[at:]
    return data


@FUZZ
@given(content=conversation_files() | st.binary(max_size=64))
@example(content=b"[" * 100_000)  # nested deeper than the JSON parser recurses
@example(content=b'{"messages": [' * 3000)
@example(content=b"1" * 5000)  # more digits than Python turns into an int
@example(content=json.dumps({"messages": openai_loop(6)}).encode() + b"\n{broken")
@example(content=b'[{"role": "assistant", "tool_calls": [{"function": {"arguments": "[1]"}}]}]')
@example(content=b'[{"role": "assistant", "tool_calls": ["read"]}]')
@example(content=b'[{"role": "user", "content": [1, 2]}]')
def test_a_damaged_conversation_file(content: bytes, tmp_path: Path) -> None:
    source = tmp_path / "run.json"
    source.write_bytes(content)
    check(source)


# --- SQLite checkpoint databases ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five threads written by a real SqliteSaver."""
    path = tmp_path_factory.mktemp("fleet") / "fleet.sqlite"
    sqlite_fleet(path, 5)
    return path


# A message object the serializer builds without validating it (pydantic's `model_construct`,
# LangGraph's fallback when the fields do not validate), its fields anything.
MESSAGE_TYPES = [("langchain_core.messages.ai", "AIMessage"),
                 ("langchain_core.messages.tool", "ToolMessage"),
                 ("langchain_core.messages.human", "HumanMessage")]  # fmt: skip
unvalidated_message = st.builds(
    lambda kind, fields: ormsgpack.Ext(5, ormsgpack.packb([*kind, fields, "model_validate_json"])),
    st.sampled_from(MESSAGE_TYPES),
    st.fixed_dictionaries(
        {},
        optional={
            "content": maybe(st.text(max_size=8)),
            "tool_calls": maybe(
                st.lists(
                    st.fixed_dictionaries({"name": junk, "args": junk, "id": junk}), max_size=2
                )
            ),
            "tool_call_id": junk,
            "id": junk,
            "name": junk,
            "usage_metadata": junk,
            "status": junk,
            "type": junk,
        },
    ),
)
checkpoint_value = st.one_of(
    junk,
    st.fixed_dictionaries({"channel_values": junk}),
    st.fixed_dictionaries({"channel_values": st.fixed_dictionaries({"messages": junk})}),
    st.fixed_dictionaries({"channel_values": st.fixed_dictionaries(
        {"messages": st.lists(unvalidated_message | junk, max_size=4)}
    )}),
)  # fmt: skip


def fresh(tmp_path: Path) -> Path:
    """A path of its own for each example: SQLite keeps a write-ahead log next to a database,
    which would carry one example's writes into the next."""
    return Path(tempfile.mkdtemp(dir=tmp_path)) / "fleet.sqlite"


@st.composite
def damaged_rows(draw: st.DrawFn, original: bytes) -> tuple[str | None, bytes]:
    """A checkpoint row's type and blob: junk, or the original cut short or with a byte
    changed."""
    how = draw(st.sampled_from(["value", "bytes", "truncate", "flip"]))
    kind = draw(st.sampled_from(["msgpack", "msgpack", "json", "pickle", "bytes", None, "x"]))
    if how == "value":
        return kind, ormsgpack.packb(draw(checkpoint_value))
    if how == "bytes":
        return kind, draw(st.binary(max_size=64))
    if how == "truncate":
        return "msgpack", original[: draw(st.integers(0, len(original) - 1))]
    at = draw(st.integers(0, len(original) - 1))
    return "msgpack", original[:at] + bytes([original[at] ^ draw(st.integers(1, 255))]) + original[
        at + 1 :
    ]


@FUZZ
@given(data=st.data())
def test_a_checkpoint_database_with_damaged_rows(
    fleet: Path, tmp_path: Path, data: st.DataObject
) -> None:
    source = fresh(tmp_path)
    shutil.copy(fleet, source)
    with sqlite3.connect(source) as connection:
        stored = dict(connection.execute("SELECT rowid, checkpoint FROM checkpoints"))
        for rowid in data.draw(st.lists(st.sampled_from(sorted(stored)), min_size=1, max_size=3)):
            original = stored[rowid]
            column = data.draw(st.sampled_from(["checkpoint", "metadata"]))
            kind, blob = data.draw(damaged_rows(original))
            connection.execute(
                f"UPDATE checkpoints SET type = ?, {column} = ? WHERE rowid = ?",
                (kind, blob, rowid),
            )
    connection.close()
    check(source)


@FUZZ
@given(data=st.data())
def test_a_damaged_database_file(fleet: Path, tmp_path: Path, data: st.DataObject) -> None:
    """The file itself cut short, or bytes overwritten in its pages."""
    content = fleet.read_bytes()
    if data.draw(st.booleans()):
        content = content[: data.draw(st.integers(16, len(content) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(100, len(content) - 8))
            content = (
                content[:at] + data.draw(st.binary(min_size=1, max_size=8)) + content[at + 8 :]
            )
    source = fresh(tmp_path)
    source.write_bytes(content)
    check(source)
