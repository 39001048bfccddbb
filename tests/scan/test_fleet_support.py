"""`tests.support.fleet`: a generated fleet reads back whole, and the scan flags exactly the
threads of a loop kind, in SQLite and in PostgreSQL."""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import closing
from pathlib import Path

from loop_guard import LoopGuardConfig
from loop_guard.scan import EXIT_LOOP, load, run_scan
from tests.support.fleet import HEALTHY, KINDS, LOOPS, FleetTruth, postgres_fleet, sqlite_fleet

THREADS = 300


def scanned(source: str) -> dict[str, dict[str, object]]:
    """`loop-guard scan --json` of a source: each thread's report, by thread id."""
    out, err = io.StringIO(), io.StringIO()
    status = run_scan([source], LoopGuardConfig(), as_json=True, out=out, err=err)
    assert (status, err.getvalue()) == (EXIT_LOOP, "")
    return {r["conversation"].split(":", 1)[1]: r for r in json.loads(out.getvalue())}


def assert_flagged_by_kind(truth: FleetTruth, reports: dict[str, dict[str, object]]) -> None:
    # The subgraph threads' worker checkpoints are no threads of their own.
    assert sorted(reports) == sorted(truth.looping + truth.healthy)
    assert len(reports) == len(truth) == THREADS
    assert set(KINDS) == {*LOOPS, *HEALTHY}
    for kind in KINDS:
        assert truth.threads[kind], kind
    for thread in truth.looping:
        assert reports[thread]["first_steer"] is not None, thread
    for thread in truth.healthy:
        assert reports[thread]["findings"] == [], thread


def test_a_sqlite_fleet_is_flagged_by_kind(tmp_path: Path) -> None:
    database = tmp_path / "fleet.sqlite"
    truth = sqlite_fleet(database, THREADS)
    with closing(sqlite3.connect(database)) as conn:
        [(workers,)] = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE checkpoint_ns LIKE 'worker:%'"
        )
    assert workers == len(truth.threads["subgraph"])
    assert_flagged_by_kind(truth, scanned(str(database)))


def messages_by_thread(database: Path) -> dict[str, list[object]]:
    return {c.name.split(":", 1)[1]: list(c.messages) for c in load(database)}


def test_a_fleet_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    """Same seed, same threads (a smaller fleet is the start of a larger one); another seed,
    other args."""
    first, again, other = (tmp_path / f"{n}.sqlite" for n in ("first", "again", "other"))
    sqlite_fleet(first, 40)
    sqlite_fleet(again, 20)
    sqlite_fleet(other, 20, seed=1)
    larger, smaller = messages_by_thread(first), messages_by_thread(again)
    assert smaller == {thread: larger[thread] for thread in smaller}
    assert messages_by_thread(other).keys() == smaller.keys()
    assert messages_by_thread(other) != smaller


def test_a_postgres_fleet_is_flagged_by_kind_and_replaces_the_last(postgres: str) -> None:
    postgres_fleet(postgres, THREADS + 20, seed=1)  # its last 20 threads must go
    truth = postgres_fleet(postgres, THREADS)
    assert_flagged_by_kind(truth, scanned(postgres))
