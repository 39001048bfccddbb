"""A detector is one record in `_detectors.DETECTORS`, and three places besides: its steer's
text in `_messages`, its setting in `LoopGuardConfig` and its row in docs/detectors.md. The
engine's checks, the report's shapes and the Pi preset are read off the table; these tests
name every reason that misses one of the places."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import get_args

from loop_guard import LoopGuardConfig, _messages
from loop_guard._config import LoopGuardOptions
from loop_guard._detectors import BLOCKS, DETECTORS, STEERS, Detector
from loop_guard._values import Reason

DOCS = Path(__file__).resolve().parents[2] / "docs" / "detectors.md"
WITHOUT_SETTING = {"judge"}  # an option of the middleware, off unless given
ROW = re.compile(r"^\| `(\w+)` \|(.*)\|(.*)\|$", re.MULTILINE)


def test_every_reason_is_a_detector_with_its_text_setting_and_docs() -> None:
    """Each `Reason` has its record, `_messages.<reason>_steer_text`, a setting that is a
    `LoopGuardConfig` bool on by default (but for the judge), and a row of the reasons'
    table in docs/detectors.md that names how to turn it off."""
    table = {detector.reason: detector for detector in DETECTORS}
    documented = {reason: off for reason, _, off in ROW.findall(DOCS.read_text())}
    missing = [
        f"{reason}: {gap}"
        for reason in get_args(Reason)
        for gap in _gaps(reason, table.get(reason), documented.get(reason))
    ]
    assert not missing, "\n".join(missing)


def test_the_table_and_the_docs_hold_only_reasons() -> None:
    """No record or documented row is left of a reason that is gone, and none is twice."""
    reasons = [detector.reason for detector in DETECTORS]
    documented = [reason for reason, _, _ in ROW.findall(DOCS.read_text())]
    for name, found in (("_detectors.DETECTORS", reasons), ("docs/detectors.md", documented)):
        stale = sorted(set(found) - set(get_args(Reason)))
        twice = sorted({reason for reason in found if found.count(reason) > 1})
        assert not stale, f"{name} names reasons that are none: {stale}"
        assert not twice, f"{name} names reasons twice: {twice}"


def test_the_checks_and_the_pi_preset_are_read_off_the_table() -> None:
    """The checks in the order they are tried, which decides the reason a loop is given (the
    backstop last, as it blocks what any check steered); the Pi preset turns off every
    detector's setting."""
    assert [check.__name__ for check in STEERS] == ["streak", "returned", "cycle", "interleaved"]
    assert [check.__name__ for check in BLOCKS] == ["streak_block", "cycle_block", "backstop"]
    settings = {detector.beyond_pi for detector in DETECTORS} - {""}
    assert LoopGuardConfig.pi() == LoopGuardConfig(**dict.fromkeys(settings, False))


def _gaps(reason: str, detector: Detector | None, documented: str | None) -> list[str]:
    """What a reason lacks, given its record and its row's last column in the docs."""
    gaps = []
    if detector is None:
        gaps.append("no record in _detectors.DETECTORS")
    if not callable(getattr(_messages, f"{reason}_steer_text", None)):
        gaps.append(f"no steer text: _messages.{reason}_steer_text")
    setting = "" if detector is None else detector.beyond_pi
    if detector is not None and reason not in WITHOUT_SETTING:
        fields = {field.name: field.default for field in dataclasses.fields(LoopGuardConfig)}
        if fields.get(setting) is not True:
            gaps.append(f"its setting {setting!r} is no LoopGuardConfig field on by default")
        elif setting not in LoopGuardOptions.__annotations__:
            gaps.append(f"its setting {setting!r} is not among the LoopGuardOptions")
    if documented is None:
        gaps.append("no row in the table of reasons of docs/detectors.md")
    elif setting and f"`{setting}=False`" not in documented:
        gaps.append(f"its row in docs/detectors.md does not name `{setting}=False`")
    return gaps
