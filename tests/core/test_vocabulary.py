"""One set of words for the guard's three steps: steer, block, stop.

Events, counters and the exception say them; the names earlier versions used still work
for one release, each with a `DeprecationWarning`; and nothing a user reads (the package,
its docs, the README) calls a step by a retired name.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import loop_guard
from loop_guard import Call, GuardEvent, LoopGuard, LoopGuardStop, Stop
from loop_guard.testing import GuardDriver

ROOT = Path(loop_guard.__file__).parent.parent


def stubborn_events(**settings: object) -> tuple[LoopGuard, list[GuardEvent]]:
    """A guard that saw one call repeated, with the same result, until it stopped."""
    driver = GuardDriver(LoopGuard(**settings))  # type: ignore[arg-type]
    while driver.session.stop is None:
        driver.batch([("ls", {"path": "/"}, "README.md")])
    return driver.guard, driver.events


def test_events_and_counters_say_steer_block_stop() -> None:
    guard, events = stubborn_events(warn_threshold=2, block_threshold=3, abort_threshold=2)
    assert [(event.kind, event.reason) for event in events] == [
        ("steer", "repeat"),
        ("block", "repeat"),
        ("block", "repeat"),
        ("stop", "abort_threshold"),
    ]
    stats = guard.stats
    assert (stats.steers, stats.blocks, stats.stops) == (1, 2, 1)
    assert {name: stats.by_tool["ls"][name] for name in ("steers", "blocks", "stops")} == {
        "steers": 1,
        "blocks": 2,
        "stops": 1,
    }


def test_a_batch_blocked_in_full_with_use_terminate_is_a_stop_like_any_other() -> None:
    guard, events = stubborn_events(warn_threshold=2, block_threshold=3, use_terminate=True)
    assert [(event.kind, event.reason) for event in events][-2:] == [
        ("block", "repeat"),
        ("stop", "use_terminate"),
    ]
    assert (guard.stats.blocks, guard.stats.stops) == (1, 1)


def test_the_retired_counter_names_warn_and_still_read() -> None:
    guard, _ = stubborn_events(warn_threshold=2, block_threshold=3, abort_threshold=2)
    stats = guard.stats
    with pytest.warns(DeprecationWarning, match=r"GuardStats\.warnings.*steers"):
        assert stats.warnings == 1
    with pytest.warns(DeprecationWarning, match=r"GuardStats\.aborts.*stops"):
        assert stats.aborts == 1
    with pytest.warns(DeprecationWarning, match=r"GuardStats\.terminations.*stops"):
        assert stats.terminations == 0  # counted in `stops`: the two still add up to it


def test_the_retired_exception_name_warns_and_still_catches() -> None:
    stop = Stop(call=Call.of("ls", {}), message="why", streak=4, blocks=3)
    with pytest.warns(DeprecationWarning, match="LoopGuardAbort.*LoopGuardStop"):
        from loop_guard import LoopGuardAbort
    assert LoopGuardAbort is LoopGuardStop
    with pytest.warns(DeprecationWarning, match="LoopGuardAbort"):  # every use, not the first
        retired = loop_guard.LoopGuardAbort
    with pytest.raises(retired):
        raise LoopGuardStop(stop)
    assert "LoopGuardAbort" not in loop_guard.__all__


def test_the_retired_stop_names_warn_and_still_read() -> None:
    stop = Stop(call=Call.of("ls", {}), message="why", streak=4, blocks=3, reason="use_terminate")
    with pytest.warns(DeprecationWarning, match=r"Stop\.kind.*Stop\.reason"):
        assert stop.kind == "terminate"
    with pytest.warns(DeprecationWarning, match="StopKind.*StopReason"):
        assert loop_guard.StopKind is loop_guard.StopReason


@pytest.mark.parametrize(
    ("written", "reason"), [("abort", "abort_threshold"), ("terminate", "use_terminate")]
)
def test_a_stopped_request_reads_and_writes_the_snapshot_earlier_versions_do(
    written: str, reason: str
) -> None:
    """Workers of the previous release and of this one take turns on one thread: the
    snapshot keeps the codes it always had for a stop."""
    snapshot = {"v": 1, "request_id": "r", "blocks": 1, "stopped": written, "stop_tool": "ls"}
    session = LoopGuard().session("t", snapshot)
    stop = session.stop
    assert stop is not None
    assert stop.reason == reason
    assert session.snapshot()["stopped"] == written


# What a step was called before: the old kind, quoted, and words that begin with a
# retired stem. Configuration names fixed by the spec (`warn_threshold`, `abort_threshold`,
# `use_terminate`, their variables and flags) are not step names and do not match.
RETIRED = re.compile(
    r"""["'`]warn["'`]
    | abort(?![-_]threshold)
    | (?<!use[-_])terminat
    | refus
    | \.warnings\b""",
    re.IGNORECASE | re.VERBOSE,
)
# In prose, "warn" alone is the old step too (in code it is the warn threshold's value,
# as in `LoopGuardConfig.thresholds(tool).warn`).
RETIRED_IN_PROSE = re.compile(r"(?<![\w.])warn(?![\w-])", re.IGNORECASE)
# The only places allowed to say them, each by a piece of its line: the deprecated
# aliases, the codes a snapshot keeps for a stop, and the Pi extension's own API.
ALLOWED = {
    ("loop_guard/__init__.py", '"LoopGuardAbort": "loop_guard.LoopGuardStop",'),
    ("loop_guard/_events.py", "RETIRED_KINDS: Mapping"),
    ("loop_guard/_events.py", 'GuardStats.warnings", "GuardStats.steers"'),
    ("loop_guard/_events.py", "def aborts(self)"),
    ("loop_guard/_events.py", 'GuardStats.aborts", "GuardStats.stops"'),
    ("loop_guard/_events.py", "def terminations(self)"),
    ("loop_guard/_events.py", 'GuardStats.terminations", "GuardStats.stops'),
    ("loop_guard/_values.py", "STOP_CODES: dict"),
    ("docs/how-the-guard-decides.md", "`ctx.abort()`"),
}


def retired_words() -> Counter[tuple[str, str]]:
    """Each line that says a retired word, as (path, line)."""
    paths = [
        *sorted((ROOT / "loop_guard").rglob("*.py")),
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
    ]
    found: Counter[tuple[str, str]] = Counter()
    for path in paths:
        prose = path.suffix == ".md"
        for line in path.read_text(encoding="utf-8").splitlines():
            if RETIRED.search(line) or (prose and RETIRED_IN_PROSE.search(line)):
                found[path.relative_to(ROOT).as_posix(), line.strip()] += 1
    return found


def test_the_package_and_its_docs_call_the_steps_steer_block_stop() -> None:
    found = retired_words()
    allowed = {
        (path, line)
        for path, line in found
        if any(path == where and piece in line for where, piece in ALLOWED)
    }
    assert sorted(set(found) - allowed) == []
    # Every entry of the allow-list is still needed, and allows one line.
    used = Counter(
        (where, piece) for path, line in allowed for where, piece in ALLOWED
        if path == where and piece in line
    )  # fmt: skip
    assert used == Counter(ALLOWED)


def test_the_vocabulary_patterns_tell_step_names_from_configuration_names() -> None:
    says = [
        'kind == "warn"',
        "the guard refused the call",
        "raise LoopGuardAbort(stop)",
        "stats.terminations",
        "stats.warnings",
        "(a `warn` event)",
    ]
    in_prose = ["the model (warn, block)", "must be > warn"]
    config = [
        "abort_threshold=3",
        "LOOP_GUARD_ABORT_THRESHOLD",
        "--abort-threshold N",
        "use_terminate=True",
        "--use-terminate",
        "LOOP_GUARD_USE_TERMINATE",
        "warn_threshold",
        "--warn-threshold",
        "import warnings",
        "warnings.warn(message, DeprecationWarning, stacklevel=2)",
    ]
    assert [line for line in says if not RETIRED.search(line)] == []
    assert [line for line in in_prose if not RETIRED_IN_PROSE.search(line)] == []
    assert [line for line in config if RETIRED.search(line) or RETIRED_IN_PROSE.search(line)] == []
