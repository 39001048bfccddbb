"""Debian's headless Chromium, for the tests that open pages in a real browser, the folder
their screenshots are kept in for a person to look at, and a reader of the fleet report's
page."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

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


def measured(page: str, measure: str, folder: Path, *args: str) -> Any:
    """What the script `measure` finds in `page` once headless Chromium (with `args`) has
    laid it out: `measure` is JavaScript that defines `measured`, a JSON-safe value."""
    script = (
        f"<script>\n{measure}\n"
        'const out = document.createElement("pre");\n'
        'out.id = "measured";\n'
        "out.textContent = JSON.stringify(measured);\n"
        "document.body.append(out);\n</script>"
    )
    path = folder / "measured.html"
    path.write_text(page.replace("</body>", script + "</body>"), encoding="utf-8")
    opened = chromium(folder / "profile", *args, "--dump-dom", path.as_uri())
    assert opened.returncode == 0, opened.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', opened.stdout, re.S)
    assert found is not None, opened.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


def artifacts(name: str) -> Path:
    """The folder for one test module's screenshots: `$LOOP_GUARD_ARTIFACTS/<name>`, else
    `artifacts/<name>` in the repository."""
    folder = Path(os.environ.get("LOOP_GUARD_ARTIFACTS") or ROOT / "artifacts") / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class ReportPage(HTMLParser):
    """What a fleet report's page holds: each chart's `data-chart` name (one per chart
    drawn), its element ids, its links, and its text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: list[str] = []
        self.ids: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []
        self.svgs_without_title: int = 0
        self._open_svg: str | None = None  # the chart whose `<title>` is still to come
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.ids.append(values["id"])
        self.links += [values[name] for name in ("href", "src") if name in values]
        if tag == "svg" and "data-chart" in values:
            self.charts.append(values["data-chart"])
            assert values.get("role") == "img", values
            self._open_svg = values["data-chart"]
        elif tag in {"title", "desc"} and self._open_svg is not None:
            assert tag == "title", f"{self._open_svg}: its first child is not its <title>"
            self._open_svg = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
