"""The `loop-guard` command: `loop-guard demo` and `loop-guard scan`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from loop_guard._config import resolve_config


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run a subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="loop-guard",
        description="Stop LangChain and LangGraph agents that repeat the same tool call.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="watch the guard stop a stubborn agent (offline, no API key)"
    )
    demo.add_argument(
        "--model",
        metavar="PROVIDER:NAME",
        help="run the guarded agent on a real chat model (e.g. openai:gpt-4o-mini) "
        "through langchain's init_chat_model; needs that provider's package and API key",
    )
    scan = commands.add_parser(
        "scan",
        help="replay recorded conversations: where would the guard have stepped in?",
        description="Exit status: 0 when the guard would not have stepped in, 1 when it "
        "would have (a steer, a block or a stop), 2 when a file could not be read.",
    )
    scan.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    scan.add_argument("--thread", help="the thread to read from a LangGraph SQLite database")
    scan.add_argument("--json", action="store_true", help="print JSON for machines")
    for option in ("warn", "block", "abort", "backstop", "same-error"):
        scan.add_argument(f"--{option}-threshold", type=int, metavar="N")
    scan.add_argument("--ignore-tools", metavar="A,B", help="comma-separated tool names")
    scan.add_argument("--ignore-errors", action="store_true", default=None)
    scan.add_argument("--use-terminate", action="store_true", default=None)
    args = parser.parse_args(argv)
    if args.command == "scan":
        return _scan(args)
    try:
        from loop_guard.demo import run_demo
    except ImportError as error:
        print(
            f"loop-guard demo needs the `agents` extra ({error}): "
            "pip install 'langchain-loop-guard[agents]'",
            file=sys.stderr,
        )
        return 2
    if args.model is None:
        return run_demo()
    try:
        from langchain.chat_models import init_chat_model

        model = init_chat_model(args.model)
    except Exception as error:  # a missing provider package or key: say so, no traceback
        print(
            f"loop-guard: cannot start the model {args.model!r}: {error}\n"
            "Install its provider package (for example `pip install langchain-openai`) and "
            "set its API key (for example OPENAI_API_KEY), or run `loop-guard demo` "
            "without --model.",
            file=sys.stderr,
        )
        return 2
    return run_demo(model=model)


def _scan(args: argparse.Namespace) -> int:
    from loop_guard.scan import EXIT_UNREADABLE, run_scan

    names = [
        "warn_threshold",
        "block_threshold",
        "abort_threshold",
        "backstop_threshold",
        "same_error_threshold",
        "ignore_tools",
        "ignore_errors",
        "use_terminate",
    ]
    overrides = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    try:
        config = resolve_config(None, overrides)  # flags win over LOOP_GUARD_* variables
    except ValueError as error:
        print(f"loop-guard scan: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    return run_scan(args.paths, config, thread=args.thread, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
