"""`loop-guard report`: how often a fleet of recorded threads looped, what it cost, and where.

Streams every conversation of its sources (the scan's: files, folders of them, LangGraph
SQLite and PostgreSQL checkpointers) through the offline scan, one at a time, and keeps only
what the report shows: counts, the cost (`LoopCost`), a histogram, and the worst few threads.
Memory stays flat however many threads there are. Sources split into pieces (a database's
threads, a page at a time; each file) that worker processes scan side by side; their tallies
add up. The page is one self-contained HTML file (`_report_page.render_page`); `--json`
gives the same numbers.
"""

from __future__ import annotations

import heapq
import json
import multiprocessing
import os
import sys
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TextIO

from loop_guard._config import LoopGuardConfig
from loop_guard._detectors import SHAPES
from loop_guard._readers import (
    Reading,
    ScanError,
    display_name,
    is_postgres_url,
    source_kind,
    stream,
    thread_pages,
)
from loop_guard._values import NO_COST, LoopCost
from loop_guard._window import Window
from loop_guard.scan import (
    EXIT_UNREADABLE,
    Report,
    cost_json,
    exit_status,
    scan_conversation,
    scan_each,
)

__all__ = ["FleetReport", "Outcome", "build_report", "run_report"]

Outcome = Literal["clean", "steered", "blocked", "stopped"]
"""The furthest the guard would have gone in a thread."""

_OUTCOMES: tuple[Outcome, ...] = ("clean", "steered", "blocked", "stopped")
# Model calls spent in a thread's loops, bucketed: (label, lowest count).
_LENGTHS = (("1", 1), ("2", 2), ("3-4", 3), ("5-9", 5), ("10-19", 10), ("20-49", 20), ("50+", 50))
_TOOLS_SHOWN = 10
_CHANGES_KEPT = 50  # threads listed whose outcome the compared settings change
_PAGE = 500  # a database's threads per piece of work
_ERRORS_KEPT = 100  # reasons kept of what could not be read (all are counted)


@dataclass(slots=True)
class _Thread:
    """What the report keeps of one looping thread: for the worst threads' timelines."""

    thread: str
    calls: int
    cost: LoopCost
    tokens_reported: bool
    events: list[dict[str, Any]]
    agents: list[dict[str, Any]]  # the runs of calls of one agent (`_runs_of`)

    @property
    def rank(self) -> tuple[int, int, str]:
        return (self.cost.model_calls, self.cost.tokens, self.thread)


@dataclass(slots=True)
class _Tally:
    """The counts of one configuration over some threads; tallies add up (`add`)."""

    worst_kept: int
    threads: int = 0
    usage_threads: int = 0  # whose model reported its token usage
    between_agents: int = 0  # threads with a loop between agents
    outcomes: Counter[str] = field(default_factory=Counter)
    shapes: Counter[str] = field(default_factory=Counter)
    tools: dict[str, Counter[str]] = field(default_factory=dict)
    cost: LoopCost = NO_COST
    lengths: Counter[str] = field(default_factory=Counter)
    worst: list[tuple[tuple[int, int, str], _Thread]] = field(default_factory=list)  # a heap

    def count(self, report: Report) -> Outcome:
        """Count one thread's scan; returns its outcome."""
        self.threads += 1
        self.usage_threads += report.tokens_reported
        outcome = _outcome_of(report)
        self.outcomes[outcome] += 1
        self.cost += report.cost
        if outcome == "clean":
            return outcome
        self.between_agents += bool(report.between_agents())
        kinds_by_tool: dict[str, Counter[str]] = {}
        for finding in report.findings:
            kinds_by_tool.setdefault(finding.event.tool, Counter())[finding.event.kind] += 1
        # A loop's shape is the reason it was steered or blocked; a stop's reason is the
        # setting that ended the request.
        self.shapes.update(
            {f.event.reason for f in report.findings if f.event.reason and f.event.kind != "stop"}
        )
        for tool, kinds in kinds_by_tool.items():
            counts = self.tools.setdefault(tool, Counter())
            counts["threads"] += 1
            counts["steers"] += kinds["steer"]
            counts["blocks"] += kinds["block"]
            counts["stops"] += kinds["stop"]
        spent = report.cost.model_calls
        if spent:
            self.lengths[_length_of(spent)] += 1
        self._keep(
            _Thread(report.name, report.calls, report.cost, report.tokens_reported,
                    _events_of(report), _runs_of(report.callers))
        )  # fmt: skip
        return outcome

    def add(self, other: _Tally) -> None:
        """Add another tally of the same configuration."""
        self.threads += other.threads
        self.usage_threads += other.usage_threads
        self.between_agents += other.between_agents
        self.outcomes.update(other.outcomes)
        self.shapes.update(other.shapes)
        for tool, counts in other.tools.items():
            self.tools.setdefault(tool, Counter()).update(counts)
        self.cost += other.cost
        self.lengths.update(other.lengths)
        for _, thread in other.worst:
            self._keep(thread)

    def _keep(self, thread: _Thread) -> None:
        entry = (thread.rank, thread)
        if len(self.worst) < self.worst_kept:
            heapq.heappush(self.worst, entry)
        elif self.worst and entry[0] > self.worst[0][0]:
            heapq.heapreplace(self.worst, entry)

    def to_json(self) -> dict[str, Any]:
        tools = sorted(self.tools.items(), key=lambda item: (-item[1]["threads"], item[0]))
        return {
            "threads": self.threads,
            "threads_with_token_usage": self.usage_threads,
            "outcomes": {
                "steered": self.outcomes["steered"]
                + self.outcomes["blocked"]
                + self.outcomes["stopped"],
                "blocked": self.outcomes["blocked"] + self.outcomes["stopped"],
                "stopped": self.outcomes["stopped"],
                "clean": self.outcomes["clean"],
            },
            "shapes": {shape: self.shapes[shape] for shape in SHAPES},
            "between_agents": self.between_agents,
            "tools": [
                {
                    "tool": tool,
                    **{key: counts[key] for key in ("threads", "steers", "blocks", "stops")},
                }
                for tool, counts in tools[:_TOOLS_SHOWN]
            ],
            "cost": cost_json(self.cost, tokens_reported=self.usage_threads > 0),
            "loop_lengths": [
                {"length": label, "threads": self.lengths[label]} for label, _ in _LENGTHS
            ],
            "worst": [
                {
                    "thread": thread.thread,
                    "calls": thread.calls,
                    "model_calls": thread.cost.model_calls,
                    "tokens": thread.cost.tokens if thread.tokens_reported else None,
                    "events": thread.events,
                    "agents": thread.agents,
                }
                for _, thread in sorted(self.worst, reverse=True)
            ],
        }


@dataclass(slots=True)
class FleetReport:
    """How a fleet of threads looped under one configuration, and, with `compare`, what
    another configuration changes; `to_json` is the `--json` output."""

    label: str
    tally: _Tally
    sources: list[str] = field(default_factory=list)  # as printed: no password
    source_kinds: dict[str, str] = field(default_factory=dict)  # each source's kind, by name
    generated: datetime | None = None
    window: Window = field(default_factory=Window)
    first: datetime | None = None  # the earliest time a thread read last changed
    last: datetime | None = None  # the latest
    unreadable: int = 0
    compare_label: str | None = None
    compared: _Tally | None = None
    changed_count: int = 0
    changed: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # why sources or threads were unreadable
    readings: dict[str, Reading] = field(default_factory=dict)  # what was read of each source

    def add(self, other: FleetReport) -> None:
        """Add the report of other threads, made with the same configurations."""
        self.tally.add(other.tally)
        self.span(other.first)
        self.span(other.last)
        self.unreadable += other.unreadable
        for source, reading in other.readings.items():
            self.readings.setdefault(source, Reading()).add(reading)
        self.errors = [*self.errors, *other.errors][:_ERRORS_KEPT]
        if self.compared is not None and other.compared is not None:
            self.compared.add(other.compared)
        self.changed_count += other.changed_count
        self.changed = _biggest_changes([*self.changed, *other.changed])

    def span(self, updated: datetime | None) -> None:
        """Take in the time a thread read last changed (`None`: unknown)."""
        if updated is not None:
            self.first = updated if self.first is None else min(self.first, updated)
            self.last = updated if self.last is None else max(self.last, updated)

    def to_json(self) -> dict[str, Any]:
        """The report's numbers, JSON-safe."""
        body = self.tally.to_json()
        compare = None
        if self.compared is not None:
            other = self.compared.to_json()
            compare = {
                "label": self.compare_label,
                "threads": other["threads"],
                "outcomes": other["outcomes"],
                "cost": other["cost"],
                "changed_count": self.changed_count,
                "changed": self.changed,
            }
        span = None
        if self.first is not None and self.last is not None:
            span = {"first": self.first.isoformat(), "last": self.last.isoformat()}
        generated = self.generated or datetime.now(timezone.utc)
        return {
            "version": 1,
            "label": self.label,
            "sources": self.sources,
            "source_kinds": self.source_kinds,
            "generated": generated.isoformat(timespec="seconds"),
            "window": self.window.to_json(),
            "span": span,
            "threads": body.pop("threads"),
            "unreadable": self.unreadable,
            **body,
            "compare": compare,
        }


def build_report(
    sources: Sequence[Path | str],
    config: LoopGuardConfig,
    *,
    label: str = "defaults",
    compare: tuple[str, LoopGuardConfig] | None = None,
    worst: int = 10,
    jobs: int = 1,
    window: Window | None = None,
    progress: Callable[[int], object] | None = None,
) -> FleetReport:
    """Scan every conversation of `sources` into one `FleetReport`.

    `window`: only the threads whose latest checkpoint is in it (a conversation file, which
    records no times, is then unreadable). `compare`: another configuration (its label and
    settings), scanned on the same threads.
    `worst`: the threads whose timelines are kept. `jobs`: worker processes (1: this one).
    A source or a thread that cannot be read is counted as unreadable, and why is kept
    (`FleetReport.errors`). `progress` is called with the threads scanned so far.
    """
    job = _Job(config, label, compare, worst, window or Window())
    total = job.empty()
    total.sources = [display_name(source) for source in sources]
    total.source_kinds = {display_name(s): source_kind(s) for s in sources}
    total.generated = datetime.now(timezone.utc)
    total.window = job.window
    for part in _run(job, _pieces(sources), jobs):
        total.add(part)
        if progress is not None:
            progress(total.tally.threads)
    return total


@dataclass(frozen=True, slots=True)
class _Piece:
    """A piece of work: a file, or some threads of a database."""

    source: str
    threads: tuple[str, ...] | None = None  # `None`: every conversation of the source


@dataclass(frozen=True, slots=True)
class _Job:
    """What each piece is scanned with (sent to the worker processes)."""

    config: LoopGuardConfig
    label: str
    compare: tuple[str, LoopGuardConfig] | None
    worst: int
    window: Window

    def empty(self) -> FleetReport:
        compared = None if self.compare is None else _Tally(self.worst)
        label = None if self.compare is None else self.compare[0]
        return FleetReport(self.label, _Tally(self.worst), compare_label=label, compared=compared)

    def scan(self, piece: _Piece) -> FleetReport:
        report = self.empty()
        name = display_name(piece.source)
        reading = report.readings[name] = Reading()
        for scanned in scan_each(self.config, stream(piece.source, piece.threads, self.window)):
            if isinstance(scanned, ScanError):
                reading.count(scanned)
                report.unreadable += 1
                report.errors.append(f"{name}: {scanned}")
                continue
            item, ours = scanned
            reading.count(item)
            report.span(item.updated)
            before = report.tally.count(ours)
            if self.compare is not None and report.compared is not None:
                theirs = scan_conversation(self.compare[1], item)
                after = report.compared.count(theirs)
                if before != after:
                    report.changed_count += 1
                    change = _change(item.name, (before, ours), (after, theirs))
                    report.changed = _biggest_changes([*report.changed, change])
        report.errors = report.errors[:_ERRORS_KEPT]
        return report


def _change(
    thread: str, before: tuple[Outcome, Report], after: tuple[Outcome, Report]
) -> dict[str, Any]:
    """A thread whose outcome the compared settings change."""
    return {
        "thread": thread,
        "before": before[0],
        "after": after[0],
        "model_calls_before": before[1].cost.model_calls,
        "model_calls_after": after[1].cost.model_calls,
    }


def _biggest_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes kept: the threads whose outcome moved furthest, then by name."""

    def distance(change: dict[str, Any]) -> tuple[int, str]:
        moved = abs(_OUTCOMES.index(change["before"]) - _OUTCOMES.index(change["after"]))
        return (-moved, str(change["thread"]))

    return sorted(changes, key=distance)[:_CHANGES_KEPT]


def _pieces(sources: Sequence[Path | str]) -> Iterator[_Piece]:
    """The pieces of work: each file (a folder's files, in order), each page of a
    database's threads (listed as the work goes on)."""
    for source in sources:
        if not is_postgres_url(str(source)) and Path(source).is_dir():
            files = sorted(p for p in Path(source).rglob("*") if p.is_file())
            # A folder without files is a source that cannot be read: its scan says so.
            yield from (_Piece(str(found)) for found in files) if files else [_Piece(str(source))]
            continue
        try:
            pages = thread_pages(source, _PAGE)
            first = next(pages, None)
        except ScanError:
            yield _Piece(str(source))  # unreadable: its scan tells why
            continue
        if first is None:
            yield _Piece(str(source))  # a file, or a database without threads
            continue
        yield _Piece(str(source), tuple(first))
        for page in pages:
            yield _Piece(str(source), tuple(page))


def _run(job: _Job, pieces: Iterator[_Piece], jobs: int) -> Iterator[FleetReport]:
    """Each piece's report, scanned here (`jobs` 1) or by worker processes, a few pieces in
    flight at a time so that memory stays flat."""
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(job.scan, pieces)
        return
    # Forked workers inherit the job: a configuration's normalizers and policies need not
    # pickle. Only the pieces and their reports travel.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, context, initializer=_take, initargs=(job,)) as pool:
        pending: deque[Future[FleetReport]] = deque()
        for piece in pieces:
            pending.append(pool.submit(_scan, piece))
            if len(pending) >= 2 * jobs:
                yield pending.popleft().result()
        for future in pending:
            yield future.result()


_worker_job: list[_Job] = []  # a worker process's job (`_take`)


def _take(job: _Job) -> None:
    _worker_job.append(job)


def _scan(piece: _Piece) -> FleetReport:
    return _worker_job[0].scan(piece)


def _outcome_of(report: Report) -> Outcome:
    kinds = {finding.event.kind for finding in report.findings}
    if "stop" in kinds:
        return "stopped"
    if "block" in kinds:
        return "blocked"
    if "steer" in kinds:
        return "steered"
    return "clean"


def _length_of(spent: int) -> str:
    label = _LENGTHS[0][0]
    for name, lowest in _LENGTHS:
        if spent >= lowest:
            label = name
    return label


def _events_of(report: Report) -> list[dict[str, Any]]:
    return [
        {
            "call": f.call_index,
            "kind": f.event.kind,
            "tool": f.event.tool,
            "reason": f.event.reason,
            "agent": f.agent,
        }
        for f in report.findings
    ]


def _runs_of(callers: Sequence[str | None]) -> list[dict[str, Any]]:
    """The calls of a thread by agent, as runs of calls one agent made in a row; none when
    no call names its agent.

    Examples:
        >>> _runs_of(["alice", "alice", "bob"])
        [{'agent': 'alice', 'first': 1, 'last': 2}, {'agent': 'bob', 'first': 3, 'last': 3}]
    """
    runs: list[dict[str, Any]] = []
    for call, agent in enumerate(callers, start=1):
        if runs and runs[-1]["agent"] == agent and runs[-1]["last"] == call - 1:
            runs[-1]["last"] = call
        elif agent is not None:
            runs.append({"agent": agent, "first": call, "last": call})
    return runs


def run_report(
    sources: Sequence[Path | str],
    config: LoopGuardConfig,
    *,
    html: Path | None,
    json_out: Path | None,
    label: str = "defaults",
    compare: tuple[str, LoopGuardConfig] | None = None,
    worst: int = 10,
    jobs: int | None = None,
    window: Window | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Build the report and write its page and its JSON (`-` for standard output); the exit
    status (`loop_guard.scan.exit_status`): 0 when every source was read, plus 2 when one could
    not be, plus 4 when parts of one (threads, lines) could not be (each is named, with the
    reason). Nothing is written when nothing could be read."""
    from loop_guard._report_page import render_page

    out, err = out or sys.stdout, err or sys.stderr
    bar = _ProgressBar(err) if err.isatty() else None
    report = build_report(
        sources, config, label=label, compare=compare, worst=worst,
        jobs=jobs if jobs is not None else (os.cpu_count() or 1), window=window,
        progress=None if bar is None else bar.show,
    )  # fmt: skip
    if bar is not None:
        bar.close()
    for error in report.errors:
        print(f"loop-guard report: {error}", file=err)
    if report.unreadable > len(report.errors):
        print(f"loop-guard report: {report.unreadable - len(report.errors)} more could not be "
              "read", file=err)  # fmt: skip
    for name, reading in report.readings.items():
        if (summary := reading.summary()) is not None:
            print(f"loop-guard report: {name}: {summary}", file=err)
    status = exit_status(False, report.readings.values())
    if report.unreadable and not report.tally.threads:
        return status  # a report of nothing would only hide that nothing was read
    numbers = report.to_json()
    try:
        if html is not None:
            html.write_text(render_page(numbers), encoding="utf-8")
        if json_out is not None and str(json_out) != "-":
            json_out.write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        print(f"loop-guard report: cannot write {error.filename}: {error.strerror}", file=err)
        return status | EXIT_UNREADABLE
    if str(json_out) == "-":
        print(json.dumps(numbers, indent=2), file=out)
    if html is not None and str(json_out) != "-":
        looped = numbers["threads"] - numbers["outcomes"]["clean"]
        print(f"{html}: {numbers['threads']:,} threads, {looped:,} would have been steered "
              "or more", file=out)  # fmt: skip
    return status


class _ProgressBar:
    """Threads scanned so far, on one line of a terminal's standard error."""

    def __init__(self, err: TextIO) -> None:
        self.err = err

    def show(self, done: int) -> None:
        print(f"\rloop-guard report: {done:,} threads scanned", end="", file=self.err)

    def close(self) -> None:
        print(file=self.err)
