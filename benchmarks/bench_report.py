"""`loop-guard report` at fleet scale: time and peak memory against the number of threads.

For each size, a fleet of generated threads (`tests/support/fleet.py`: loops of every kind
and healthy work, one checkpoint each) is written into a new SQLite checkpoint database in a
temporary folder, timed on its own. Then `python -m loop_guard report DB -o OUT.html --json
OUT.json` runs in a child process: its wall time, and its peak resident memory as `os.wait4`
gives it for that one child (the peak of the largest of its processes: the report's own, or
one of its workers'). Prints a markdown table, then whether the peak memory grew with the
number of threads: the report is meant to keep it flat (`run.py report`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _harness import REPO, Scale, Section, Target, mib, print_flush, us

sys.path.insert(0, str(REPO))  # the fleet is the tests' own, also without an editable install
from tests.support.fleet import sqlite_fleet

SIZES = (10_000, 100_000)
QUICK_SIZES = (300, 600)
FLAT = 1.2
"""The largest size's peak memory over the smallest's, at most, for the memory to be flat."""

# ru_maxrss is in kilobytes on Linux, in bytes on macOS.
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


@dataclass(frozen=True, slots=True)
class Run:
    """One size: the fleet written, then reported on."""

    threads: int
    write_s: float
    database_bytes: int
    report_s: float
    peak_rss: int  # bytes
    reported: int | None  # the threads the report's JSON counts


def report(source: Path, out: Path, jobs: int | None = None) -> tuple[float, int, int | None]:
    """Run `loop-guard report` on a source: wall time, peak RSS (bytes), threads reported."""
    html, numbers, log = out / "report.html", out / "report.json", out / "report.log"
    argv = [sys.executable, "-m", "loop_guard", "report", str(source), "-o", str(html),
            "--json", str(numbers), *(["--jobs", str(jobs)] if jobs else [])]  # fmt: skip
    with log.open("w") as output:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, cwd=out)
        # wait4: the usage of this child alone (RUSAGE_CHILDREN would be the peak of every
        # child this process ever had).
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        msg = f"loop-guard report exited {child.returncode}:\n{log.read_text()[-2000:]}"
        raise RuntimeError(msg)
    counted = json.loads(numbers.read_text()).get("threads")
    return wall, usage.ru_maxrss * _RSS_UNIT, counted if isinstance(counted, int) else None


def run_size(threads: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        out = Path(folder)
        database = out / "fleet.sqlite"
        start = time.perf_counter()
        sqlite_fleet(database, threads)
        write_s = time.perf_counter() - start
        wall, rss, reported = report(database, out)
        return Run(threads, write_s, database.stat().st_size, wall, rss, reported)


def run(scale: Scale) -> Section:
    runs = []
    for threads in QUICK_SIZES if scale.quick else SIZES:
        print_flush(f"  {threads:,} threads ...", file=sys.stderr)
        runs.append(run_size(threads))
    columns = ["threads", "write", "written / s", "database", "report", "reported / s",
               "threads reported", "peak RSS"]  # fmt: skip
    rows = [
        [f"{r.threads:,}", us(r.write_s), f"{r.threads / r.write_s:,.0f}",
         mib(r.database_bytes), us(r.report_s), f"{r.threads / r.report_s:,.0f}",
         "?" if r.reported is None else f"{r.reported:,}", mib(r.peak_rss)]
        for r in runs
    ]  # fmt: skip
    small, large = runs[0], runs[-1]
    grown = large.peak_rss / small.peak_rss
    return Section(
        "report",
        "`loop-guard report` on a SQLite fleet",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
        columns=columns,
        rows=rows,
        targets=[
            Target.at_most(f"peak RSS, {large.threads:,} ÷ {small.threads:,} threads", FLAT, grown)
        ],
    )
