"""Normalizers: what makes two results of a tool the same result.

A normalizer maps a tool's result text to the text the guard compares. `normalize_fresh`
masks what is fresh on every call (message ids, timestamps; on by default, see Near-repeats);
`normalize_volatile` masks any UUID, time, nonce, duration or pid (`volatile_results=True`).
Pass your own per tool as `ToolPolicy(normalizer=...)` for anything else.

Examples:
    >>> from loop_guard.normalize import normalize_volatile
    >>> normalize_volatile("done at 2026-01-01T10:00:00Z") == normalize_volatile(
    ...     "done at 2026-01-02T11:30:00Z"
    ... )
    True
"""

from __future__ import annotations

from loop_guard._config import Normalizer
from loop_guard._volatile import normalize_fresh, normalize_volatile

__all__ = ["Normalizer", "normalize_fresh", "normalize_volatile"]
