"""Debian's headless Chromium, for the tests that open pages in a real browser, and the folder
their screenshots are kept in for a person to look at."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

CHROMIUM = Path("/usr/bin/chromium")
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def need_chromium() -> None:
    """Skip without Chromium, except under CI, which installs it (`.ci/run`)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: CI installs Debian's chromium (.ci/run)")
        pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium)")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with a profile of its own."""
    return subprocess.run(
        [str(CHROMIUM), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def artifacts(name: str) -> Path:
    """The folder for one test module's screenshots: `$LOOP_GUARD_ARTIFACTS/<name>`, else
    `artifacts/<name>` in the repository."""
    folder = Path(os.environ.get("LOOP_GUARD_ARTIFACTS") or ROOT / "artifacts") / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
