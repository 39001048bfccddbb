"""A time window over recorded threads: which threads `--since` and `--until` keep.

A thread is in the window when the time it last changed (its latest checkpoint's `ts`) is:
from `since` on, and before `until`. Back-to-back windows (a week, then the next) share no
thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

__all__ = ["Window", "moment"]

_AGO = re.compile(r"(\d+)([wdh])")
_UNITS = {"w": "weeks", "d": "days", "h": "hours"}


def moment(text: str, now: datetime | None = None) -> datetime:
    """A time from the command line, in UTC: an ISO 8601 date or date and time (UTC when it
    names no zone), or a duration before `now` (`12h`, `7d`, `2w`); `ValueError` otherwise.

    Examples:
        >>> moment("2025-06-02").isoformat()
        '2025-06-02T00:00:00+00:00'
        >>> moment("2025-06-02T09:30+02:00").isoformat()
        '2025-06-02T07:30:00+00:00'
        >>> moment("7d", now=datetime(2025, 6, 9, tzinfo=timezone.utc)).isoformat()
        '2025-06-02T00:00:00+00:00'
    """
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago is not None and int(ago.group(1)) > 0:
        since = now or datetime.now(timezone.utc)
        return since - timedelta(**{_UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        # Python 3.10 reads no `Z`: it is UTC's `+00:00`.
        found = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text))
    except ValueError:
        msg = (
            f"not a time: {text!r} (an ISO date or date and time such as 2025-06-02 or "
            "2025-06-02T09:30+02:00, UTC without a zone; or a duration ago: 12h, 7d, 2w)"
        )
        raise ValueError(msg) from None
    if found.tzinfo is None:
        return found.replace(tzinfo=timezone.utc)
    return found.astimezone(timezone.utc)


@dataclass(frozen=True, slots=True)
class Window:
    """The threads last changed from `since` on and before `until` (`None`: no bound).

    Examples:
        >>> week = Window(moment("2025-06-02"), moment("2025-06-09"))
        >>> week.contains(moment("2025-06-02")), week.contains(moment("2025-06-09"))
        (True, False)
    """

    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            msg = (
                f"--since {self.since.isoformat()} is not before --until "
                f"{self.until.isoformat()}: no thread would be read"
            )
            raise ValueError(msg)

    def __bool__(self) -> bool:
        return self.since is not None or self.until is not None

    def contains(self, when: datetime) -> bool:
        """Whether a thread last changed at `when` is in the window."""
        return (self.since is None or when >= self.since) and (
            self.until is None or when < self.until
        )

    def to_json(self) -> dict[str, str | None]:
        """The bounds as ISO 8601 text (`None`: no bound)."""
        return {
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
        }
