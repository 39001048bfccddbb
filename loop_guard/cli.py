"""The `loop-guard` command: `loop-guard demo`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
