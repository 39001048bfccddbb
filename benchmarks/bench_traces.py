"""`loop-guard report` on a LangSmith runs export: time and peak memory against its size.

    .venv/bin/python benchmarks/bench_traces.py [--quick] [--traces 1000,5000]

For each size, an export of that many traces of 20 runs each (a root, ten model runs and
nine tool runs; every other trace loops on one call) is written as JSON Lines, in a shuffled
order, from runs made with the `langsmith` SDK's `RunTree` (one trace is built, then copied
under fresh ids) by a child process. Then `python -m loop_guard report RUNS.jsonl` runs in
another (`bench_report.report`): its wall time and its peak resident memory. Prints a markdown
table, then whether the peak memory grew with the export's size: the reader spools the runs
to a temporary SQLite file, so it is meant to stay flat.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _harness import REPO, machine_info, markdown_table, print_flush
from bench_report import Run, growth, report, sizes, table

sys.path.insert(0, str(REPO))

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


def run_size(traces: int) -> tuple[Run, int]:
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as folder:
        out = Path(folder)
        export = out / "runs.jsonl"
        # Written by a child of its own: a report forked from a process that holds the export
        # would count that process's memory in its peak.
        start = time.perf_counter()
        argv = [sys.executable, __file__, "--write", str(export), str(traces)]
        runs = int(subprocess.run(argv, capture_output=True, check=True, text=True).stdout)
        write_s = time.perf_counter() - start
        wall, rss, reported = report(export, out, 1)
        return Run(traces, write_s, export.stat().st_size, wall, rss, reported), runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_TRACES}")
    parser.add_argument("--traces", type=sizes, help=f"comma-separated (default {TRACES})")
    parser.add_argument("--write", nargs=2, metavar=("PATH", "TRACES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:
        print(write_export(Path(args.write[0]), int(args.write[1])))
        return 0
    measured = []
    for traces in args.traces or (QUICK_TRACES if args.quick else TRACES):
        print_flush(f"{traces:,} traces ...", file=sys.stderr)
        measured.append(run_size(traces))
    print("## `loop-guard report` on a LangSmith runs export (20 runs a trace, --jobs 1)\n")
    print(markdown_table(["", ""], [[k, v] for k, v in machine_info().items()]))
    print()
    print(table([run for run, _ in measured]).replace("threads", "traces", 1))
    print()
    print(", ".join(f"{traces:,} runs" for _, traces in measured), "\n")
    print(growth([run for run, _ in measured]).replace("threads", "traces"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
