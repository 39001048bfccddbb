"""`loop-guard scan`: a flag for every setting, `--pi`, checkpoint databases in SQLite and in
PostgreSQL, the extras each reader needs, and databases that try to run code."""

from __future__ import annotations

import dataclasses
import email.parser
import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.load import dumpd
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer, _msgpack_default
from langgraph.checkpoint.sqlite import SqliteSaver
from packaging.requirements import Requirement
from packaging.version import Version

import loop_guard.scan
from loop_guard import LoopGuardConfig, ToolPolicy
from tests.support import ROOT, slow_except
from tests.support.agents import record_unguarded_loops
from tests.support.cli import run_cli

FIELDS = dataclasses.fields(LoopGuardConfig)
DEFAULTS = LoopGuardConfig()


def scan(*args: str) -> tuple[int, str, str]:
    """`loop-guard scan ARGS` in this process: (status, stdout, stderr)."""
    return run_cli("scan", *args)


def run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False
    )


def openai_loop(repeats: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise notes.md"}]
    for n in range(1, repeats + 1):
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type":
             "function", "function": {"name": "read", "arguments": '{"path": "notes.md"}'}}]}
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": "File not found"})
    return messages


def openai_cycle(laps: int) -> list[dict[str, Any]]:
    """read(A) -> bash(make) -> read(A) -> ...: a cycle, never a streak (Pi misses it)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the build"}]
    for n in range(laps * 2):
        name, args = [("read", '{"path": "a.c"}'), ("bash", '{"cmd": "make"}')][n % 2]
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{n}", "type":
             "function", "function": {"name": name, "arguments": args}}]}
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"{name} output"})
    return messages


# --- a flag for every configuration field ------------------------------------------------------


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def other_values(field: dataclasses.Field[Any]) -> tuple[list[str], str, Any]:
    """For one field: (flag arguments, a LOOP_GUARD_* value they must beat, the value expected).

    A field of a new kind fails here until the scan (and this test) learn it.
    """
    default = getattr(DEFAULTS, field.name)
    if isinstance(default, bool):
        wanted = not default
        return (
            [flag(field.name) if wanted else "--no-" + flag(field.name)[2:]],
            str(default),
            wanted,
        )
    if isinstance(default, int):
        return [flag(field.name), str(default + 1)], str(default + 2), default + 1
    if isinstance(default, frozenset):
        return [flag(field.name), "lint, todo"], "bash", frozenset({"lint", "todo"})
    if field.name == "tools":
        policy = '{"poll": {"block_threshold": 30, "volatile": true}}'
        expected = {"poll": ToolPolicy(block_threshold=30, volatile=True)}
        return [flag(field.name), policy], '{"other": {"ignore": true}}', expected
    pytest.fail(f"no scan flag known for LoopGuardConfig.{field.name} ({field.type})")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[LoopGuardConfig]:
    """The configuration `loop-guard scan` resolves, instead of scanning."""
    configs: list[LoopGuardConfig] = []

    def fake_run_scan(paths: Any, config: LoopGuardConfig, **kwargs: Any) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(loop_guard.scan, "run_scan", fake_run_scan)
    for name in os.environ:
        if name.startswith("LOOP_GUARD_"):
            monkeypatch.delenv(name)
    return configs


# `enabled` is the one field a scan refuses to turn off (tests/scan/test_scan.py).
SWITCHABLE = [f for f in FIELDS if f.name != "enabled"]


@pytest.mark.parametrize("field", SWITCHABLE, ids=[f.name for f in SWITCHABLE])
def test_every_configuration_field_has_a_flag_that_wins_over_its_variable(
    field: dataclasses.Field[Any], captured: list[LoopGuardConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived from the dataclass: a field added later cannot be forgotten."""
    arguments, variable, expected = other_values(field)
    assert scan(*arguments, "x.json")[0] == 0
    monkeypatch.setenv("LOOP_GUARD_" + field.name.upper(), variable)
    assert scan(*arguments, "x.json")[0] == 0
    first, second = captured
    for config in (first, second):
        assert getattr(config, field.name) == expected
        others = {f.name for f in FIELDS} - {field.name}
        assert {n: getattr(config, n) for n in others} == {n: getattr(DEFAULTS, n) for n in others}


@pytest.mark.parametrize("field", [f for f in SWITCHABLE if isinstance(getattr(DEFAULTS, f.name),
                                   bool)], ids=lambda f: f.name)  # fmt: skip
def test_every_detector_can_be_turned_on_and_off(
    field: dataclasses.Field[Any], captured: list[LoopGuardConfig]
) -> None:
    """`--detect-cycles` and `--no-detect-cycles`, whatever the default."""
    scan(flag(field.name), "x.json")
    scan("--no-" + flag(field.name)[2:], "x.json")
    assert [getattr(c, field.name) for c in captured] == [True, False]


def test_pi_starts_from_the_pi_settings_and_flags_still_win(
    captured: list[LoopGuardConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--pi` is LoopGuardConfig.pi(); a flag beats it, and it beats LOOP_GUARD_* variables."""
    scan("--pi", "x.json")
    scan("--pi", "--detect-cycles", "--warn-threshold", "2", "x.json")
    monkeypatch.setenv("LOOP_GUARD_DETECT_INTERLEAVED", "true")
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "7")
    scan("--pi", "x.json")
    pi, tuned, with_variables = captured
    assert pi == LoopGuardConfig.pi()
    assert tuned == LoopGuardConfig.pi(detect_cycles=True, warn_threshold=2)
    assert with_variables == LoopGuardConfig.pi(block_threshold=7)


def test_pi_replays_a_thread_as_the_pi_extension_would(tmp_path: Path) -> None:
    """A cycle is caught by default and not in Pi mode, where only streaks count."""
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps(openai_cycle(6)))
    status, out, _ = scan("--json", str(path))
    assert status == 1
    assert json.loads(out)[0]["findings"][0]["reason"] == "cycle"
    assert scan("--json", "--pi", str(path))[0] == 0
    assert scan("--json", "--pi", "--detect-cycles", str(path))[0] == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    slow_except(  # a process each: the first runs in the quick suite
        [
            (["--repeat-window", "many"], "--repeat-window"),
            (["--repeat-window", "1"], "repeat_window must be an integer >= 2"),
            (["--warn-threshold", "0"], "warn_threshold must be an integer >= 1"),
            (["--warn-threshold", "6"], "warn_threshold (6) must be less than block_threshold (5)"),
            (["--tools", "{poll"], "--tools: is not JSON"),
            (["--tools", '{"poll": {"block": 3}}'], "unknown tool policy option for 'poll'"),
            (["--tools", '{"poll": {"normalizer": "x"}}'], "cannot set a normalizer"),
            (["--detect-cycles=yes"], "--detect-cycles"),
        ],
        lambda case: case[1] == "--repeat-window",
    ),
)
def test_a_bad_flag_value_is_a_message_and_status_2(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    """Run as a real process: the value and what is wrong with it, no traceback."""
    path = tmp_path / "loop.json"
    path.write_text(json.dumps(openai_loop(3)))
    done = run([sys.executable, "-m", "loop_guard", "scan", *arguments, str(path)], cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_variable_is_a_message_and_status_2_not_a_silent_clean_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard keeps a default on a bad LOOP_GUARD_* value; a scan must not report with
    settings it was not given."""
    path = tmp_path / "loop.json"
    path.write_text(json.dumps(openai_loop(9)))
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "lots")
    status, out, err = scan(str(path))
    assert status == 2
    assert "LOOP_GUARD_BLOCK_THRESHOLD='lots'" in err
    assert out == ""
    assert scan("--block-threshold", "6", str(path))[0] == 1  # a flag replaces the variable
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "3")  # valid alone, not with warn 3
    status, _, err = scan(str(path))
    assert status == 2
    assert "LOOP_GUARD_BLOCK_THRESHOLD='3'" in err


# --- checkpoint databases: SQLite and PostgreSQL -----------------------------------------------


def start_postgres() -> str:
    """The URL of a PostgreSQL server for these tests.

    LOOP_GUARD_TEST_POSTGRES_URL when set (CI sets it with .ci/postgres.sh: a server that
    does not answer then fails the tests); otherwise .ci/postgres.sh starts one if the server
    is installed, and the tests are skipped if it is not.
    """
    import psycopg

    url = os.environ.get("LOOP_GUARD_TEST_POSTGRES_URL")
    if url is None:
        done = run(
            ["bash", str(ROOT / ".ci" / "postgres.sh")],
            cwd=ROOT,
            env={**os.environ, "LOOP_GUARD_PG_NO_INSTALL": "1"},
        )
        if done.returncode != 0:
            pytest.skip(
                "no PostgreSQL server: set LOOP_GUARD_TEST_POSTGRES_URL or install the Debian "
                f"package postgresql ({done.stderr.strip().splitlines()[-1:]})"
            )
        url = done.stdout.strip()
    with psycopg.connect(url, connect_timeout=10):
        pass  # a configured server that does not answer is an error, not a skip
    return url


@pytest.fixture(scope="session")
def postgres_server() -> str:
    return start_postgres()


@pytest.fixture
def postgres(postgres_server: str) -> Iterator[str]:
    """A fresh database of its own, dropped afterwards: the URL to it."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"loop_guard_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(postgres_server)
    yield "postgresql://{user}:{password}@{host}:{port}/{db}".format(**params, db=name)
    with psycopg.connect(make_conninfo(postgres_server), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_saver(url: str) -> Any:
    from langgraph.checkpoint.postgres import PostgresSaver

    return PostgresSaver.from_conn_string(url)


def test_a_langgraph_postgres_checkpointer_is_read_like_sqlite(
    postgres: str, tmp_path: Path
) -> None:
    """The same threads in PostgreSQL and in SQLite give the same findings."""
    with postgres_saver(postgres) as saver:
        saver.setup()
        record_unguarded_loops(saver, ("looping", "other"))
    database = tmp_path / "agent.sqlite"
    record_unguarded_loops(
        SqliteSaver(sqlite3.connect(database, check_same_thread=False)), ("looping", "other")
    )
    db_name = postgres.rsplit("/", 1)[1]

    status, out, err = scan("--json", "--thread", "looping", postgres)
    assert (status, err) == (1, "")
    [report] = json.loads(out)
    assert report["conversation"] == f"{db_name}:looping"
    assert (report["first_steer"], report["first_block"]) == (3, 5)

    status, out, _ = scan("--json", postgres, str(database))
    assert status == 1
    reports = json.loads(out)
    assert [r["conversation"] for r in reports] == [
        f"{db_name}:looping",
        f"{db_name}:other",
        "agent.sqlite:looping",
        "agent.sqlite:other",
    ]
    # The same decisions; each database's model run gave its calls ids of its own.
    strip = [
        {
            **{k: v for k, v in r.items() if k != "conversation"},
            "findings": [{**f, "call_id": None} for f in r["findings"]],
        }
        for r in reports
    ]
    assert all(f["call_id"] for r in reports for f in r["findings"] if f["kind"] != "stop")
    assert strip[:2] == strip[2:]

    status, _, err = scan("--thread", "missing", postgres)
    assert status == 2
    assert "no thread 'missing'" in err


def test_the_postgres_reader_takes_the_settings_flags_and_pi(postgres: str) -> None:
    """Replaying production threads with the settings they run."""
    with postgres_saver(postgres) as saver:
        saver.setup()
        record_unguarded_loops(saver, ("looping",))
    _, out, _ = scan("--json", "--block-threshold", "7", "--pi", postgres)
    assert json.loads(out)[0]["first_block"] == 7
    assert scan("--ignore-tools", "read_file", postgres)[0] == 0


def test_the_scan_never_writes_to_a_postgres_database(postgres: str) -> None:
    """A database without LangGraph's tables is unreadable, and stays without them."""
    import psycopg

    status, _, err = scan(postgres)
    assert status == 2
    assert "not a LangGraph checkpoint database" in err
    assert "Traceback" not in err
    with psycopg.connect(postgres) as connection:
        tables = connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)


def test_a_postgres_server_that_refuses_is_named_without_its_password(
    postgres_server: str,
) -> None:
    """A wrong password and a closed port: status 2, the URL without its password."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(postgres_server)
    wrong = "postgresql://{user}:sekrit-wrong@{host}:{port}/{dbname}".format(**params)
    status, _, err = scan(wrong)
    assert status == 2
    assert "sekrit-wrong" not in err
    assert "cannot connect" in err
    assert "Traceback" not in err
    status, _, err = scan("postgresql://someone:sekrit@127.0.0.1:1/nothing")
    assert status == 2
    assert "postgresql://someone:***@127.0.0.1:1/nothing" in err
    assert "sekrit" not in err


# --- a checkpoint database never runs code ------------------------------------------------------


class Payload:
    """A value that a checkpoint stores as an instruction to run `command` when loaded."""

    def __init__(self, kind: str, command: str) -> None:
        self.kind, self.command = kind, command

    def ext(self) -> ormsgpack.Ext:
        kinds = {  # the extension codes of LangGraph's msgpack serializer
            "constructor": (0, ["os", "system", self.command]),
            "positional": (1, ["subprocess", "call", [["sh", "-c", self.command]]]),
            "keywords": (2, ["subprocess", "run", {"args": self.command, "shell": True}]),
            "pydantic": (5, ["os", "system", {"command": self.command}, None]),
            "import": (0, ["loop_guard_hostile_module", "anything", "x"]),
        }
        code, body = kinds[self.kind]
        return ormsgpack.Ext(code, ormsgpack.packb(body))

    def __reduce__(self) -> tuple[Any, ...]:  # the pickle payload
        return os.system, (self.command,)


class HostileSerializer(JsonPlusSerializer):
    """Writes checkpoints the way an attacker with write access to the database would."""

    def __init__(self, payload: Payload) -> None:
        super().__init__()
        self.payload = payload

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if not has_payload(obj):
            return super().dumps_typed(obj)
        if self.payload.kind == "pickle":
            return "pickle", pickle.dumps(obj)
        if self.payload.kind.startswith("json"):
            return "json", json.dumps(obj, default=self.json_default).encode()
        return "msgpack", ormsgpack.packb(
            obj, default=self.msgpack_default, option=ormsgpack.OPT_NON_STR_KEYS
        )

    def msgpack_default(self, value: Any) -> Any:
        return value.ext() if isinstance(value, Payload) else _msgpack_default(value)

    def json_default(self, value: Any) -> Any:
        if not isinstance(value, Payload):
            return dumpd(value)
        if value.kind == "json-method":  # Path(marker).write_text("ran"), by safe types alone
            path = {"lc": 2, "type": "constructor", "id": ["pathlib", "Path"],
                    "args": [value.command.removeprefix("touch ")]}  # fmt: skip
            return {"lc": 2, "type": "constructor", "id": ["pathlib", "Path"],
                    "method": "write_text", "args": [path, "ran"]}  # fmt: skip
        return {"lc": 2, "type": "constructor", "id": ["os", "system"], "args": [value.command]}


def has_payload(value: Any) -> bool:
    if isinstance(value, Payload):
        return True
    if isinstance(value, dict):
        return any(has_payload(v) for v in value.values())
    return isinstance(value, list) and any(has_payload(v) for v in value)


PAYLOADS = [
    "constructor",
    "positional",
    "keywords",
    "pydantic",
    "import",
    "json",
    "json-method",  # ran with langgraph-checkpoint 4.0.3 to 4.1.0, whatever the settings
    "pickle",
]


def write_hostile_thread(saver: BaseCheckpointSaver[Any], payload: Payload) -> None:
    """Thread 'hostile': a looping conversation whose messages carry the payload."""
    messages: list[Any] = [HumanMessage("Summarise notes.md", id="h")]
    for n in range(6):
        call = {"name": "read", "args": {"path": "notes.md"}, "id": f"c{n}", "type": "tool_call"}
        messages += [AIMessage("", tool_calls=[call], id=f"a{n}"),
                     ToolMessage("File not found", tool_call_id=f"c{n}", id=f"t{n}")]  # fmt: skip
    messages.insert(1, payload)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": messages}
    checkpoint["channel_versions"] = {"messages": 1}
    saver.put(
        {"configurable": {"thread_id": "hostile", "checkpoint_ns": ""}},
        checkpoint,
        {"source": "loop", "step": 1, "parents": {}},
        {"messages": 1},
    )


def assert_payload_is_live(payload: Payload, marker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The payload does run under a permissive serializer: the test below is not vacuous."""
    monkeypatch.syspath_prepend(str(marker.parent))
    permissive = JsonPlusSerializer(
        pickle_fallback=True, allowed_json_modules=True, allowed_msgpack_modules=True
    )
    permissive.loads_typed(HostileSerializer(payload).dumps_typed({"m": [payload]}))
    assert marker.exists(), f"the {payload.kind} payload did not run even when allowed to"
    marker.unlink()
    sys.modules.pop("loop_guard_hostile_module", None)


def hostile_source(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, payload: Payload
) -> str:
    if backend == "sqlite":
        database = tmp_path / "hostile.sqlite"
        saver = SqliteSaver(sqlite3.connect(database, check_same_thread=False))
        saver.serde = HostileSerializer(payload)
        write_hostile_thread(saver, payload)
        return str(database)
    url = request.getfixturevalue("postgres")
    with postgres_saver(url) as saver:
        saver.setup()
        saver.serde = HostileSerializer(payload)
        write_hostile_thread(saver, payload)
    return url


@pytest.mark.slow
@pytest.mark.parametrize("kind", PAYLOADS)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_checkpoint_database_never_runs_code_stored_in_it(
    backend: str,
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Objects that would run a command or import a module when loaded stay inert data."""
    marker = tmp_path / "ran"
    (tmp_path / "loop_guard_hostile_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    payload = Payload(kind, f"touch {marker}")
    if kind != "json-method":  # LangGraph itself ignores a method named in data since 4.1.1
        assert_payload_is_live(payload, marker, monkeypatch)
    source = hostile_source(backend, tmp_path, request, payload)
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_STRICT_MSGPACK"}
    # The hostile module is importable: it must not be imported.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    done = run([sys.executable, "-m", "loop_guard", "scan", "--json", source], cwd=tmp_path,
               env=env)  # fmt: skip
    assert not marker.exists()
    assert "Traceback" not in done.stderr
    if kind == "pickle":  # the whole thread is one refused pickle
        assert done.returncode == 2
        assert "thread 'hostile'" in done.stderr
        return
    assert done.returncode == 1, done.stderr  # the rest of the thread was still read
    [report] = json.loads(done.stdout)
    assert (report["calls"], report["first_block"]) == (6, 5)


# --- the extras: a base install reading a database ---------------------------------------------


def requirements_closure(requirements: list[str], extras: set[str]) -> set[str]:
    """The installed distributions (names) a set of Requires-Dist lines pulls in."""
    found: set[str] = set()
    todo = [(Requirement(line), {""} | extras) for line in requirements]
    while todo:
        requirement, given = todo.pop()
        marker = requirement.marker
        if marker is not None and not any(marker.evaluate({"extra": e}) for e in given):
            continue
        dist = metadata.distribution(requirement.name)
        name = dist.metadata["Name"]
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in found:
            continue
        found.add(key)
        todo += [(Requirement(line), {""} | requirement.extras) for line in dist.requires or ()]
    return {key.split("[")[0] for key in found}


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel, from a copy of the source tree (nothing written here)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "loop_guard", source / "loop_guard",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    out = tmp_path_factory.mktemp("wheel")
    # Offline with this environment's setuptools when it is recent enough, else isolated.
    try:
        isolation = Version(metadata.version("setuptools")) < Version("69")
    except metadata.PackageNotFoundError:
        isolation = True
    done = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                *([] if isolation else ["--no-build-isolation"]), "--wheel-dir", str(out),
                str(source)], cwd=source)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("*.whl")
    return wheel


def install(wheel: Path, venv: Path, extras: set[str]) -> Path:
    """A virtual environment holding the wheel and exactly what it requires with these extras.

    The dependencies are this environment's installed files, linked: the same versions, no
    network. Returns the venv's `loop-guard` command.
    """
    done = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=venv, env=clean_env()).stdout.strip())  # fmt: skip
    for dist_name in requirements_closure(wheel_requirements(wheel), extras):
        dist = metadata.distribution(dist_name)
        root = Path(str(dist.locate_file(""))).resolve()
        for file in dist.files or ():
            source = Path(str(dist.locate_file(file))).resolve()
            if "__pycache__" in file.parts or not source.is_file() or root not in source.parents:
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(source)
    done = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                "--no-deps", "--no-index", str(wheel)], cwd=venv, env=clean_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    return venv / "bin" / "loop-guard"


@pytest.fixture(scope="session")
def base_install(project_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install langchain-loop-guard` and nothing else: the `loop-guard` command."""
    command = install(project_wheel, tmp_path_factory.mktemp("base") / "venv", set())
    for module in ("langgraph.checkpoint.sqlite", "langgraph.checkpoint.postgres", "psycopg"):
        probe = run([str(command.parent / "python"), "-c", f"import {module}"], cwd=command.parent,
                    env=clean_env())  # fmt: skip
        assert probe.returncode != 0, f"{module} is importable in the base install"
    return command


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture
def agent_database(tmp_path: Path) -> Path:
    database = tmp_path / "checkpoints.sqlite"
    record_unguarded_loops(
        SqliteSaver(sqlite3.connect(database, check_same_thread=False)), ("looping",)
    )
    return database


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "extra", "package"),
    [
        ("checkpoints.sqlite", "sqlite", "langgraph-checkpoint-sqlite"),
        ("postgresql://me@127.0.0.1:1/db", "postgres", "langgraph-checkpoint-postgres"),
    ],
)
def test_a_base_install_names_the_extra_a_reader_needs(
    base_install: Path, agent_database: Path, tmp_path: Path, source: str, extra: str,
    package: str,
) -> None:  # fmt: skip
    """No traceback: status 2, the package and the install command; other files still read."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(openai_loop(2)))
    done = run([str(base_install), "scan", source, str(good)], cwd=tmp_path, env=clean_env())
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert package in line
    assert f'pip install "langchain-loop-guard[{extra}]"' in line
    assert "good.json" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["sqlite", "postgres"])
def test_each_extra_brings_what_its_reader_needs(
    extra: str, project_wheel: Path, agent_database: Path, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """Base install plus exactly the extra's requirements: the reader works."""
    command = install(project_wheel, tmp_path / "venv", {extra})
    if extra == "sqlite":
        source = str(agent_database)
    else:
        source = request.getfixturevalue("postgres")
        with postgres_saver(source) as saver:
            saver.setup()
            record_unguarded_loops(saver, ("looping",))
    done = run([str(command), "scan", "--json", source], cwd=tmp_path, env=clean_env())
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)[0]["first_block"] == 5


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        parsed = email.parser.Parser().parsestr(archive.read(name).decode())
    return parsed.get_all("Requires-Dist", [])


def test_the_extras_declare_a_checkpoint_floor_with_safe_deserialization(
    project_wheel: Path,
) -> None:
    """langgraph-checkpoint 4.1.1: no pickle by default (4.0.0), an allow-list for the objects
    msgpack data may build (4.0.1), lc:2 JSON no longer calls a method it names (4.1.1)."""
    floors: dict[str, set[str]] = {}
    for line in wheel_requirements(project_wheel):
        requirement = Requirement(line)
        for extra in ("sqlite", "postgres"):
            if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
                floors.setdefault(extra, set()).add(f"{requirement.name}{requirement.specifier}")
    for extra in ("sqlite", "postgres"):
        assert "langgraph-checkpoint>=4.1.1" in floors[extra]
        assert "langchain-core>=1.2.5" in floors[extra]  # its Reviver(allowed_objects=...)
    assert "langgraph-checkpoint-sqlite>=3.0.3" in floors["sqlite"]  # works with aiosqlite 0.22
    assert "langgraph-checkpoint-postgres>=3.0.4" in floors["postgres"]
    assert "psycopg>=3.2.1" in floors["postgres"]  # 3.2.0[binary] asks for a missing 3.2.0.dev1
    assert loop_guard.scan.CHECKPOINT_FLOOR == (4, 1, 1)


def test_an_old_checkpoint_package_is_refused_not_trusted(
    agent_database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the floor the scan reads no database at all, and says how to upgrade."""
    real = metadata.version

    def fake(name: str) -> str:
        return "4.0.3" if name == "langgraph-checkpoint" else real(name)

    monkeypatch.setattr(metadata, "version", fake)
    status, out, err = scan(str(agent_database))
    assert status == 2
    assert "langgraph-checkpoint 4.0.3" in err
    assert 'pip install --upgrade "langchain-loop-guard[sqlite]"' in err
    assert out == ""
