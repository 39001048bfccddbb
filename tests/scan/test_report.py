"""`loop-guard report`: a fleet's numbers, checked thread by thread against the scan, from
SQLite and PostgreSQL checkpoint databases of generated threads, in one process and in
several."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loop_guard import LoopCost, LoopGuardConfig
from loop_guard._readers import load
from loop_guard.cli import main
from loop_guard.report import build_report
from loop_guard.scan import Report, scan_conversation
from tests.support.fleet import FleetTruth, postgres_fleet, sqlite_fleet

THREADS = 2000
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FleetTruth]:
    path = tmp_path_factory.mktemp("fleet") / "fleet.sqlite"
    return path, sqlite_fleet(path, THREADS, seed=1)


def expected(source: Path | str, config: LoopGuardConfig) -> dict[str, Any]:
    """The report's numbers, computed from the scan of each thread on its own."""
    reports = [scan_conversation(config, conversation) for conversation in load(source)]
    kinds = [{f.event.kind for f in r.findings} for r in reports]
    shapes: Counter[str] = Counter()
    for report in reports:
        shapes.update(
            {f.event.reason for f in report.findings if f.event.reason and f.event.kind != "stop"}
        )
    cost = LoopCost()
    for report in reports:
        cost += report.cost
    return {
        "threads": len(reports),
        "steered": sum(bool(k & {"steer", "block", "stop"}) for k in kinds),
        "blocked": sum(bool(k & {"block", "stop"}) for k in kinds),
        "stopped": sum("stop" in k for k in kinds),
        "shapes": shapes,
        "cost": cost,
        "worst": max(r.cost.model_calls for r in reports),
        "reports": reports,
    }


def check(numbers: dict[str, Any], truth: dict[str, Any]) -> None:
    assert numbers["threads"] == truth["threads"]
    outcomes = numbers["outcomes"]
    assert (outcomes["steered"], outcomes["blocked"], outcomes["stopped"]) == (
        truth["steered"],
        truth["blocked"],
        truth["stopped"],
    )
    assert outcomes["clean"] == truth["threads"] - truth["steered"]
    assert {k: v for k, v in numbers["shapes"].items() if v} == dict(truth["shapes"])
    assert LoopCost(**numbers["cost"]) == truth["cost"]
    assert numbers["worst"][0]["model_calls"] == truth["worst"]
    assert sum(row["threads"] for row in numbers["loop_lengths"]) == sum(
        r.cost.model_calls > 0 for r in truth["reports"]
    )


def test_a_sqlite_fleet_adds_up_to_its_threads_scans(fleet: tuple[Path, FleetTruth]) -> None:
    path, truth = fleet
    numbers = build_report([path], LoopGuardConfig()).to_json()
    wanted = expected(path, LoopGuardConfig())
    check(numbers, wanted)
    assert numbers["threads"] == THREADS  # a subgraph's checkpoints are no thread of their own
    # Every loop shape of the fleet is there (a scan knows no tools, so calls to a missing
    # one are a tool failing the same way whatever its args), and no healthy thread is flagged.
    shapes = ("repeat", "cycle", "interleaved", "returned", "same_error")
    assert all(numbers["shapes"][shape] for shape in shapes)
    flagged = {r.name.partition(":")[2] for r in wanted["reports"] if r.findings}
    for kind in ("polling", "varied"):
        assert not flagged & set(truth.threads[kind]), kind


def test_worker_processes_give_the_same_report(fleet: tuple[Path, FleetTruth]) -> None:
    path, _ = fleet
    alone = build_report([path], LoopGuardConfig()).to_json()
    shared = build_report([path], LoopGuardConfig(), jobs=2).to_json()
    del alone["generated"], shared["generated"]  # when each was made
    assert shared == alone


def test_a_comparison_lists_the_threads_other_settings_change(
    fleet: tuple[Path, FleetTruth],
) -> None:
    path, _ = fleet
    pi = LoopGuardConfig.pi()
    numbers = build_report([path], LoopGuardConfig(), compare=("--pi", pi)).to_json()
    ours, theirs = expected(path, LoopGuardConfig()), expected(path, pi)
    compare = numbers["compare"]
    assert compare["label"] == "--pi"
    assert LoopCost(**compare["cost"]) == theirs["cost"]
    changed = sum(
        _outcome(a) != _outcome(b) for a, b in zip(ours["reports"], theirs["reports"], strict=True)
    )
    assert changed > 0  # Pi sees none of the cycles, interleaved repeats, unknown tools
    assert compare["changed_count"] == changed
    assert compare["changed"]
    assert all(row["before"] != row["after"] for row in compare["changed"])


def _outcome(report: Report) -> str:
    kinds = {f.event.kind for f in report.findings}
    for outcome, found in (("stopped", {"stop"}), ("blocked", {"block"}),
                           ("steered", {"steer"})):  # fmt: skip
        if kinds & found:
            return outcome
    return "clean"


def test_a_postgres_fleet_adds_up_to_its_threads_scans(postgres: str) -> None:
    postgres_fleet(postgres, THREADS, seed=2)  # a database of its own: other tests write too
    numbers = build_report([postgres], LoopGuardConfig(), jobs=2).to_json()
    check(numbers, expected(postgres, LoopGuardConfig()))


def test_the_command_writes_the_page_and_the_json(
    fleet: tuple[Path, FleetTruth], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = fleet
    page, numbers = tmp_path / "report.html", tmp_path / "report.json"
    status = main(["report", str(path), "-o", str(page), "--json", str(numbers), "--jobs", "1",
                   "--compare=--pi", "--worst", "5"])  # fmt: skip
    assert status == 0
    written = json.loads(numbers.read_text())
    assert written["threads"] == THREADS
    assert len(written["worst"]) == 5
    assert written["compare"]["label"] == "--pi"
    html = page.read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert 'data-chart="timeline"' in html
    assert f"{THREADS:,} threads" in capsys.readouterr().out


def test_an_unreadable_source_is_named_and_counted(
    fleet: tuple[Path, FleetTruth], tmp_path: Path
) -> None:
    path, _ = fleet
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    err = io.StringIO()
    from loop_guard.report import run_report

    status = run_report([path, broken], LoopGuardConfig(), html=None,
                        json_out=tmp_path / "r.json", jobs=1, err=err)  # fmt: skip
    assert status == 2
    assert "broken.json" in err.getvalue()
    written = json.loads((tmp_path / "r.json").read_text())
    assert (written["threads"], written["unreadable"]) == (THREADS, 1)


def test_the_fleets_page_renders_in_a_browser(
    fleet: tuple[Path, FleetTruth], tmp_path: Path
) -> None:
    """The page of the generated fleet, opened in headless Chromium: every chart, and a
    timeline per worst thread with the guard's marks; its screenshot is kept."""
    from tests.support.browser import ReportPage, artifacts, chromium, need_chromium

    need_chromium()
    path, _ = fleet
    page = tmp_path / "fleet.html"
    assert main(["report", str(path), "-o", str(page), "--jobs", "2", "--compare=--pi"]) == 0
    opened = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert opened.returncode == 0, opened.stderr[-2000:]
    dom = ReportPage(opened.stdout)
    charts = {"outcomes", "shapes", "tools", "cost", "loop-length", "timeline", "compare"}
    assert set(dom.charts) == charts
    assert dom.charts.count("timeline") == 10
    shot = artifacts("report") / "fleet.png"
    shot.unlink(missing_ok=True)
    taken = chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,3000",
                     page.as_uri())  # fmt: skip
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.stat().st_size > 10_000
