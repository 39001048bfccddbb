"""The `loop-guard report` page: one self-contained HTML file (no script, nothing fetched),
every chart drawn and accessible, every string of the report escaped; and, in Debian's
headless Chromium, every chart is in the rendered page. Without the browser that test skips,
except under CI, where it must be there. A screenshot is saved in `artifacts/report/` (or
`$LOOP_GUARD_ARTIFACTS`) for a person to look at.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from loop_guard._report_page import render_page
from tests.support.browser import ReportPage as Page
from tests.support.browser import artifacts, chromium, measured, need_chromium

pytestmark = pytest.mark.internals(reason="renders report dicts the tests build themselves")

CHARTS = {"outcomes", "shapes", "tools", "cost", "loop-length", "timeline", "compare"}
HOSTILE = 'db.sqlite:<script>alert("x")</script>&"'

EVENTS = [
    {"call": 3, "kind": "steer", "tool": "read_file", "reason": "repeat", "agent": None},
    {"call": 5, "kind": "block", "tool": "read_file", "reason": "repeat", "agent": None},
    {"call": 7, "kind": "stop", "tool": "read_file", "reason": "abort_threshold", "agent": None},
]
OUTCOMES = {"steered": 40, "blocked": 25, "stopped": 12, "clean": 1180}
COST = {
    "model_calls": 300,
    "tool_runs": 250,
    "tokens": 900_000,
    "tool_runs_saved": 80,
    "model_calls_saved": 70,
    "tokens_saved": 400_000,
    "chars_kept_out": 2_400_000,
    "tokens_kept_out": 600_000,
}
LONG_LABEL = '--block-threshold 8 --no-detect-cycles --tools \'{"poll_job": {"volatile": true}}\''
REPORT: dict[str, Any] = {
    "version": 1,
    "label": "defaults",
    "sources": ["db.sqlite", "postgresql://ops:***@db.internal/agents"],
    "generated": "2026-05-09T07:35:25+00:00",
    "window": {"since": "2026-05-01T00:00:00+00:00", "until": None},
    "span": {"first": "2026-05-01T08:12:00+00:00", "last": "2026-05-08T22:40:10+00:00"},
    "threads": 1234,
    "threads_with_token_usage": 1234,
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
    "between_agents": 1,
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
            "agents": [],
        },
        {
            "thread": HOSTILE,
            "calls": 31,
            "model_calls": 22,
            "tokens": 61_000,
            "events": [
                {
                    "call": 4,
                    "kind": "steer",
                    "tool": "<i>grep</i>",
                    "reason": "cycle",
                    "agent": None,
                },
                {
                    "call": 9,
                    "kind": "stop",
                    "tool": "<i>grep</i>",
                    "reason": "use_terminate",
                    "agent": None,
                },
            ],
            "agents": [],
        },
        {
            "thread": "db.sqlite:user-7",
            "calls": 12,
            "model_calls": 6,
            "tokens": 9_500,
            "events": [
                {
                    "call": 6,
                    "kind": "steer",
                    "tool": "search",
                    "reason": "same_error",
                    "agent": "bob",
                }
            ],
            "agents": [  # a handoff ping-pong: the agents take turns
                {"agent": agent, "first": call, "last": call}
                for call, agent in enumerate(["alice", "bob"] * 6, start=1)
            ],
        },
    ],
    "compare": {
        "label": LONG_LABEL,
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
    for words in ("3.2%", "2.0%", "1.0%", "900k", "400k", "17 threads changed outcome"):
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


def test_the_page_says_what_it_read_and_when() -> None:
    text = " ".join(Page(render_page(REPORT)).text)
    for words in (
        "db.sqlite, postgresql://ops:***@db.internal/agents",
        "Generated 2026-05-09 07:35 UTC",
        "last active from 2026-05-01 08:12 UTC to 2026-05-08 22:40 UTC",
        "Window: threads last active since 2026-05-01 00:00 UTC",
    ):
        assert words in text, words
    files = {**REPORT, "window": {"since": None, "until": None}, "span": None}
    text = " ".join(Page(render_page(files)).text)
    assert "The sources record no times" in text
    assert "Window" not in text


def test_the_outcomes_say_that_they_nest() -> None:
    text = " ".join(Page(render_page(REPORT)).text)
    for words in ("of which blocked", "of which stopped", "steered and clean add up to 100%",
                  "a stopped thread was also blocked and steered"):  # fmt: skip
        assert words in text, words


def test_what_compaction_would_keep_out_is_a_headline_figure_when_it_would() -> None:
    text = " ".join(Page(render_page(REPORT)).text)
    assert "compact_repeats  would keep out 2.4M characters of context, 600k tokens" in text
    nothing = copy.deepcopy(REPORT)
    for cost in (nothing["cost"], nothing["compare"]["cost"]):
        cost.update(chars_kept_out=0, tokens_kept_out=0)
    assert "compact_repeats" not in " ".join(Page(render_page(nothing)).text)


def test_the_comparison_shows_what_compaction_would_keep_out_under_each() -> None:
    compared = copy.deepcopy(REPORT)
    compared["compare"]["cost"].update(chars_kept_out=1_800_000, tokens_kept_out=450_000)
    section = render_page(compared).split('id="h-compare"')[1]
    text = re.sub(r"\s+", " ", " ".join(Page(section).text))
    assert "compact_repeats would keep out 2,400,000 1,800,000" in text
    assert "tokens compact_repeats would keep out 600,000 450,000" in text
    for cost in (compared["cost"], compared["compare"]["cost"]):
        cost.update(chars_kept_out=0, tokens_kept_out=0)
    assert "compact_repeats" not in render_page(compared).split('id="h-compare"')[1]


def test_tokens_the_model_never_reported_are_said_to_be_unknown_not_zero() -> None:
    unknown = {"tokens": None, "tokens_saved": None, "tokens_kept_out": None}
    silent = copy.deepcopy(REPORT)
    silent["threads_with_token_usage"] = 0
    silent["cost"].update(unknown)
    silent["compare"]["cost"].update(unknown)
    for entry in silent["worst"]:
        entry["tokens"] = None
    page = render_page(silent)
    text = " ".join(Page(page).text)
    assert "not reported by the model" in text
    assert not re.search(r"(?<![\d,])0 tokens", text)
    costs = re.finditer(r'<svg[^>]*data-chart="(cost|compare)".*?</svg>', page, re.S)
    assert [chart.group(1) for chart in costs if "tokens" in chart.group()] == []  # no bar
    partly = {**REPORT, "threads_with_token_usage": 1000}
    text = " ".join(Page(render_page(partly)).text)
    assert "reported by the model in 1,000 of 1,234 threads" in text


# Run in the page by the browser test: where the comparison's legend items end, against the
# page's column, and each bar of the comparison's chart, as drawn.
MEASURE = """
const column = document.querySelector("main").getBoundingClientRect();
const section = document.getElementById("h-compare").parentElement;
const measured = {
  legend: [...section.querySelectorAll(".legend li")].map((item) => ({
    text: item.textContent,
    inside: item.getBoundingClientRect().right <= column.right + 0.5,
  })),
  bars: [...section.querySelectorAll('svg[data-chart="compare"] g')].map((bar) => ({
    title: bar.querySelector("title").textContent,
    width: bar.querySelector("rect:not(.track)").getBBox().width,
  })),
  room: section.querySelector('svg[data-chart="compare"] rect.track').getBBox().width,
};
"""


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

    # On a phone's width, the compared settings are named whole, inside the column; every
    # share is drawn on one 0-100% scale, and each cost measure's two bars on one scale.
    found = measured(render_page(REPORT), MEASURE, tmp_path, "--window-size=400,900")
    legend = {item["text"].strip(): item["inside"] for item in found["legend"]}
    assert legend == {"before: defaults": True, f"after: {LONG_LABEL}": True}
    values = {
        "steered threads": (40, 52),
        "of which blocked": (25, 18),
        "of which stopped": (12, 7),
        "model calls spent in loops": (300, 210),
        "tool runs spent in loops": (250, 250),
        "tokens spent in loops": (900_000, 610_000),
    }
    widths: dict[str, list[float]] = {}
    for bar in found["bars"]:
        label, _, series = bar["title"].rpartition(", ")
        assert series.split(":")[0] == ["before", "after"][len(widths.get(label, []))]
        widths.setdefault(label, []).append(bar["width"])
    assert set(widths) == set(values)
    for label, (before, after) in values.items():
        if label.endswith("spent in loops"):  # the larger fills the room: one scale for both
            assert widths[label][0] * after == pytest.approx(widths[label][1] * before, rel=0.01)
            assert max(widths[label]) == pytest.approx(found["room"])
        else:
            # A share's bar is its part of the track (a share above zero shows at least 2).
            drawn = [max(found["room"] * n / REPORT["threads"], 2.0) for n in (before, after)]
            assert widths[label] == pytest.approx(drawn, rel=0.01), label

    shot = artifacts("report") / "report.png"
    shot.unlink(missing_ok=True)
    taken = chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400", html.as_uri()
    )
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
    assert shot.stat().st_size > 10_000
