"""The `loop-guard` command run in this process or as a real one, for the tests of its output
and status."""

from __future__ import annotations

import io
import subprocess
import sys

from loop_guard.cli import main


def run_cli(*args: str) -> tuple[int, str, str]:
    """`loop-guard ARGS` in this process: (status, stdout, stderr); argparse's exits too."""
    out, err = io.StringIO(), io.StringIO()
    original = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1 if exit_.code else 0
    finally:
        sys.stdout, sys.stderr = original
    return status, out.getvalue(), err.getvalue()


def run_process(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m loop_guard ARGV` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "loop_guard", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
