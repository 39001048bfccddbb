"""Run the loop_guard benchmark suite; print the tables and write RESULTS.md.

    .venv/bin/python benchmarks/run.py            # everything, full size (several minutes)
    .venv/bin/python benchmarks/run.py --peers    # also install and measure the peers
    .venv/bin/python benchmarks/run.py --quick    # every benchmark at tiny sizes (CI smoke)
    .venv/bin/python benchmarks/run.py --only 1,3 # some benchmarks only

Targets are reported, never asserted: the exit status is 0 unless a benchmark crashed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _harness import (
    FULL,
    HERE,
    QUICK,
    Scale,
    Section,
    machine_info,
    print_flush,
    render_markdown,
    render_text,
    run_section,
)


def benchmarks(scale: Scale, *, peers: bool) -> dict[str, Callable[[], Section]]:
    # Imported here: each pulls in LangChain, and `--help` should not wait for it.
    import bench_agent
    import bench_conversations
    import bench_engine
    import bench_peers
    import bench_scaling

    return {
        "1": lambda: bench_engine.run(scale),
        "2": lambda: bench_agent.run(scale),
        "3": lambda: bench_scaling.run(scale),
        "4": lambda: bench_conversations.run(scale),
        "5": lambda: bench_peers.run(scale, peers=peers),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loop_guard benchmarks (issue 7)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the CI smoke pass")
    parser.add_argument("--peers", action="store_true", help="install and measure the peers")
    parser.add_argument("--only", default="", help="comma-separated benchmark numbers (1-5)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown file to write (default: benchmarks/RESULTS.md for a full run; "
        "none for --quick, so the committed results are not overwritten)",
    )
    args = parser.parse_args(argv)
    if args.quick and args.peers:
        parser.error("--quick never installs the peers; drop --peers")
    # Every guard logs its interventions; keep the benchmark's output to its tables.
    logging.getLogger().addHandler(logging.NullHandler())
    scale = QUICK if args.quick else FULL
    info = machine_info()
    chosen = {part.strip() for part in args.only.split(",") if part.strip()}
    sections: list[Section] = []
    started = time.perf_counter()
    for key, function in benchmarks(scale, peers=args.peers).items():
        if chosen and key not in chosen:
            continue
        print_flush(f"benchmark {key} …")
        section = run_section(key, function)
        print_flush(
            f"  {section.title}: {section.seconds:.1f} s" + (" CRASHED" if section.error else "")
        )
        sections.append(section)
    print_flush(render_text(sections))
    print_flush(f"\nTotal: {time.perf_counter() - started:.0f} s")
    out = args.out if args.out is not None else (None if args.quick else HERE / "RESULTS.md")
    if out is not None:
        command = "python benchmarks/run.py" + (" --peers" if args.peers else "")
        command += " --quick" if args.quick else ""
        preface = ""
        if (HERE / "FINDINGS.md").exists():
            preface = (
                "Why the missed targets miss — profiles, where the time goes, suggested fixes in"
                " the package: [FINDINGS.md](FINDINGS.md)."
            )
        out.write_text(render_markdown(sections, info, command=command, preface=preface))
        print_flush(f"Wrote {out}")
    crashed = [s.key for s in sections if s.error]
    if crashed:
        print_flush(f"Crashed: benchmark(s) {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
