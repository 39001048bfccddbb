"""The loop_guard benchmarks: one runner, named scenarios.

    python benchmarks/run.py                      # the wall-time scenarios, printed
    python benchmarks/run.py instructions text-instructions   # counted by valgrind
    python benchmarks/run.py --quick              # every scenario but the soak, tiny (CI)
    python benchmarks/run.py --all --write benchmarks/RESULTS.md   # the committed results
    python benchmarks/run.py --list               # the scenarios and what each measures

Targets are reported, never asserted: the exit status is 1 only when a scenario crashed.
A written file holds the scenarios of one run of one commit, stamped with the commit and
the digest of what makes its numbers (`_stamp.py`); what it holds from its HAND_WRITTEN
marker on is kept as it is.
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
from _stamp import stamp

SCENARIOS = {
    "engine": "one healthy step through the engine against its floor (JSON + SHA-256)",
    "scaling": "the guard's CPU per step with long histories; dedupe_siblings at width",
    "conversations": "memory per conversation, and what finished runs leave behind",
    "peers": "the published loop guards side by side (installed with --peers)",
    "text": "the repeated-text watch: its cost, its linearity, what a cut saves",
    "report": "`loop-guard report` on SQLite fleets: time and peak memory",
    "traces": "`loop-guard report` on LangSmith runs exports: time and peak memory",
    "instructions": "instructions per healthy step at 250 B to 1 MB results (valgrind)",
    "text-instructions": "instructions per streamed chunk of the text watch (valgrind)",
    "soak": "many conversations at once on one guard, per face: no deviation, no growth",
}
WALL = ("engine", "scaling", "conversations", "peers", "text", "report", "traces")
"""What runs when no scenario is named."""
COUNTED = ("instructions", "text-instructions")


def scenario(name: str, scale: Scale, *, peers: bool) -> Callable[[], Section]:
    # Imported here: each pulls in LangChain, and `--help` should not wait for it.
    if name == "peers":
        import bench_peers

        return lambda: bench_peers.run(scale, peers=peers)
    module = {
        "engine": "bench_engine",
        "scaling": "bench_scaling",
        "conversations": "bench_conversations",
        "text": "bench_text",
        "report": "bench_report",
        "traces": "bench_traces",
        "instructions": "instructions",
        "text-instructions": "text_instructions",
        "soak": "soak",
    }[name]
    return lambda: __import__(module).run(scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "scenarios", nargs="*", help="scenarios to run (default: the wall-time ones)"
    )
    parser.add_argument("--all", action="store_true", help="every scenario but the soak")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, no valgrind: the CI smoke"
    )
    parser.add_argument("--peers", action="store_true", help="install and measure the peers")
    parser.add_argument("--list", action="store_true", help="list the scenarios")
    parser.add_argument("--write", type=Path, metavar="FILE", help="write the markdown to FILE")
    args = parser.parse_args(argv)
    if args.list:
        for name, what in SCENARIOS.items():
            print(f"{name:18} {what}")
        return 0
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))} (see --list)")
    if args.quick and args.peers:
        parser.error("--quick never installs the peers; drop --peers")
    chosen = args.scenarios or ([*WALL, *COUNTED] if args.all or args.quick else list(WALL))
    # Every guard logs its interventions; keep the output to the tables.
    logging.getLogger().addHandler(logging.NullHandler())
    scale = QUICK if args.quick else FULL
    info = machine_info()
    sections: list[Section] = []
    started = time.perf_counter()
    for name in chosen:
        print_flush(f"{name} …")
        section = run_section(name, scenario(name, scale, peers=args.peers))
        section.key = name
        print_flush(
            f"  {section.title}: {section.seconds:.1f} s" + (" CRASHED" if section.error else "")
        )
        sections.append(section)
    print_flush(render_text(sections))
    print_flush(f"\nTotal: {time.perf_counter() - started:.0f} s")
    if args.write is not None:
        command = " ".join(
            ["python benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])]
        )
        old = args.write.read_text() if args.write.exists() else ""
        hand_written = old[old.index(HAND_WRITTEN) :] if HAND_WRITTEN in old else ""
        markdown = render_markdown(
            sections, info, command=command, stamp=stamp(), hand_written=hand_written
        )
        args.write.write_text(markdown)
        print_flush(f"Wrote {args.write}")
    crashed = [s.key for s in sections if s.error]
    if crashed:
        print_flush(f"Crashed: {', '.join(crashed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
