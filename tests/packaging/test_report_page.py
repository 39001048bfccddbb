"""The `loop-guard report` page: one self-contained HTML file (no script, nothing fetched),
every chart drawn and accessible, every string of the report escaped; and, in Debian's
headless Chromium, every chart is in the rendered page. Without the browser that test skips,
except under CI, where it must be there. A screenshot is saved in `artifacts/report/` (or
`$LOOP_GUARD_ARTIFACTS`) for a person to look at.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from loop_guard._report_page import render_page
from tests.support.browser import ReportPage as Page
from tests.support.browser import artifacts, chromium, need_chromium

pytestmark = pytest.mark.internals(reason="renders report dicts the tests build themselves")

CHARTS = {"outcomes", "shapes", "tools", "cost", "loop-length", "timeline", "compare"}
HOSTILE = 'db.sqlite:<script>alert("x")</script>&"'

EVENTS = [
    {"call": 3, "kind": "steer", "tool": "read_file", "reason": "repeat"},
    {"call": 5, "kind": "block", "tool": "read_file", "reason": "repeat"},
    {"call": 7, "kind": "stop", "tool": "read_file", "reason": "abort_threshold"},
]
OUTCOMES = {"steered": 40, "blocked": 25, "stopped": 12, "clean": 1180}
COST = {
    "model_calls": 300,
    "tool_runs": 250,
    "tokens": 900_000,
    "tool_runs_saved": 80,
    "model_calls_saved": 70,
    "tokens_saved": 400_000,
}
REPORT: dict[str, Any] = {
    "version": 1,
    "label": "defaults",
    "threads": 1234,
    "unreadable": 2,
    "outcomes": OUTCOMES,
    "shapes": {
        "repeat": 30,
        "cycle": 5,
        "interleaved": 3,
        "returned": 2,
        "same_error": 4,
        "unknown_tool": 1,
    },
    "tools": [
        {"tool": "read_file", "threads": 20, "steers": 22, "blocks": 30, "stops": 8},
        {
            "tool": "search_the_web_for_documents",
            "threads": 9,
            "steers": 9,
            "blocks": 4,
            "stops": 2,
        },
        {"tool": "<b>list_dir</b>", "threads": 3, "steers": 3, "blocks": 0, "stops": 0},
    ],
    "cost": COST,
    "loop_lengths": [
        {"length": "1", "threads": 3},
        {"length": "2", "threads": 9},
        {"length": "3-4", "threads": 14},
        {"length": "5-9", "threads": 21},
        {"length": "10-19", "threads": 11},
        {"length": "20-49", "threads": 5},
        {"length": "50+", "threads": 1},
    ],
    "worst": [
        {
            "thread": "db.sqlite:user-42",
            "calls": 57,
            "model_calls": 40,
            "tokens": 120_000,
            "events": EVENTS,
        },
        {
            "thread": HOSTILE,
            "calls": 31,
            "model_calls": 22,
            "tokens": 61_000,
            "events": [
                {"call": 4, "kind": "steer", "tool": "<i>grep</i>", "reason": "cycle"},
                {"call": 9, "kind": "stop", "tool": "<i>grep</i>", "reason": "use_terminate"},
            ],
        },
        {
            "thread": "db.sqlite:user-7",
            "calls": 12,
            "model_calls": 6,
            "tokens": 9_500,
            "events": [{"call": 6, "kind": "steer", "tool": "search", "reason": "same_error"}],
        },
    ],
    "compare": {
        "label": "--pi",
        "threads": 1234,
        "outcomes": {"steered": 52, "blocked": 18, "stopped": 7, "clean": 1170},
        "cost": {**COST, "model_calls": 210, "tokens": 610_000, "model_calls_saved": 120},
        "changed_count": 17,
        "changed": [
            {
                "thread": HOSTILE,
                "before": "stopped",
                "after": "steered",
                "model_calls_before": 10,
                "model_calls_after": 4,
            },
            {
                "thread": "db.sqlite:user-9",
                "before": "clean",
                "after": "blocked",
                "model_calls_before": 0,
                "model_calls_after": 2,
            },
        ],
    },
}


def test_the_page_draws_every_chart_self_contained_and_escaped() -> None:
    page = render_page(REPORT)
    parsed = Page(page)
    assert set(parsed.charts) == CHARTS
    assert parsed.charts.count("timeline") == len(REPORT["worst"])
    assert "<script" not in page.lower()
    assert "http://" not in page
    assert "https://" not in page
    assert not [link for link in parsed.links if not link.startswith("#")]
    assert len(parsed.ids) == len(set(parsed.ids)), "an element id is used twice"
    assert {link[1:] for link in parsed.links} <= set(parsed.ids)  # the links lead somewhere
    text = " ".join(parsed.text)
    assert HOSTILE in text  # shown as text, not as markup
    assert "<b>list_dir</b>" in text
    assert "<b>" not in page
    assert "db.sqlite:&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&quot;" in page
    assert "thread-db-sqlite-script-alert-x-script" in parsed.ids
    for words in ("3.2%", "2.0%", "1.0%", "900k", "400k", "17 threads changed outcome", "--pi"):
        assert words in text, words


def test_the_page_shows_events_by_shape_and_each_thread_by_its_id() -> None:
    page = render_page(REPORT)
    timelines = page.split('data-chart="timeline"')[1:]
    first = timelines[0].split("</svg>")[0]
    assert first.count('class="steer"') == first.count('class="block"') == 1
    assert first.count('<rect class="stop"') == 1
    assert 'id="thread-db-sqlite-user-42"' in page
    assert "40 model calls, 120,000 tokens" in page


def test_empty_sections_say_none() -> None:
    quiet = copy.deepcopy(REPORT)
    quiet.update(
        outcomes={"steered": 0, "blocked": 0, "stopped": 0, "clean": 1234},
        shapes={},
        tools=[],
        cost=dict.fromkeys(COST, 0),
        loop_lengths=[{**bucket, "threads": 0} for bucket in REPORT["loop_lengths"]],
        worst=[],
        compare=None,
    )
    parsed = Page(render_page(quiet))
    assert parsed.charts == ["outcomes"]
    assert [words.strip() for words in parsed.text].count("none") == 5


def test_an_empty_report_says_there_are_no_threads() -> None:
    empty = {
        **REPORT,
        "threads": 0,
        "unreadable": 0,
        "outcomes": dict.fromkeys(OUTCOMES, 0),
        "shapes": {},
        "tools": [],
        "cost": dict.fromkeys(COST, 0),
        "loop_lengths": [],
        "worst": [],
        "compare": None,
    }
    page = render_page(empty)
    assert "No threads were scanned" in page
    assert not Page(page).charts


def test_another_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="version 2"):
        render_page({**REPORT, "version": 2})


@pytest.mark.slow
def test_the_page_renders_in_a_browser(tmp_path: Path) -> None:
    """Opened from a file in headless Chromium, the page holds every chart and one timeline
    per worst thread; its screenshot is saved."""
    need_chromium()
    html = tmp_path / "report.html"
    html.write_text(render_page(REPORT), encoding="utf-8")
    opened = chromium(tmp_path / "profile", "--dump-dom", html.as_uri())
    assert opened.returncode == 0, opened.stderr[-2000:]
    dom = Page(opened.stdout)
    assert set(dom.charts) == CHARTS
    assert dom.charts.count("timeline") == len(REPORT["worst"])
    rows = [anchor for anchor in dom.ids if anchor.startswith("thread-")]
    assert len(rows) == len(REPORT["worst"])
    assert HOSTILE in " ".join(dom.text)

    shot = artifacts("report") / "report.png"
    shot.unlink(missing_ok=True)
    taken = chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400", html.as_uri()
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
    assert shot.stat().st_size > 10_000
