"""Run the loop_guard benchmark suite; print the tables and, with --write, the markdown.

    .venv/bin/python benchmarks/run.py --write benchmarks/RESULTS.md  # regenerates RESULTS.md
    .venv/bin/python benchmarks/run.py            # everything, full size, printed only
    .venv/bin/python benchmarks/run.py --peers    # also install and measure the peers
    .venv/bin/python benchmarks/run.py --quick    # every benchmark at tiny sizes (CI smoke)
    .venv/bin/python benchmarks/run.py --only 1,3 # some benchmarks only, printed only

A written file holds every benchmark from one run of one commit (stamped into it), so --write
refuses --only. What the file holds from its HAND_WRITTEN marker on is kept as it is.

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
    HAND_WRITTEN,
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
    import bench_text

    return {
        "1": lambda: bench_engine.run(scale),
        "2": lambda: bench_agent.run(scale),
        "3": lambda: bench_scaling.run(scale),
        "4": lambda: bench_conversations.run(scale),
        "5": lambda: bench_peers.run(scale, peers=peers),
        "6": lambda: bench_text.run(scale),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="loop_guard benchmarks")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the CI smoke pass")
    parser.add_argument("--peers", action="store_true", help="install and measure the peers")
    parser.add_argument("--only", default="", help="comma-separated benchmark numbers (1-6)")
    parser.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the markdown to FILE (benchmarks/RESULTS.md: the committed results), "
        "keeping FILE's hand-written part; every benchmark, so not with --only",
    )
    args = parser.parse_args(argv)
    if args.quick and args.peers:
        parser.error("--quick never installs the peers; drop --peers")
    if args.write is not None and args.only:
        parser.error("--write writes every benchmark from one run; drop --only")
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
    if args.write is not None:
        command = "python benchmarks/run.py" + (" --peers" if args.peers else "")
        command += (" --quick" if args.quick else "") + f" --write {args.write}"
        hand_written = ""
        if args.write.exists():
            old = args.write.read_text()
            if HAND_WRITTEN in old:
                hand_written = old[old.index(HAND_WRITTEN) :]
        preface = (
            "Why the missed targets miss — profiles, where the time goes, what stands between"
            " the guard and the targets: [FINDINGS.md](FINDINGS.md)."
        )
        markdown = render_markdown(
            sections, info, command=command, preface=preface, hand_written=hand_written
        )
        args.write.write_text(markdown)
        print_flush(f"Wrote {args.write}")
    crashed = [s.key for s in sections if s.error]
    if crashed:
        print_flush(f"Crashed: benchmark(s) {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
