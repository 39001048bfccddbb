"""The `loop-guard` command: `loop-guard demo`, `loop-guard scan` and `loop-guard report`."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from loop_guard._config import ENV_PREFIX, LoopGuardConfig, layered_config, parse_setting

_SETTING = "setting_"  # the argparse dest prefix of the LoopGuardConfig flags


EXIT_BUG = 70  # sysexits.h's EX_SOFTWARE: an error in loop-guard itself
_EXIT_STATUS = (
    "Exit status, added up: 1 when the guard would have stepped in (scan only), 2 when a "
    "source could not be read (or a setting is wrong), 4 when parts of a source (threads, "
    "lines) could not be read and the rest was reported; 0 when none of these. Each "
    "unreadable source, thread or line is named on standard error. 70: a bug in loop-guard."
)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run a subcommand; returns the exit status.

    Output piped into a reader that stops early (`loop-guard demo | head`) ends the
    command quietly, as other command-line tools do. A bug in loop-guard is one line on
    standard error and status 70; LOOP_GUARD_DEBUG=1 shows its traceback instead.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that this flush
        # does not fail a second time with a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130  # a shell's status for a command ended by Ctrl-C
    except Exception as error:
        if os.environ.get("LOOP_GUARD_DEBUG", "") not in ("", "0"):
            raise
        print(
            f"loop-guard: internal error, a bug in loop-guard: {_one_line(error)} "
            "(rerun with LOOP_GUARD_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_BUG


def _one_line(error: BaseException) -> str:
    """An exception's type and message, on one line."""
    return " ".join(f"{type(error).__name__}: {error}".split())


def _main(argv: Sequence[str] | None) -> int:
    from loop_guard import __version__

    parser = argparse.ArgumentParser(
        prog="loop-guard",
        description="Stop LangChain and LangGraph agents that repeat the same tool call.",
    )
    parser.add_argument("--version", action="version", version=f"loop-guard {__version__}")
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
        description="Replay conversation files, LangGraph SQLite checkpoint databases, "
        "LangGraph PostgreSQL checkpointers (postgresql://user@host:5432/db) and traces "
        "(LangSmith runs as JSON Lines, OTLP JSON spans, a Phoenix project: "
        "phoenix://host:6006/PROJECT) through the guard. " + _EXIT_STATUS,
    )
    scan.add_argument(
        "paths",
        nargs="+",
        metavar="PATH|URL",
        help="a conversation file, a LangGraph SQLite checkpoint database, the URL of a "
        "LangGraph PostgreSQL checkpointer's database, a LangSmith runs export or OTLP JSON "
        "file, or a Phoenix project's phoenix:// URL",
    )
    scan.add_argument(
        "--thread", help="the thread to read from a checkpoint database (default: every thread)"
    )
    scan.add_argument("--json", action="store_true", help="print JSON for machines")
    _add_window_flags(scan)
    _add_setting_flags(scan)
    report = commands.add_parser(
        "report",
        help="a fleet report: how often recorded threads looped, what it cost, and where",
        description="Scan every thread of the sources (what `loop-guard scan` reads) into one "
        "self-contained HTML page and, with --json, the same numbers for dashboards. "
        + _EXIT_STATUS,
    )
    report.add_argument("paths", nargs="+", metavar="PATH|URL",
                        help="as for `loop-guard scan`; a folder: every file in it")  # fmt: skip
    report.add_argument("-o", "--output", type=Path, metavar="HTML",
                        help="the page to write (default: loop-guard-report.html, unless "
                        "only --json is asked for)")  # fmt: skip
    report.add_argument("--json", type=Path, metavar="PATH", dest="json_out",
                        help="also write the numbers as JSON (- for standard output)")  # fmt: skip
    report.add_argument("--compare", metavar="FLAGS",
                        help="scan the same threads with other settings too, and show "
                        "what changes, e.g. --compare='--block-threshold 8'")  # fmt: skip
    report.add_argument("--worst", type=_integer, default=10, metavar="N",
                        help="the threads whose timelines are shown (default: 10)")  # fmt: skip
    report.add_argument("--jobs", type=_integer, metavar="N",
                        help="worker processes (default: one per core)")  # fmt: skip
    _add_window_flags(report)
    _add_setting_flags(report)
    args = parser.parse_args(argv)
    if args.command == "scan":
        return _scan(args)
    if args.command == "report":
        return _report(args)
    try:
        from loop_guard.demo import ModelError, run_demo
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
            f"loop-guard demo: cannot start the model {args.model!r}: {_one_line(error)} "
            "(or run `loop-guard demo` without --model: offline, no key)",
            file=sys.stderr,
        )
        return 2
    try:
        return run_demo(model=model)
    except ModelError as error:  # the provider rejected the call or could not be reached
        print(f"loop-guard demo: the model {args.model!r} ({type(model).__name__}) failed: "
              f"{_one_line(error.__cause__ or error)}", file=sys.stderr)  # fmt: skip
        return 2


def _scan(args: argparse.Namespace) -> int:
    from loop_guard._window import Window
    from loop_guard.scan import EXIT_UNREADABLE, run_scan

    try:
        config = _scan_config(args, os.environ)
        window = Window(args.since, args.until)
    except ValueError as error:
        print(f"loop-guard scan: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    return run_scan(args.paths, config, thread=args.thread, as_json=args.json, window=window)


def _report(args: argparse.Namespace) -> int:
    from loop_guard._window import Window
    from loop_guard.report import run_report
    from loop_guard.scan import EXIT_UNREADABLE

    try:
        config = _scan_config(args, os.environ)
        window = Window(args.since, args.until)
        compare = None
        if args.compare is not None:
            settings = argparse.ArgumentParser(prog="--compare", add_help=False)
            _add_setting_flags(settings)
            other = settings.parse_args(shlex.split(args.compare))
            compare = (args.compare.strip(), _scan_config(other, os.environ))
    except (ValueError, SystemExit) as error:
        print(f"loop-guard report: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    html = args.output
    if html is None and args.json_out is None:
        html = Path("loop-guard-report.html")
    given = any(getattr(args, name) is not None for name in vars(args) if name.startswith(_SETTING))
    label = "your settings" if given or args.pi else "defaults"
    return run_report(args.paths, config, html=html, json_out=args.json_out, label=label,
                      compare=compare, worst=args.worst, jobs=args.jobs, window=window)  # fmt: skip


def _add_window_flags(parser: argparse.ArgumentParser) -> None:
    """`--since` and `--until`: the threads whose latest checkpoint falls in a time window."""
    when = ("an ISO date or date and time (UTC unless it names a zone: 2025-06-02, "
            "2025-06-02T09:30+02:00) or a duration ago (12h, 7d, 2w)")  # fmt: skip
    parser.add_argument("--since", type=_moment, metavar="TIME",
                        help="only the threads whose latest checkpoint is at or after TIME: "
                        f"{when}; conversation files record no times and are rejected")  # fmt: skip
    parser.add_argument("--until", type=_moment, metavar="TIME",
                        help="only the threads whose latest checkpoint is before TIME")  # fmt: skip


def _moment(text: str) -> datetime:
    from loop_guard._window import moment

    try:
        return moment(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every `LoopGuardConfig` field, derived from the dataclass, and `--pi`."""
    group = parser.add_argument_group(
        "settings",
        "Every LoopGuardConfig setting. A flag wins over --pi, which wins over the "
        "LOOP_GUARD_* variables.",
    )
    group.add_argument(
        "--pi",
        action="store_true",
        help="start from LoopGuardConfig.pi(): the Pi extension's behaviour, every detector "
        "beyond it off",
    )
    defaults, helps = LoopGuardConfig(), _setting_help()
    for field in dataclasses.fields(LoopGuardConfig):
        default = getattr(defaults, field.name)
        option, dest = "--" + field.name.replace("_", "-"), _SETTING + field.name
        text = helps.get(field.name, f"LoopGuardConfig.{field.name}")
        if isinstance(default, bool):
            shown = f"--{'' if default else 'no-'}{option[2:]}"
            group.add_argument(option, action=argparse.BooleanOptionalAction, dest=dest,
                               help=f"{text} (default: {shown})")  # fmt: skip
        elif isinstance(default, int):
            group.add_argument(option, type=_integer, metavar="N", dest=dest,
                               help=f"{text} (default: {default})")  # fmt: skip
        elif isinstance(default, frozenset):
            group.add_argument(option, metavar="A,B", dest=dest,
                               help=f"{text} Comma-separated.")  # fmt: skip
        elif isinstance(default, Mapping):
            group.add_argument(option, metavar="JSON", dest=dest,
                               help=f'{text} As LOOP_GUARD_{field.name.upper()}, e.g. '
                               '\'{"poll_job": {"block_threshold": 30}}\'.')  # fmt: skip
        else:  # a setting of a new kind: teach the scan to take it
            msg = f"no command-line flag for LoopGuardConfig.{field.name}: {field.type}"
            raise TypeError(msg)


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        msg = f"expected an integer, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _setting_help() -> dict[str, str]:
    """The first sentence of each attribute in `LoopGuardConfig`'s docstring."""
    doc = inspect.cleandoc(LoopGuardConfig.__doc__ or "")
    section = doc.partition("Attributes:\n")[2].partition("\n\n")[0]
    found = {}
    for name, text in re.findall(r"^    (\w+): (.*?)(?=^    \w+: |\Z)", section, re.M | re.S):
        sentences = " ".join(text.split()).split(". ")
        short = ". ".join(sentences[:2] if len(sentences[0]) < 40 else sentences[:1])
        found[name] = short.rstrip(".").replace("%", "%%") + "."
    return found


def _scan_config(args: argparse.Namespace, environ: Mapping[str, str]) -> LoopGuardConfig:
    """Flags, over `--pi`, over the LOOP_GUARD_* variables, over the defaults.

    Unlike a guard, which keeps a setting's default on a bad variable (and warns) so the agent
    stays guarded, the scan will not run: it must not report with settings it was not given, and a
    disabled guard would report every conversation as clean.
    """
    flags: dict[str, Any] = {}
    for field in dataclasses.fields(LoopGuardConfig):
        value = getattr(args, _SETTING + field.name)
        if isinstance(value, str):  # names and the tools' JSON: spelt as their variables
            try:
                value = parse_setting(field.name, value)
            except ValueError as error:
                msg = f"--{field.name.replace('_', '-')}: {error}"
                raise ValueError(msg) from error
        if value is not None:
            flags[field.name] = value
    base = LoopGuardConfig.pi() if args.pi else None
    config = layered_config(flags, environ, base=base, strict=True)
    if not config.enabled:
        source = "--no-enabled" if "enabled" in flags else f"{ENV_PREFIX}ENABLED"
        msg = f"the guard is disabled ({source}): a scan would report every conversation clean"
        raise ValueError(msg)
    return config


if __name__ == "__main__":
    sys.exit(main())
