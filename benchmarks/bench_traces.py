"""`loop-guard report` on a LangSmith runs export: time and peak memory against its size.

For each size, an export of that many traces of 20 runs each (a root, ten model runs and
nine tool runs; every other trace loops on one call) is written as JSON Lines, in a shuffled
order, from runs made with the `langsmith` SDK's `RunTree` (one trace is built, then copied
under fresh ids) by a child process. Then `python -m loop_guard report RUNS.jsonl --jobs 1`
runs in another (`bench_report.report`): its wall time and its peak resident memory. The
reader spools the runs to a temporary SQLite file, so the peak is meant to stay flat in the
export's size (`run.py traces`).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _harness import Scale, Section, Target, mib, print_flush, us
from bench_report import FLAT, report

TRACES = (1_000, 5_000)  # 20,000 and 100,000 runs
QUICK_TRACES = (50, 200)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def template(looping: bool) -> list[str]:
    """One trace's runs, as `Client.list_runs` gives them, one JSON line each."""
    from langchain_core.load import dumpd
    from langchain_core.messages import AIMessage, ToolMessage
    from langsmith import RunTree

    usage = {"input_tokens": 900, "output_tokens": 40, "total_tokens": 940}
    ask = {"role": "user", "content": "Summarise the notes"}
    root = RunTree(name="LangGraph", run_type="chain", inputs={"messages": [ask]},
                   extra={"metadata": {"thread_id": "?"}})  # fmt: skip
    for n in range(10):
        path = "notes.md" if looping else f"notes-{n}.md"
        calls = [] if n == 9 else [{"name": "read_file", "args": {"path": path}, "id": f"c{n}"}]
        reply = AIMessage(content="done" if n == 9 else "", tool_calls=calls, usage_metadata=usage)
        model = root.create_child(name="ChatModel", run_type="llm", inputs={"messages": [[ask]]})
        model.end(outputs={"generations": [[{"text": "", "message": dumpd(reply)}]]})
        if calls:
            tool = root.create_child(name="read_file", run_type="tool", inputs={"path": path},
                                     extra={"tool_call_id": f"c{n}"})  # fmt: skip
            result = ToolMessage(content=f"no such file: {path}", tool_call_id=f"c{n}")
            tool.end(outputs={"output": result.model_dump()})
    root.end(outputs={})
    runs = [root, *root.child_runs]
    return [RunTree.model_validate(r.model_dump(exclude={"child_runs"})).model_dump_json()
            for r in runs]  # fmt: skip


def write_export(path: Path, traces: int) -> int:
    """`traces` traces, every other one looping, their runs shuffled; the runs written."""
    templates = [template(looping=True), template(looping=False)]
    lines = []
    for number in range(traces):
        lines += _copy(templates[number % 2], f"t{number}")
    random.Random(5).shuffle(lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def _copy(trace: list[str], thread: str) -> list[str]:
    """A trace's lines under fresh run and trace ids, on its own thread."""
    fresh: dict[str, str] = {}
    lines = [_UUID.sub(lambda m: fresh.setdefault(m.group(), str(uuid.uuid4())), line)
             for line in trace]  # fmt: skip
    return [line.replace('"thread_id":"?"', f'"thread_id":"{thread}"') for line in lines]


def run_size(traces: int) -> tuple[int, float, int, float, int]:
    """Runs written, write seconds, export bytes, report seconds, report peak RSS (bytes)."""
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as folder:
        out = Path(folder)
        export = out / "runs.jsonl"
        # Written by a child of its own: a report forked from a process that holds the export
        # would count that process's memory in its peak.
        start = time.perf_counter()
        code = f"import bench_traces as b; print(b.write_export(b.Path({str(export)!r}), {traces}))"
        argv = [sys.executable, "-c", code]
        written = subprocess.run(
            argv, capture_output=True, check=True, text=True, cwd=Path(__file__).parent
        )
        write_s = time.perf_counter() - start
        wall, rss, _ = report(export, out, jobs=1)
        return int(written.stdout), write_s, export.stat().st_size, wall, rss


def run(scale: Scale) -> Section:
    measured = []
    for traces in QUICK_TRACES if scale.quick else TRACES:
        print_flush(f"  {traces:,} traces ...", file=sys.stderr)
        measured.append((traces, *run_size(traces)))
    columns = ["traces", "runs", "export", "report", "runs / s", "peak RSS"]
    rows = [
        [f"{traces:,}", f"{runs:,}", mib(size), us(wall), f"{runs / wall:,.0f}", mib(rss)]
        for traces, runs, _, size, wall, rss in measured
    ]
    small, large = measured[0], measured[-1]
    targets = [
        Target.at_most(f"peak RSS, {large[0]:,} ÷ {small[0]:,} traces", FLAT, large[5] / small[5])
    ]
    if not scale.quick:  # the time target is for 100,000 runs; tiny exports are start-up
        targets.append(Target.at_most(f"report of {large[1]:,} runs", 60.0, large[4], unit="s"))
    return Section(
        "traces",
        "`loop-guard report` on a LangSmith runs export",
        __doc__.split("\n\n", 1)[0].replace("\n", " ").strip(),
        columns=columns,
        rows=rows,
        targets=targets,
    )
