"""Repeated text in the model's own reply: a reply that repeats a passage instead of
calling tools (see docs, Repeated text).

`TextWatch` follows a reply as it streams and says when to cut it; `find_repetition` looks
at finished text.

Examples:
    >>> from loop_guard.repeated_text import find_repetition
    >>> find_repetition("All good. " * 3) is None
    True
"""

from __future__ import annotations

from loop_guard._repeated_text import Repetition, TextWatch, find_repetition

__all__ = ["Repetition", "TextWatch", "find_repetition"]
