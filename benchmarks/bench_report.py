"""`loop-guard report` at fleet scale: time and peak memory against the number of threads.

    .venv/bin/python benchmarks/bench_report.py [--quick] [--sizes 10000,100000] [--jobs N]

For each size, a fleet of generated threads (`tests/support/fleet.py`: loops of every kind
and healthy work, one checkpoint each) is written into a new SQLite checkpoint database in a
temporary folder, timed on its own. Then `python -m loop_guard report DB -o OUT.html --json
OUT.json` runs in a child process: its wall time, and its peak resident memory as `os.wait4`
gives it for that one child (the peak of the largest of its processes: the report's own, or
one of its workers'). Prints a markdown table, then whether the peak memory grew with the
number of threads: the report is meant to keep it flat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _harness import REPO, machine_info, markdown_table, mib, print_flush, us

sys.path.insert(0, str(REPO))  # the fleet is the tests' own, also without an editable install
from tests.support.fleet import sqlite_fleet

SIZES = (10_000, 100_000)
QUICK_SIZES = (1_000, 5_000)
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


def report(database: Path, out: Path, jobs: int | None) -> tuple[float, int, int | None]:
    """Run `loop-guard report` on a database: wall time, peak RSS (bytes), threads reported."""
    html, numbers, log = out / "report.html", out / "report.json", out / "report.log"
    argv = [sys.executable, "-m", "loop_guard", "report", str(database), "-o", str(html),
            "--json", str(numbers), *([] if jobs is None else ["--jobs", str(jobs)])]  # fmt: skip
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


def run_size(threads: int, jobs: int | None) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        out = Path(folder)
        database = out / "fleet.sqlite"
        start = time.perf_counter()
        sqlite_fleet(database, threads)
        write_s = time.perf_counter() - start
        wall, rss, reported = report(database, out, jobs)
        return Run(threads, write_s, database.stat().st_size, wall, rss, reported)


def table(runs: list[Run]) -> str:
    columns = ["threads", "write", "written / s", "database", "report", "reported / s",
               "threads reported", "peak RSS"]  # fmt: skip
    rows = [
        [f"{r.threads:,}", us(r.write_s), f"{r.threads / r.write_s:,.0f}",
         mib(r.database_bytes), us(r.report_s), f"{r.threads / r.report_s:,.0f}",
         "?" if r.reported is None else f"{r.reported:,}", mib(r.peak_rss)]
        for r in runs
    ]  # fmt: skip
    return markdown_table(columns, rows)


def growth(runs: list[Run]) -> str:
    """Whether the peak memory grew from the smallest size to the largest."""
    small, large = min(runs, key=lambda r: r.threads), max(runs, key=lambda r: r.threads)
    if small is large:
        return "One size only: nothing to compare the peak memory with."
    grown = large.peak_rss / small.peak_rss
    per_thread = (large.peak_rss - small.peak_rss) / (large.threads - small.threads)
    verdict = "it grew with N" if grown > FLAT else f"flat (within {FLAT - 1:.0%})"
    return (
        f"Peak RSS at {large.threads:,} threads is {grown:.2f}x that at {small.threads:,}"
        f" ({large.threads / small.threads:.0f}x the threads; {per_thread:,.0f} bytes per"
        f" extra thread): {verdict}."
    )


def sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part.replace("_", "")) for part in text.split(","))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}")
    parser.add_argument("--sizes", type=sizes, help=f"comma-separated (default {SIZES})")
    parser.add_argument("--jobs", type=int, help="the report's --jobs (default: its own)")
    args = parser.parse_args(argv)
    chosen = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    runs = []
    for threads in chosen:
        print_flush(f"{threads:,} threads ...", file=sys.stderr)
        runs.append(run_size(threads, args.jobs))
    jobs = "the report's default" if args.jobs is None else str(args.jobs)
    print(f"## `loop-guard report` on a SQLite fleet (--jobs: {jobs})\n")
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(table(runs))
    print()
    print(growth(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
