"""The `loop-guard report` page: a report drawn as one self-contained HTML file.

The page needs nothing but a browser: inline CSS, charts as inline SVG drawn here, no
JavaScript, fonts or images. Each chart is an `<svg role="img">` with a title and a
description, and comes with a table holding its numbers. Every string of the report is
escaped: thread ids and tool names come from recorded conversations.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["render_page"]

REPORT_VERSION = 1
"""The report schema this page draws."""

_OUTCOMES = ("steered", "blocked", "stopped")
# The outcomes nest (a stopped thread was also blocked, a blocked one also steered): named so.
_NESTED = {"steered": "steered", "blocked": "of which blocked", "stopped": "of which stopped",
           "clean": "clean"}  # fmt: skip
_NESTING = (
    "The outcomes nest: a stopped thread was also blocked and steered, a blocked thread also"
    " steered. Each share is of all the threads scanned: steered and clean add up to 100%."
)
_NOT_REPORTED = "not reported by the model"
_TONE_OF_OUTCOME = {"steered": "steer", "blocked": "block", "stopped": "stop", "clean": "clean"}
_SEVERITY = {"steer": 0, "block": 1, "stop": 2}  # by event kind: the stronger marker on top
_COSTS = (("model_calls", "model calls"), ("tool_runs", "tool runs"), ("tokens", "tokens"))

_WIDTH = 480  # of a bar chart's drawing; the page scales it to the column
_VALUES = 64  # room right of the longest bar for its value
_PAIR_VALUES = 180  # room right of a pair's longer bar for its value and series name
_CLIP = 40  # characters of a bar's label that fit above it
_STRIP = 720  # of a timeline's drawing
_AGENT_TONES = 4  # the tones a timeline tells agents apart by (then they repeat)

_STYLE = """
:root {
  color-scheme: light dark;
  --bg: #ffffff; --fg: #1f2937; --muted: #4b5563; --line: #d1d5db; --panel: #f3f4f6;
  --track: #e5e7eb; --tick: #6b7280; --plain: #2563eb; --clean: #6b7280;
  --steer: #b45309; --block: #dc2626; --stop: #7f1d1d; --stop-edge: #7f1d1d;
  --spent: #2563eb; --saved: #15803d; --other: #7c3aed;
  --agent-0: #0e7490; --agent-1: #a21caf; --agent-2: #4d7c0f; --agent-3: #c2410c;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #111827; --fg: #e5e7eb; --muted: #a1a9b8; --line: #374151; --panel: #1f2937;
    --track: #273244; --tick: #9ca3af; --plain: #60a5fa; --clean: #9ca3af;
    --steer: #fbbf24; --block: #f87171; --stop: #b91c1c; --stop-edge: #fecaca;
    --spent: #60a5fa; --saved: #4ade80; --other: #c4b5fd;
    --agent-0: #22d3ee; --agent-1: #f0abfc; --agent-2: #a3e635; --agent-3: #fdba74;
  }
}
* { box-sizing: border-box; }
body {
  margin: 0; background: var(--bg); color: var(--fg);
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif;
}
main { max-width: 54rem; margin: 0 auto; padding: 1.5rem 1rem 3rem; }
h1 { font-size: 1.75rem; margin: 0 0 .25rem; }
h2 {
  font-size: 1.3rem; margin: 2.25rem 0 .5rem; padding-top: .5rem;
  border-top: 1px solid var(--line);
}
h3 { font-size: 1rem; margin: 1.25rem 0 .25rem; }
p { margin: .25rem 0 .75rem; }
a { color: var(--plain); }
code {
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .92em;
  overflow-wrap: anywhere;
}
table code { overflow-wrap: break-word; }  /* a long name widens its table, which scrolls */
.lead, .meta, .none, summary { color: var(--muted); }
.none { font-style: italic; }
.tiles {
  display: grid; grid-template-columns: repeat(auto-fit, minmax(7.5rem, 1fr)); gap: .75rem;
  margin: 1rem 0;
}
.tiles > div {
  background: var(--panel); border-radius: .5rem; padding: .6rem .9rem;
  border-left: .3rem solid var(--line);
}
.tiles > .steer { border-left-color: var(--steer); }
.tiles > .block { border-left-color: var(--block); }
.tiles > .stop { border-left-color: var(--stop); }
.tiles > .saved { border-left-color: var(--saved); }
.tiles dt { color: var(--muted); font-size: .875rem; }
.tiles dd { margin: 0; font-size: 1.45rem; font-weight: 650; line-height: 1.3; }
.tiles dd.sub { font-size: .875rem; font-weight: 400; color: var(--muted); }
svg.chart { display: block; width: 100%; height: auto; max-width: 36rem; margin: .5rem 0; }
svg.strip { max-width: none; margin: .25rem 0; }
svg text { fill: var(--fg); font-size: 14px; font-family: inherit; }
svg .value, svg .axis { fill: var(--muted); }
svg text.heading { font-weight: 600; }
svg .track { fill: var(--track); }
svg .axis-line { stroke: var(--line); }
svg .ticks { stroke: var(--tick); stroke-width: 1.5; }
svg .plain { fill: var(--plain); }
svg .clean { fill: var(--clean); }
svg .steer { fill: var(--steer); }
svg .block { fill: var(--block); }
svg .stop { fill: var(--stop); stroke: var(--stop-edge); stroke-width: 1.5; }
svg .spent { fill: var(--spent); }
svg .saved { fill: var(--saved); }
svg .other { fill: var(--other); }
svg .ticks.agent-0 { stroke: var(--agent-0); }
svg .ticks.agent-1 { stroke: var(--agent-1); }
svg .ticks.agent-2 { stroke: var(--agent-2); }
svg .ticks.agent-3 { stroke: var(--agent-3); }
svg .swatch.agent-0 { fill: var(--agent-0); }
svg .swatch.agent-1 { fill: var(--agent-1); }
svg .swatch.agent-2 { fill: var(--agent-2); }
svg .swatch.agent-3 { fill: var(--agent-3); }
.scroll { overflow-x: auto; }
table {
  border-collapse: collapse; width: 100%; font-size: .9rem; font-variant-numeric: tabular-nums;
  margin: .25rem 0 .75rem;
}
caption { text-align: left; font-weight: 600; padding: .25rem 0; }
th, td {
  text-align: left; padding: .3rem .6rem; border-bottom: 1px solid var(--line);
  vertical-align: top;
}
thead th { border-bottom-width: 2px; }
.num { text-align: right; white-space: nowrap; }
details { margin: .25rem 0 .75rem; }
summary { cursor: pointer; }
.legend {
  display: flex; flex-wrap: wrap; gap: .35rem 1.25rem; list-style: none; padding: 0;
  margin: .5rem 0;
}
.legend svg { vertical-align: -2px; margin-right: .35rem; }
.threads { list-style: none; padding: 0; margin: 0; }
.threads > li { border-top: 1px solid var(--line); padding: .5rem 0; }
.threads h3 { margin: .25rem 0 0; }
.outcome { white-space: nowrap; }
.outcome::before {
  content: ""; display: inline-block; width: .7em; height: .7em; margin-right: .35em;
  border-radius: 2px; background: var(--clean);
}
.outcome.steer::before { background: var(--steer); }
.outcome.block::before { background: var(--block); }
.outcome.stop::before { background: var(--stop); }
@media (max-width: 36rem) {
  /* the charts shrink with the column: their text grows to stay readable */
  svg text { font-size: 18px; }
  svg.strip text { font-size: 26px; }
}
footer { margin-top: 3rem; font-size: .875rem; color: var(--muted); }
"""


_NONE = '<p class="none">none</p>'


@dataclass(frozen=True)
class _Bar:
    """One bar of a chart: its label, the value its length shows, the text written by it,
    and the CSS class that colours it."""

    label: str
    value: float
    text: str
    tone: str = "plain"


@dataclass(frozen=True)
class _Pair:
    """One measure under two series, drawn as two bars to one scale: where `whole` fills
    the room, on a track (a share: 1), else where the larger value does."""

    label: str
    values: tuple[float, float]
    texts: tuple[str, str]
    whole: float | None = None


def render_page(report: Mapping[str, Any]) -> str:
    """The report (the schema of `loop_guard.report`, version 1) as one HTML page."""
    if report["version"] != REPORT_VERSION:
        raise ValueError(
            f"report version {report['version']!r}: this page draws version {REPORT_VERSION}"
        )
    label = _esc(report["label"])
    threads: int = report["threads"]
    intro = f"Configuration <code>{label}</code> · {_count(threads)} threads scanned"
    if report["unreadable"]:
        intro += f" · {_count(report['unreadable'])} could not be read"
    intro = f'<p class="lead">{intro}</p>{_provenance(report)}'
    if threads:
        anchors = _anchors([entry["thread"] for entry in report["worst"]])
        body = [
            _headline(report),
            _shapes(report["shapes"], report["between_agents"]),
            _tools(report["tools"]),
            _cost(report["cost"]),
            _loop_lengths(report["loop_lengths"]),
            _worst(report["worst"], anchors),
        ]
        if report["compare"] is not None:
            threads_of_worst = (entry["thread"] for entry in report["worst"])
            links = dict(zip(threads_of_worst, anchors, strict=True))
            body.append(_compare(report, links))
    else:
        body = [
            _section("none", "No threads", "<p>No threads were scanned: nothing to report.</p>")
        ]  # a window without threads says so above, in the provenance
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Loop report: {label}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n<main>\n"
        f"<header><h1>Loop report</h1>{intro}</header>\n"
        + "\n".join(body)
        + "\n<footer>Drawn by <code>loop-guard report</code>.</footer>\n</main>\n</body>\n</html>\n"
    )


def _provenance(report: Mapping[str, Any]) -> str:
    """Where the numbers come from and when: the sources, the times of the threads read,
    the window asked for, and when the page was made."""
    kinds = report.get("source_kinds") or {}
    sources = (
        ", ".join(
            _esc(source) + (f" ({_esc(kinds[source])})" if source in kinds else "")
            for source in report["sources"]
        )
        or "no sources"
    )
    span = report["span"]
    times = (
        "The sources record no times."
        if span is None
        else f"Threads last active from {_when(span['first'])} to {_when(span['last'])}."
    )
    window: Mapping[str, str | None] = report["window"]
    bounds = [f"{word} {_when(window[word])}" for word in ("since", "until") if window[word]]
    asked = f"Window: threads last active {' and '.join(bounds)}. " if bounds else ""
    return (
        f'<p class="meta">Read from <code>{sources}</code>. {times} {asked}'
        f"Generated {_when(report['generated'])}.</p>"
    )


def _when(iso: str | None) -> str:
    """An ISO 8601 time as the page writes it, to the minute: `2025-06-02 09:30 UTC`."""
    when = datetime.fromisoformat(str(iso))
    return f"{when:%Y-%m-%d %H:%M} UTC"


def _headline(report: Mapping[str, Any]) -> str:
    threads: int = report["threads"]
    outcomes: Mapping[str, int] = report["outcomes"]
    cost: Mapping[str, int] = report["cost"]
    tiles = [_tile("", "Threads scanned", _count(threads))]
    parents = {"blocked": "steered", "stopped": "blocked"}
    tiles += [
        _tile(
            _TONE_OF_OUTCOME[outcome],
            _NESTED[outcome].capitalize(),
            _percent(outcomes[outcome], threads),
            f"{_count(outcomes[outcome])} threads"
            + (
                f", {_percent(outcomes[outcome], outcomes[parents[outcome]])} of the"
                f" {parents[outcome]}"
                if outcome in parents
                else ""
            ),
        )
        for outcome in _OUTCOMES
    ]
    tiles += [
        _tile(
            tone,
            title,
            _compact(cost["model_calls" + suffix]),
            f"model calls, {_tokens(cost['tokens' + suffix], _compact)}",
        )
        for tone, title, suffix in (("", "Spent in loops", ""), ("saved", "Saved", "_saved"))
    ]
    if cost["chars_kept_out"]:
        tiles.append(
            _tile(
                "saved",
                "<code>compact_repeats</code> would keep out",
                _compact(cost["chars_kept_out"]),
                f"characters of context, {_tokens(cost['tokens_kept_out'], _compact)}",
            )
        )
    bars = [
        _Bar(
            _NESTED[outcome],
            outcomes[outcome],
            _percent(outcomes[outcome], threads),
            _TONE_OF_OUTCOME[outcome],
        )
        for outcome in (*_OUTCOMES, "clean")
    ]
    chart = _bars_svg(
        "outcomes",
        "Outcomes, in percent of the threads scanned",
        "; ".join(f"{bar.label}: {bar.text} ({_count(int(bar.value))} threads)" for bar in bars),
        bars,
        threads,
        track=True,
    )
    table = _table(
        "Threads by outcome: steered, of which blocked, of which stopped; and clean",
        ("Outcome", "Threads", "Share"),
        [(bar.label, _count(int(bar.value)), bar.text) for bar in bars],
    )
    strip = f'<dl class="tiles">{"".join(tiles)}</dl>'
    lead = f'<p class="lead">{_NESTING}{_usage(report)}</p>'
    return _section("outcomes", "At a glance", strip + lead + chart + _details(table))


def _usage(report: Mapping[str, Any]) -> str:
    """Whose tokens the page counts, when not every thread's model reported them."""
    reported: int = report["threads_with_token_usage"]
    threads: int = report["threads"]
    if reported == threads:
        return ""
    if not reported:
        return f" Tokens: {_NOT_REPORTED} (no reply carries its usage)."
    return f" Tokens: reported by the model in {_count(reported)} of {_count(threads)} threads."


def _tokens(tokens: int | None, written: Callable[[int], str]) -> str:
    """A count of tokens in words (`written`: how a number is), or that the model reported
    none."""
    return f"tokens {_NOT_REPORTED}" if tokens is None else f"{written(tokens)} tokens"


def _shapes(shapes: Mapping[str, int], between_agents: int) -> str:
    if not any(shapes.values()):
        return _section("shapes", "Loop shapes", _NONE)
    ranked = sorted(shapes.items(), key=lambda item: -item[1])
    bars = [_Bar(name.replace("_", " "), count, _count(count)) for name, count in ranked]
    chart = _bars_svg(
        "shapes",
        "Threads in which each loop shape was seen",
        "; ".join(f"{bar.label}: {bar.text} threads" for bar in bars),
        bars,
        ranked[0][1],
    )
    table = _table(
        "Threads by loop shape",
        ("Shape", "Threads"),
        [(f"<code>{_esc(name)}</code>", _count(count)) for name, count in ranked],
    )
    between = (
        f"<p>Threads with a loop between agents (the calls of more than one agent):"
        f" {_count(between_agents)}.</p>"
        if between_agents
        else ""
    )
    return _section("shapes", "Loop shapes", chart + between + _details(table))


def _tools(tools: Sequence[Mapping[str, Any]]) -> str:
    if not tools:
        return _section("tools", "Top looping tools", _NONE)
    bars = [_Bar(tool["tool"], tool["threads"], _count(tool["threads"])) for tool in tools]
    chart = _bars_svg(
        "tools",
        "Threads in which each tool looped",
        "; ".join(f"{bar.label}: {bar.text} threads" for bar in bars),
        bars,
        max(bar.value for bar in bars),
    )
    table = _table(
        "Looping tools: the threads they looped in, and the guard's steers, blocks and stops",
        ("Tool", "Threads", "Steers", "Blocks", "Stops"),
        [
            (
                f"<code>{_esc(tool['tool'])}</code>",
                *(_count(tool[key]) for key in ("threads", "steers", "blocks", "stops")),
            )
            for tool in tools
        ],
    )
    return _section("tools", "Top looping tools", chart + table)


def _cost(cost: Mapping[str, int | None]) -> str:
    if not any(cost[key] or cost[f"{key}_saved"] for key, _ in _COSTS):
        return _section("cost", "What loops cost", _NONE)
    pairs = [
        _Pair(name, (spent, saved), (_compact(spent), _compact(saved)))
        for key, name in _COSTS
        if (spent := cost[key]) is not None and (saved := cost[f"{key}_saved"]) is not None
    ]
    chart = _pairs_svg(
        "cost",
        "Spent in loops, and saved by stopping them",
        "; ".join(f"{pair.label}: {pair.texts[0]} spent, {pair.texts[1]} saved" for pair in pairs),
        pairs,
        ("spent", "saved"),
        ("spent", "saved"),
    )
    table = _table(
        "Spent in loops, and saved by stopping them",
        ("Measure", "Spent in loops", "Saved"),
        [(name, _amount(cost[key]), _amount(cost[f"{key}_saved"])) for key, name in _COSTS],
    )
    unknown = "" if len(pairs) == len(_COSTS) else f" Tokens: {_NOT_REPORTED}."
    lead = f'<p class="lead">Each measure is drawn to its own scale.{unknown}</p>'
    return _section("cost", "What loops cost", lead + chart + _details(table))


def _loop_lengths(lengths: Sequence[Mapping[str, Any]]) -> str:
    if not any(bucket["threads"] for bucket in lengths):
        return _section("loop-length", "Loop length", _NONE)
    bars = [
        _Bar(bucket["length"], bucket["threads"], _count(bucket["threads"])) for bucket in lengths
    ]
    chart = _columns_svg(
        "loop-length",
        "Looping threads by the model calls they spent in loops",
        "; ".join(f"{bar.label} model calls: {bar.text} threads" for bar in bars),
        bars,
        "model calls spent in loops",
    )
    table = _table(
        "Looping threads by the model calls they spent in loops",
        ("Model calls in loops", "Threads"),
        [(_esc(bar.label), bar.text) for bar in bars],
    )
    return _section("loop-length", "Loop length", chart + _details(table))


def _worst(worst: Sequence[Mapping[str, Any]], anchors: Sequence[str]) -> str:
    if not worst:
        return _section("worst", "Worst threads", _NONE)
    longest = max(entry["calls"] for entry in worst)
    legend = "".join(
        f'<li><svg width="14" height="14" viewBox="0 0 14 14" aria-hidden="true">{shape}</svg>'
        f"{name}</li>"
        for shape, name in (
            ('<path class="ticks" d="M7 1v12"/>', "tool call"),
            (_marker("steer", 7, 7), "steer"),
            (_marker("block", 7, 7), "block"),
            (_marker("stop", 7, 7), "stop"),
        )
    )
    rows = "".join(
        _thread_row(entry, anchor, longest) for entry, anchor in zip(worst, anchors, strict=True)
    )
    lead = (
        '<p class="lead">One strip per thread, a tick per tool call, all to one scale;'
        " the guard's events are marked at the calls they came at.</p>"
    )
    legend = f'<ul class="legend" aria-label="Legend">{legend}</ul>'
    return _section("worst", "Worst threads", f'{lead}{legend}<ol class="threads">{rows}</ol>')


def _thread_row(entry: Mapping[str, Any], anchor: str, longest: int) -> str:
    """One worst thread: its id, what it spent, and its tool calls drawn as a strip."""
    thread: str = entry["thread"]
    calls: int = entry["calls"]
    events: Sequence[Mapping[str, Any]] = entry["events"]
    step = (_STRIP - 24) / max(longest, 1)

    def x(call: int) -> float:
        return 12 + (call - 0.5) * step

    runs: Sequence[Mapping[str, Any]] = entry["agents"]
    tones = _agent_tones(runs)
    tone_of = dict.fromkeys(range(1, calls + 1), "ticks")  # a call no agent named: plain
    for run in runs:
        tone_of.update(
            dict.fromkeys(range(run["first"], run["last"] + 1), f"ticks {tones[run['agent']]}")
        )
    paths: dict[str, str] = {}
    for call, tone in tone_of.items():
        paths[tone] = paths.get(tone, "") + f"M{x(call):.1f} 22v12"
    ticks = "".join(f'<path class="{tone}" d="{d}"/>' for tone, d in paths.items())
    drawn = sorted(
        (event for event in events if event["kind"] in _SEVERITY),
        key=lambda event: _SEVERITY[event["kind"]],
    )
    markers = "".join(
        f"<g><title>{_esc(_event_text(event))}</title>"
        f"{_marker(event['kind'], x(event['call']), 11)}</g>"
        for event in drawn
    )
    end = x(calls) if calls else 12.0
    anchor_of_end = "end" if end > 60 else "start"  # the last call's number stays inside
    axis = (
        f'<path class="axis-line" d="M12 34.5H{end + 1:.1f}"/>'
        f'<text class="axis" x="12" y="56">1</text>'
        f'<text class="axis" x="{end:.1f}" y="56" text-anchor="{anchor_of_end}">'
        f"{_count(calls)}</text>"
        if calls
        else ""
    )
    summary = "; ".join(_event_text(event) for event in events) or "no guard events"
    strip = _svg(
        "timeline",
        f"timeline-{anchor}",
        f"Tool calls of thread {thread}",
        f"{_count(calls)} tool calls. {summary}.{_calls_by_agent(runs)}",
        (_STRIP, 62),
        f"{ticks}{axis}{markers}",
        wide=True,
    )
    meta = (
        f"{_count(calls)} tool calls · spent {_count(entry['model_calls'])} model calls,"
        f" {_tokens(entry['tokens'], _count)}"
    )
    by_agent = any(event["agent"] is not None for event in events)
    table = _table(
        f"Guard events of thread <code>{_esc(thread)}</code>",
        ("Call", "Event", "Tool", "Reason", *(("Agent",) if by_agent else ())),
        [
            (
                _count(event["call"]),
                _esc(event["kind"]),
                f"<code>{_esc(event['tool'])}</code>",
                _esc(event["reason"] or "—"),
                *((_esc(event["agent"] or "—"),) if by_agent else ()),
            )
            for event in events
        ],
        numeric=(0,),
    )
    listed = _details(table, f"{len(events)} guard events") if events else ""
    agents = "".join(
        f'<li><svg width="14" height="14" viewBox="0 0 14 14" aria-hidden="true">'
        f'<rect class="swatch {tone}" x="1" y="1" width="12" height="12" rx="2"/></svg>'
        f"<code>{_esc(agent)}</code></li>"
        for agent, tone in tones.items()
    )
    if agents:
        agents = f'<ul class="legend" aria-label="Calls by agent">{agents}</ul>'
    return (
        f'<li id="{anchor}"><h3><code>{_esc(thread)}</code></h3><p class="meta">{meta}</p>'
        f"{agents}{strip}{listed}</li>"
    )


def _agent_tones(runs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The tone of each agent of a timeline (its CSS class), in the order they first called.

    Examples:
        >>> _agent_tones([{"agent": "alice"}, {"agent": "bob"}, {"agent": "alice"}])
        {'alice': 'agent-0', 'bob': 'agent-1'}
    """
    tones: dict[str, str] = {}
    for run in runs:
        tones.setdefault(run["agent"], f"agent-{len(tones) % _AGENT_TONES}")
    return tones


def _calls_by_agent(runs: Sequence[Mapping[str, Any]]) -> str:
    """Which calls each agent made, in words (the timeline's tones, for those who cannot
    see them); empty when no agent is named.

    Examples:
        >>> runs = [{"agent": "a", "first": 1, "last": 2}, {"agent": "b", "first": 3, "last": 3}]
        >>> _calls_by_agent(runs)
        ' Calls by agent: a 1-2; b 3.'
    """
    spans: dict[str, list[str]] = {}
    for run in runs:
        first, last = run["first"], run["last"]
        spans.setdefault(run["agent"], []).append(
            str(first) if first == last else f"{first}-{last}"
        )
    if not spans:
        return ""
    return " Calls by agent: " + "; ".join(f"{a} {', '.join(s)}" for a, s in spans.items()) + "."


def _compare(report: Mapping[str, Any], links: Mapping[str, str]) -> str:
    compare: Mapping[str, Any] = report["compare"]
    labels: tuple[str, str] = (report["label"], compare["label"])
    before, after = _esc(labels[0]), _esc(labels[1])
    wholes = (report["threads"], compare["threads"])
    outcomes = (report["outcomes"], compare["outcomes"])
    costs = (report["cost"], compare["cost"])
    spent = [(f"{name} spent in loops", key) for key, name in _COSTS]
    saved = [(f"{name} saved", f"{key}_saved") for key, name in _COSTS]
    if costs[0]["chars_kept_out"] or costs[1]["chars_kept_out"]:
        saved += [
            (f"{name} <code>compact_repeats</code> would keep out", f"{key}_kept_out")
            for key, name in (("chars", "characters"), ("tokens", "tokens"))
        ]
    pairs = [
        _Pair(
            _compared(outcome),
            (_share(outcomes[0][outcome], wholes[0]), _share(outcomes[1][outcome], wholes[1])),
            (_percent(outcomes[0][outcome], wholes[0]), _percent(outcomes[1][outcome], wholes[1])),
            whole=1.0,
        )
        for outcome in _OUTCOMES
    ]
    pairs += [
        _Pair(measure, (first, second), (_compact(first), _compact(second)))
        for measure, key in spent  # the table holds what was saved, too
        if (first := costs[0][key]) is not None and (second := costs[1][key]) is not None
    ]
    chart = _pairs_svg(
        "compare",
        f"{labels[0]} compared with {labels[1]}",
        "; ".join(
            f"{pair.label}: {pair.texts[0]} with {labels[0]}, {pair.texts[1]} with {labels[1]}"
            for pair in pairs
        ),
        pairs,
        ("before", "after"),
        ("plain", "other"),
    )
    legend = "".join(
        f'<li><svg width="14" height="14" viewBox="0 0 14 14" aria-hidden="true">'
        f'<rect class="{tone}" x="1" y="1" width="12" height="12" rx="2"/></svg>'
        f"{series}: <code>{name}</code></li>"
        for tone, series, name in (("plain", "before", before), ("other", "after", after))
    )
    shares = [
        (
            _compared(outcome),
            *(
                f"{_percent(counts[outcome], whole)} ({_count(counts[outcome])})"
                for counts, whole in zip(outcomes, wholes, strict=True)
            ),
        )
        for outcome in _OUTCOMES
    ]
    side_by_side = _table(
        f"Before, <code>{before}</code>, and after, <code>{after}</code>, side by side",
        ("Measure", "Before", "After"),
        [("threads scanned", _count(wholes[0]), _count(wholes[1]))]
        + shares
        + [
            (measure, _amount(costs[0][key]), _amount(costs[1][key]))
            for measure, key in spent + saved
        ],
    )
    changed: Sequence[Mapping[str, Any]] = compare["changed"]
    count: int = compare["changed_count"]
    if count:
        listed = f"; the first {_count(len(changed))} are listed" if len(changed) < count else ""
        changes = f"<p>{_count(count)} threads changed outcome{listed}.</p>"
    else:
        changes = _NONE
    if changed:
        changes += _table(
            f"Threads whose outcome changed from <code>{before}</code> to <code>{after}</code>",
            ("Thread", "Before", "After", "Model calls before", "Model calls after"),
            [
                (
                    _thread_cell(entry["thread"], links),
                    _outcome(entry["before"]),
                    _outcome(entry["after"]),
                    _count(entry["model_calls_before"]),
                    _count(entry["model_calls_after"]),
                )
                for entry in changed
            ],
            numeric=(3, 4),
        )
    lead = (
        f'<p class="lead">Before: <code>{before}</code>, this report\'s configuration;'
        f" after: <code>{after}</code>. The shares of threads are drawn on one scale, 0 to"
        " 100%; each cost measure draws before and after on one scale.</p>"
    )
    legend = f'<ul class="legend" aria-label="Legend">{legend}</ul>'
    return _section(
        "compare",
        f"Compared with <code>{after}</code>",
        f"{lead}{legend}{chart}{side_by_side}<h3>Threads whose outcome changed</h3>{changes}",
    )


def _compared(outcome: str) -> str:
    """An outcome's row in the comparison: `steered threads`, `of which blocked`, ..."""
    return f"{outcome} threads" if outcome == "steered" else _NESTED[outcome]


def _section(key: str, heading: str, body: str) -> str:
    """A page section; `heading` and `body` are HTML."""
    return f'<section aria-labelledby="h-{key}"><h2 id="h-{key}">{heading}</h2>{body}</section>'


def _tile(tone: str, title: str, value: str, sub: str = "") -> str:
    """One figure of the headline strip, with a smaller line under it when `sub` is given."""
    below = f'<dd class="sub">{sub}</dd>' if sub else ""
    return f'<div class="{tone}"><dt>{title}</dt><dd>{value}</dd>{below}</div>'


def _table(
    caption: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    numeric: Sequence[int] | None = None,
) -> str:
    """A table whose first column heads its rows; all given as HTML. The `numeric` columns
    (all but the first unless told) are aligned right."""
    numbers = range(1, len(headers)) if numeric is None else numeric

    def cell(tag: str, scope: str, column: int, text: str) -> str:
        align = ' class="num"' if column in numbers else ""
        return (
            f'<{tag} scope="{scope}"{align}>{text}</{tag}>'
            if scope
            else f"<{tag}{align}>{text}</{tag}>"
        )

    head = "".join(cell("th", "col", column, text) for column, text in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(
            cell("th", "row", column, text) if column == 0 else cell("td", "", column, text)
            for column, text in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return (
        f'<div class="scroll"><table><caption>{caption}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _details(table: str, summary: str = "The numbers") -> str:
    return f"<details><summary>{summary}</summary>{table}</details>"


def _svg(
    chart: str,
    key: str,
    title: str,
    desc: str,
    size: tuple[int, int],
    body: str,
    *,
    wide: bool = False,
) -> str:
    """An accessible chart: `key` names its title's and description's element ids, `title`
    and `desc` are plain text, `body` is SVG."""
    width, height = size
    classes = "chart strip" if wide else "chart"
    return (
        f'<svg role="img" class="{classes}" data-chart="{chart}" viewBox="0 0 {width} {height}"'
        f' width="{width}" height="{height}" aria-labelledby="{key}-title"'
        f' aria-describedby="{key}-desc"><title id="{key}-title">{_esc(title)}</title>'
        f'<desc id="{key}-desc">{_esc(desc)}</desc>{body}</svg>'
    )


def _bars_svg(
    chart: str, title: str, desc: str, bars: Sequence[_Bar], most: float, *, track: bool = False
) -> str:
    """Horizontal bars to one scale, each under its label, where `most` fills the room; with
    `track`, each bar lies on the full room (for shares of a whole)."""
    room = _WIDTH - _VALUES
    row_height = 40  # a label's line and a bar
    rows = []
    for row, bar in enumerate(bars):
        top = row * row_height
        length = _length(bar.value, most, room)
        back = (
            f'<rect class="track" x="0" y="{top + 20}" width="{room}" height="14" rx="3"/>'
            if track
            else ""
        )
        rows.append(
            f"<g><title>{_esc(bar.label)}: {_esc(bar.text)}</title>"
            f'<text x="0" y="{top + 15}">{_esc(_clip(bar.label, _CLIP))}</text>{back}'
            f'<rect class="{bar.tone}" x="0" y="{top + 20}" width="{length:.1f}" height="14"'
            f' rx="3"/><text class="value" x="{(room if track else length) + 6:.1f}"'
            f' y="{top + 32}">{_esc(bar.text)}</text></g>'
        )
    size = (_WIDTH, len(bars) * row_height)
    return _svg(chart, f"chart-{chart}", title, desc, size, "".join(rows))


def _pairs_svg(
    chart: str,
    title: str,
    desc: str,
    pairs: Sequence[_Pair],
    series: tuple[str, str],
    tones: tuple[str, str],
) -> str:
    """Each pair under its label, as two bars coloured by `tones`, drawn to the pair's scale
    (`_Pair`), each followed by its value and its name in `series`, which are short."""
    room = _WIDTH - _PAIR_VALUES
    group = 70  # a label's line and two bars
    parts = []
    for index, pair in enumerate(pairs):
        top = index * group
        parts.append(f'<text class="heading" x="0" y="{top + 15}">{_esc(pair.label)}</text>')
        most = max(pair.values) if pair.whole is None else pair.whole
        lanes = zip(series, pair.values, pair.texts, tones, strict=True)
        for lane, (name, value, text, tone) in enumerate(lanes):
            y = top + 21 + lane * 21
            length = _length(value, most, room)
            track = (
                f'<rect class="track" x="0" y="{y}" width="{room}" height="16" rx="3"/>'
                if pair.whole is not None
                else ""
            )
            at = room if pair.whole is not None else length
            parts.append(
                f"<g><title>{_esc(pair.label)}, {_esc(name)}: {_esc(text)}</title>{track}"
                f'<rect class="{tone}" x="0" y="{y}" width="{length:.1f}" height="16" rx="3"/>'
                f'<text x="{at + 6:.1f}" y="{y + 13}">{_esc(text)} <tspan class="value">'
                f"{_esc(name)}</tspan></text></g>"
            )
    size = (_WIDTH, len(pairs) * group)
    return _svg(chart, f"chart-{chart}", title, desc, size, "".join(parts))


def _columns_svg(chart: str, title: str, desc: str, bars: Sequence[_Bar], axis: str) -> str:
    """Vertical bars side by side, a histogram of the buckets `bars` are, over an axis
    titled `axis`."""
    base = 176  # the axis line's height: room above for the bars and their values
    slot = (_WIDTH - 16) / len(bars)
    most = max(bar.value for bar in bars)
    parts = [f'<path class="axis-line" d="M8 {base + 0.5}H{_WIDTH - 8}"/>']
    for index, bar in enumerate(bars):
        middle = 8 + (index + 0.5) * slot
        height = _length(bar.value, most, base - 28)
        parts.append(
            f"<g><title>{_esc(bar.label)}: {_esc(bar.text)}</title>"
            f'<rect class="{bar.tone}" x="{middle - slot * 0.35:.1f}" y="{base - height:.1f}"'
            f' width="{slot * 0.7:.1f}" height="{height:.1f}" rx="2"/>'
            f'<text class="value" x="{middle:.1f}" y="{base - height - 6:.1f}"'
            f' text-anchor="middle">{_esc(bar.text)}</text>'
            f'<text x="{middle:.1f}" y="{base + 18}" text-anchor="middle">{_esc(bar.label)}</text>'
            "</g>"
        )
    parts.append(
        f'<text class="axis" x="{_WIDTH / 2}" y="{base + 40}" text-anchor="middle">'
        f"{_esc(axis)}</text>"
    )
    return _svg(chart, f"chart-{chart}", title, desc, (_WIDTH, base + 48), "".join(parts))


def _length(value: float, most: float, room: float) -> float:
    """How long a bar of `value` is where `most` fills `room`: never so short that a value
    above zero cannot be seen."""
    if not value or not most:
        return 0.0
    return max(room * value / most, 2.0)


def _marker(tone: str, x: float, y: float) -> str:
    """The mark of a guard event on a timeline: a circle for a steer, a triangle for a block,
    a square for a stop."""
    if tone == "steer":
        return f'<circle class="steer" cx="{x:.1f}" cy="{y}" r="5.5"/>'
    if tone == "block":
        return f'<path class="block" d="M{x:.1f} {y - 6}l6.5 11h-13z"/>'
    return f'<rect class="stop" x="{x - 5:.1f}" y="{y - 5}" width="10" height="10"/>'


def _anchors(threads: Sequence[str]) -> list[str]:
    """A distinct element id for each thread: `thread-` and its name's id-safe characters."""
    anchors: list[str] = []
    for thread in threads:
        base = "thread-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", thread).strip("-") or "unnamed")
        anchor, n = base, 1
        while anchor in anchors:
            n += 1
            anchor = f"{base}-{n}"
        anchors.append(anchor)
    return anchors


def _thread_cell(thread: str, links: Mapping[str, str]) -> str:
    """A thread's id as HTML, linked to its timeline when it has one."""
    code = f"<code>{_esc(thread)}</code>"
    return f'<a href="#{links[thread]}">{code}</a>' if thread in links else code


def _outcome(outcome: str) -> str:
    """An outcome as HTML, marked in its colour."""
    tone = _TONE_OF_OUTCOME.get(outcome, "")
    return f'<span class="outcome {tone}">{_esc(outcome)}</span>'


def _event_text(event: Mapping[str, Any]) -> str:
    """A guard event in words: its call, what the guard did, the tool and the reason."""
    detail = event["tool"] if event["reason"] is None else f"{event['tool']}, {event['reason']}"
    by = "" if event["agent"] is None else f" by {event['agent']}"
    return f"call {event['call']}: {event['kind']} ({detail}){by}"


def _esc(text: object) -> str:
    return html.escape(str(text))


def _count(n: int) -> str:
    return f"{n:,}"


def _compact(n: int) -> str:
    """`n` in a few characters: 9,999, 12.3k, 400k, 1.2M."""
    if n < 10_000:
        return f"{n:,}"
    for unit, size in (("k", 1e3), ("M", 1e6)):
        if n < size * 999.5:
            return f"{n / size:.3g}{unit}"
    return f"{n / 1e9:,.3g}G"


def _amount(n: int | None) -> str:
    """A count in a table, or that the model did not report it (tokens)."""
    return _NOT_REPORTED if n is None else _count(n)


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _percent(part: int, whole: int) -> str:
    """`part` in percent of `whole`, with one decimal; a share too small for it shows as
    `<0.1%`, not as none."""
    if not part:
        return "0%"
    share = 100 * _share(part, whole)
    return "<0.1%" if share < 0.05 else f"{share:.1f}%"


def _clip(text: str, room: int) -> str:
    """`text` cut to `room` characters, to fit a chart; the chart's table holds it whole."""
    return text if len(text) <= room else text[: room - 1] + "…"
