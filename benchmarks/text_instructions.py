"""Machine instructions per streamed chunk with and without the repeated-text check.

    .venv/bin/python benchmarks/text_instructions.py                 # on and off
    .venv/bin/python benchmarks/text_instructions.py --none          # and no middleware
    .venv/bin/python benchmarks/text_instructions.py --direct        # no graph, one thread
    .venv/bin/python benchmarks/text_instructions.py --jobs 4        # four counts at a time
    .venv/bin/python benchmarks/text_instructions.py --tokens 500 3000  # other lengths

The steady counterpart of benchmark 6's *cost* rows (`bench_text.py`), whose wall times move
by ±20% between identical runs. A healthy reply (`bench_text.healthy_text`: pseudo-words, no
40-character stretch repeated) is streamed in 4-character chunks through `create_agent`
(`stream_mode="messages"`, no tools), with `LoopGuardMiddleware()` (*on*), with
`LoopGuardMiddleware(detect_repeated_text=False)` (*off*) and, with `--none`, with no
middleware. Each variant runs as a child process under `valgrind --tool=callgrind` at a short
and a long reply (2,000 and 12,000 tokens by default); the difference of the two counts,
divided by the difference in chunks, is the instructions of one chunk, so imports, building
the agent and first calls cancel out. The reply is written to a file by this process and read
by the child, so making it is not counted. The hash seed is fixed (`PYTHONHASHSEED=0`):
randomised string hashes alone move a count. The child checks that the model generated every
chunk (the stream was not cut) and that the guard did not speak.

The share the check adds is (on - off) / off, per chunk; target ≤ 5%. Needs valgrind on the
PATH; a count takes a minute or two, the four of them a few minutes at `--jobs 2`. Callgrind's
output files go to a temporary directory. Not part of `run.py`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from bench_text import CHUNK, healthy_text, stream_run
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from loop_guard import LoopGuardMiddleware
from loop_guard._repeated_text import DEFAULT_MIN_CHARS
from loop_guard._reply_watch import Cutter
from loop_guard.testing import ScriptedChatModel

VARIANTS = {
    "on": "LoopGuardMiddleware()",
    "off": "LoopGuardMiddleware(detect_repeated_text=False)",
    "none": "create_agent, no middleware",
    "direct-on": "the model's own stream, the middleware's cutter attached",
    "direct-off": "the model's own stream, nothing attached",
}

TARGET = 0.05
"""The most the check may add to the streamed run, as a share of it."""

_SPOKE = ("steers", "blocks", "stops", "errors")
"""The guard's counters that must stay at zero on a healthy reply."""


def run(variant: str, reply_file: Path) -> None:
    """Stream the reply in `reply_file` through the variant's agent (the child's work)."""
    reply = reply_file.read_text(encoding="utf-8")
    if variant.startswith("direct"):
        direct(variant, reply)
        return
    middleware = {
        "on": LoopGuardMiddleware(),
        "off": LoopGuardMiddleware(detect_repeated_text=False),
        "none": None,
    }[variant]
    _, model = stream_run(lambda messages, index: AIMessage(reply), middleware)
    expected = -(-len(reply) // CHUNK) + 1  # the text's chunks, then the closing one
    assert model.chunks == expected, f"{variant}: {model.chunks} of {expected} chunks generated"
    if middleware is not None:
        stats = middleware.guard.stats
        spoke = {name: getattr(stats, name) for name in _SPOKE if getattr(stats, name)}
        assert not spoke, f"{variant}: the guard spoke on a healthy reply: {spoke}"


def direct(variant: str, reply: str) -> None:
    """Stream the reply from the model itself, in this thread, with the cutter the
    middleware attaches around its model call (`direct-on`) or nothing (`direct-off`)."""
    model = ScriptedChatModel(script=lambda messages, index: AIMessage(reply), chunk_chars=CHUNK)
    prompt: list[BaseMessage] = [HumanMessage("Why does the build fail?")]
    watching = Cutter(DEFAULT_MIN_CHARS, prompt) if variant == "direct-on" else nullcontext()
    with watching:
        for _ in model.stream(prompt):
            pass
    expected = -(-len(reply) // CHUNK) + 1
    assert model.chunks == expected, f"{variant}: {model.chunks} of {expected} chunks generated"
    if isinstance(watching, Cutter):  # it read the whole reply, and found it clean
        assert watching.cut is None, f"{variant}: cut"
        assert len(watching.read) == 1, f"{variant}: not watched"


def count(variant: str, reply_file: Path, out_dir: Path) -> int:
    """Instructions of a whole child process streaming `reply_file` through `variant`."""
    out_file = out_dir / f"callgrind.out.{variant}.{reply_file.stem}"
    completed = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            sys.executable,
            __file__,
            "--child",
            variant,
            str(reply_file),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if completed.returncode != 0:
        msg = f"{variant} on {reply_file.name} failed: {completed.stderr[-2000:]}"
        raise RuntimeError(msg)
    found = re.search(r"I\s+refs:\s+([\d,]+)", completed.stderr)
    if found is not None:
        return int(found.group(1).replace(",", ""))
    totals = re.search(r"^totals:\s+(\d+)", out_file.read_text(), re.MULTILINE)
    if totals is None:
        msg = f"no instruction count from valgrind: {completed.stderr[-500:]}"
        raise RuntimeError(msg)
    return int(totals.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens",
        nargs=2,
        type=int,
        default=(2_000, 12_000),
        metavar=("SHORT", "LONG"),
        help=f"the two reply lengths, in {CHUNK}-character chunks (default: 2000 12000)",
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="valgrind runs at a time (counts do not move)"
    )
    parser.add_argument("--none", action="store_true", help="count no middleware too")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="count the model's own stream, in one thread, with and without the cutter",
    )
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "REPLY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run(args.child[0], Path(args.child[1]))
        return
    short, long = args.tokens
    if not 0 < short < long:
        parser.error("--tokens wants 0 < SHORT < LONG")
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on the PATH")
    on_name, off_name = ("direct-on", "direct-off") if args.direct else ("on", "off")
    variants = [on_name, off_name, *(["none"] if args.none and not args.direct else [])]
    through = (
        "the model's own stream, in one thread"
        if args.direct
        else 'create_agent (stream_mode="messages")'
    )
    print(
        f"A healthy reply streamed in {CHUNK}-character chunks through {through},"
        f" counted by callgrind at {short:,} and {long:,} tokens;"
        f" per chunk = difference / {long - short:,}.\n",
        flush=True,
    )
    print(
        f"| variant | {short:,} tokens | {long:,} tokens | per chunk |\n|---|---|---|---|",
        flush=True,
    )
    per_chunk: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="text-instructions-") as tmp,
        ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        out_dir = Path(tmp)
        replies = {}
        for tokens in (short, long):
            replies[tokens] = out_dir / f"{tokens}-tokens.txt"
            replies[tokens].write_text(healthy_text(tokens * CHUNK), encoding="utf-8")
        counts: dict[tuple[str, int], Future[int]] = {
            (variant, tokens): pool.submit(count, variant, replies[tokens], out_dir)
            for tokens in (long, short)  # the long counts first: they take longest
            for variant in variants
        }
        for variant in variants:  # in order, each as soon as its two counts are in
            low, high = counts[variant, short].result(), counts[variant, long].result()
            per_chunk[variant] = (high - low) / (long - short)
            print(
                f"| {variant}: {VARIANTS[variant]} | {low:,} | {high:,} |"
                f" {per_chunk[variant] / 1e3:,.1f}k |",
                flush=True,
            )
    on, off = per_chunk[on_name], per_chunk[off_name]
    share = (on - off) / off
    print(
        f"\nthe check adds (on - off) / off = {share:.2%} of the streamed run"
        f" ({(on - off) / 1e3:,.1f}k instructions per chunk)"
    )
    if "none" in per_chunk:
        none = per_chunk["none"]
        print(
            f"context: the middleware with the check off adds {(off - none) / none:.2%}"
            f" per chunk to no middleware, with the check on {(on - none) / none:.2%}"
        )
    verdict = "holds" if share <= TARGET else "MISSED"
    print(f"target: the check ≤ {TARGET:.0%} of the streamed run: {share:.2%}, {verdict}")


if __name__ == "__main__":
    main()
