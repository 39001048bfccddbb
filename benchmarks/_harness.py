"""Shared plumbing for the benchmarks: timing, memory, result sections, tables.

Timing rules, applied by every benchmark:

- `time.perf_counter` for wall time, `time.thread_time` for the CPU time of code that
  runs inside an agent (so another process's load does not count against it);
- every number is the median of repeated samples;
- variants that are compared are interleaved within one run (round robin, the order
  reversed on every other round), so drift in machine load hits them alike;
- ratios are the headline, absolute medians are given for context only.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


@dataclass(frozen=True)
class Scale:
    """How big each benchmark runs: `FULL` for the table, `QUICK` for the CI smoke pass."""

    quick: bool
    # engine floor
    engine_sizes: tuple[str, ...]
    engine_budget_s: float  # wall time aimed at per payload size
    # scaling
    short_steps: int
    long_steps: int
    history_messages: int
    batch_width: int  # parallel calls in one response (`dedupe_siblings`)
    batch_rounds: int
    # conversations
    engine_conversations: int
    agent_conversations: int
    # peers
    peer_stubborn_limit: int
    peer_healthy_steps: int
    peer_rounds: int


FULL = Scale(
    quick=False,
    engine_sizes=("small", "medium", "1MB", "10MB"),
    engine_budget_s=6.0,
    short_steps=50,
    long_steps=800,
    history_messages=10_000,
    batch_width=100,
    batch_rounds=7,
    engine_conversations=10_000,
    agent_conversations=500,
    peer_stubborn_limit=100,
    peer_healthy_steps=300,
    peer_rounds=5,
)

QUICK = Scale(
    quick=True,
    engine_sizes=("small", "medium", "1MB"),
    engine_budget_s=0.4,
    short_steps=5,
    long_steps=40,
    history_messages=400,
    batch_width=20,
    batch_rounds=1,
    engine_conversations=300,
    agent_conversations=20,
    peer_stubborn_limit=40,
    peer_healthy_steps=12,
    peer_rounds=1,
)


@dataclass
class Target:
    """One target of the issue, what it asks and what was measured."""

    name: str
    goal: str
    measured: str
    holds: bool | None  # None: not measured in this run

    @classmethod
    def at_most(cls, name: str, limit: float, value: float | None, unit: str = "x") -> Target:
        """A target met when `value` is at most `limit` (`None`: not measured)."""
        shown = "—" if value is None else (ratio(value) if unit == "x" else us(value))
        goal = f"≤ {limit:.1f}x" if unit == "x" else f"≤ {us(limit)}"
        return cls(
            name=name, goal=goal, measured=shown, holds=None if value is None else value <= limit
        )


@dataclass
class Section:
    """The outcome of one benchmark: a table, the targets it checks, notes."""

    key: str
    title: str
    what: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None


# ---------------------------------------------------------------------------- timing


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles (the spread shown beside a median)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def interleave(
    variants: dict[str, Callable[[], float]], rounds: int, *, warmup: int = 1
) -> dict[str, list[float]]:
    """Run each variant `rounds` times, round robin; each call returns its own timing.

    The order is reversed on every other round so that a variant is not always the one
    that follows the same neighbour. `warmup` rounds are run first and thrown away.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            gc.collect()
            samples[name].append(variants[name]())
    return samples


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- memory


_SKIP_TYPES = (type, ModuleType, FunctionType)


def deep_size(*roots: object, stop: Callable[[object], bool] | None = None) -> int:
    """Bytes held by `roots` and everything reachable from them (each object once).

    Classes, modules and functions are shared code, not data, and are not counted;
    `stop(obj)` may exclude more (e.g. the guard object a handler points back to).
    """
    seen: set[int] = set()
    total = 0
    stack: list[object] = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP_TYPES):
            continue
        if stop is not None and stop(obj):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def mib(n: float) -> str:
    return f"{n / (1024 * 1024):,.2f} MiB"


def size_text(n: float) -> str:
    if abs(n) >= 1024 * 1024:
        return mib(n)
    if abs(n) >= 1024:
        return f"{n / 1024:,.1f} KiB"
    return f"{n:,.0f} B"


def us(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def ratio(value: float) -> str:
    return f"{value:.2f}x"


# ---------------------------------------------------------------------------- reporting


def machine_info() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    versions = []
    for name in ("langchain-loop-guard", "langchain", "langchain-core", "langgraph"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    commit = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "loop_guard", "benchmarks"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        ).stdout.splitlines()
        if commit and any(not line.endswith("benchmarks/RESULTS.md") for line in changed):
            commit += " (with uncommitted changes to loop_guard/ or benchmarks/)"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "cpu": f"{cpu}, {os.cpu_count()} logical cores",
        "load average at start": load,
        "packages": "; ".join(versions),
        "git commit": commit or "?",
    }


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(c) for c in columns]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(out)


def verdict(holds: bool | None) -> str:
    return {True: "holds", False: "MISSED", None: "not measured"}[holds]


def targets_rows(sections: Sequence[Section]) -> list[list[str]]:
    rows = []
    for section in sections:
        for target in section.targets:
            rows.append(
                [section.key, target.name, target.goal, target.measured, verdict(target.holds)]
            )
    return rows


def run_section(key: str, function: Callable[[], Section]) -> Section:
    """Run one benchmark; a crash becomes a section with the traceback, not an exit."""
    start = time.perf_counter()
    try:
        section = function()
    except Exception:
        section = Section(key=key, title=f"{key}: crashed", what="", error=traceback.format_exc())
    section.seconds = time.perf_counter() - start
    return section


# Everything from this line on in a results file is hand-written: `run.py --write` keeps it.
HAND_WRITTEN = "<!-- hand-written below: not generated by run.py, which keeps it as it is -->"


def render_markdown(
    sections: Sequence[Section],
    info: dict[str, str],
    *,
    command: str,
    stamp: str,
    hand_written: str = "",
) -> str:
    """The results file: generated sections, then `hand_written` (from HAND_WRITTEN on) as is."""
    parts = [
        "# loop_guard benchmark results",
        "",
        stamp,
        f"Generated by `{command}` from commit {info.get('git commit', '?')}, every section in"
        " one run (see [README.md](README.md) for what each scenario measures). Ratios and"
        " instruction counts are the result; wall times are context only, since the machine is"
        " shared.",
        "",
    ]
    parts += ["## Machine", "", markdown_table(["", ""], [[k, v] for k, v in info.items()]), ""]
    parts += [
        "## Targets",
        "",
        markdown_table(["#", "target", "goal", "measured", "verdict"], targets_rows(sections)),
        "",
    ]
    for section in sections:
        parts += [f"## {section.title}", ""]
        if section.what:
            parts += [section.what, ""]
        if section.error:
            parts += ["**The benchmark crashed:**", "", "```", section.error.rstrip(), "```", ""]
            continue
        if section.rows:
            parts += [markdown_table(section.columns, section.rows), ""]
        for caption, columns, rows in section.extra_tables:
            parts += [caption, "", markdown_table(columns, rows), ""]
        if section.targets:
            rows = [[t.name, t.goal, t.measured, verdict(t.holds)] for t in section.targets]
            parts += [markdown_table(["target", "goal", "measured", "verdict"], rows), ""]
        parts += [f"- {note}" for note in section.notes]
        parts += [f"- Took {section.seconds:.0f} s.", ""]
    if hand_written:
        parts += [hand_written.strip()]
    return "\n".join(parts).rstrip() + "\n"


def render_text(sections: Sequence[Section]) -> str:
    parts = []
    for section in sections:
        parts += ["", f"== {section.title}  ({section.seconds:.1f} s)"]
        if section.error:
            parts += ["CRASHED:", section.error.rstrip()]
            continue
        if section.rows:
            parts += [text_table(section.columns, section.rows)]
        for caption, columns, rows in section.extra_tables:
            parts += ["", caption, text_table(columns, rows)]
    parts += ["", "== Targets"]
    parts += [text_table(["#", "target", "goal", "measured", "verdict"], targets_rows(sections))]
    return "\n".join(parts)


def print_flush(*args: Any, **kwargs: Any) -> None:
    print(*args, **kwargs, flush=True)
