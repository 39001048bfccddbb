"""The documentation site builds with no warning, every link in it leads somewhere, each page
renders in a real browser, and every Python snippet of its pages runs.

The build needs the `docs` extra (it skips without it: the dependency floors run has none). The
browser is Debian's headless Chromium: without it the rendering test skips, except under CI,
where it must be there. Screenshots of the home page and of the API reference are saved in
`artifacts/docs/` (or `$LOOP_GUARD_ARTIFACTS`) for a person to look at.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from loop_guard.marks import GUARD_NAME
from tests.support import ROOT
from tests.support.browser import artifacts, chromium, need_chromium
from tests.support.snippets import run_snippets, snippets, user_namespace

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
# Pages whose snippets define everything they use: they run in a namespace that starts empty.
STANDALONE = {"graph.md"}


class Page(HTMLParser):
    """What a built page holds: its element ids, its links and its first `h1`'s text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.classes: set[str] = set()
        self.h1: str | None = None
        self._in_h1 = False
        self._h1_parts: list[str] = []
        self._skip = 0  # inside a permalink of the h1
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.ids.add(values["id"])
        self.classes.update(values.get("class", "").split())
        for name in ("href", "src"):
            if name in values and tag in {"a", "link", "script", "img"}:
                self.links.append(values[name])
        if tag == "h1" and self.h1 is None:
            self._in_h1 = True
        elif self._in_h1 and "headerlink" in values.get("class", ""):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._skip:
            self._skip -= 1
        elif tag == "h1" and self._in_h1:
            self._in_h1 = False
            self.h1 = " ".join("".join(self._h1_parts).split())

    def handle_data(self, data: str) -> None:
        if self._in_h1 and not self._skip:
            self._h1_parts.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with `mkdocs build --strict` (any warning fails the build)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: the site needs the `docs` extra")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "WARNING" not in build.stderr, build.stderr
    return out


def built_pages(site: Path) -> dict[str, Path]:
    """Each documentation page's built HTML, by its Markdown file's name."""
    pages = {}
    for source in PAGES:
        built = site / "index.html" if source.stem == "index" else site / source.stem / "index.html"
        assert built.is_file(), f"{source.name} was not built"
        pages[source.name] = built
    return pages


def test_every_page_is_built_and_in_the_navigation(site: Path) -> None:
    home = Page((site / "index.html").read_text())
    for name, built in built_pages(site).items():
        urls = {".", "./", "index.html"} if name == "index.md" else {f"{Path(name).stem}/"}
        assert urls & set(home.links), f"{name} is not in the navigation"
        assert Page(built.read_text()).h1, f"{name} has no title"


def test_every_internal_link_resolves(site: Path) -> None:
    """Every link of every built page to the site itself names a file that exists, and its
    `#anchor`, if any, is an id of that page."""
    parsed: dict[Path, Page] = {}

    def page(path: Path) -> Page:
        if path not in parsed:
            parsed[path] = Page(path.read_text())
        return parsed[path]

    broken = []
    for html in sorted(site.rglob("*.html")):
        base = "/" + html.relative_to(site).as_posix()
        for link in page(html).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue  # another site
            target_url = urlsplit(urljoin(base, parts.path)).path if parts.path else base
            target = site / unquote(target_url).lstrip("/")
            if target_url.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{base}: {link} (no {target.relative_to(site)})")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and unquote(parts.fragment) not in page(target).ids
            ):
                broken.append(f"{base}: {link} (no #{parts.fragment})")
    assert not broken, "\n".join(broken)


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on loopback, for the browser."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves the site without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_every_page_renders_in_a_browser(site: Path, served: str, tmp_path: Path) -> None:
    """Each page, opened in headless Chromium, shows its title and Material's navigation;
    the home page and the API reference are saved as screenshots."""
    need_chromium()
    for name, built in built_pages(site).items():
        path = "" if name == "index.md" else f"{Path(name).stem}/"
        opened = chromium(tmp_path / "profile", "--dump-dom", served + path)
        assert opened.returncode == 0, opened.stderr[-2000:]
        dom = Page(opened.stdout)
        assert dom.h1 == Page(built.read_text()).h1, f"{name}: its title is not in the DOM"
        assert {"md-nav", "md-header", "md-content"} <= dom.classes, f"{name}: no Material layout"
        if name == "reference.md":
            assert {"loop_guard.LoopGuardMiddleware", "loop_guard.testing"} <= dom.ids

    shots = artifacts("docs")
    for name, path in (("home", ""), ("reference", "reference/")):
        shot = shots / f"{name}.png"
        shot.unlink(missing_ok=True)
        taken = chromium(
            tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900", served + path
        )
        assert taken.returncode == 0, taken.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"


@pytest.mark.parametrize(
    "page", [page for page in PAGES if snippets(page)], ids=lambda page: page.name
)
def test_every_snippet_of_a_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's `python` snippets, in order, in one namespace holding what a user has (a
    model, tools and the like), or nothing for a page whose snippets stand alone: each page is
    read on its own, so it imports what it uses. They run in a folder of their own, as a
    user's project (a snippet may write a database there)."""
    monkeypatch.chdir(tmp_path)
    namespace = {} if page.name in STANDALONE else user_namespace()
    assert run_snippets(page, namespace) or "deepagents" in page.read_text()
    if page.name == "graph.md":  # the hand-built graph stops its stubborn model
        assert namespace["result"]["messages"][-1].name == GUARD_NAME
