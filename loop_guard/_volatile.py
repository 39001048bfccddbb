"""Volatile result fields: what changes between two runs of a call that made no progress."""

from __future__ import annotations

import re

# Order matters: a timestamp or a UUID is replaced before its digits could look like
# a duration or a nonce.
_PATTERNS = (
    (re.compile(r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"), "<uuid>"),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?\b"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}\b"), "<hex>"),
    (
        re.compile(
            r"(?i)\b((?:duration|elapsed|latency|took|time)\w*[\"']?\s*[:=]\s*)\d+(?:\.\d+)?"
        ),
        r"\1<duration>",
    ),
    (
        re.compile(r"(?i)\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|sec|secs|seconds|min|minutes)\b"),
        "<duration>",
    ),
    (re.compile(r"(?i)\b(pid[\"']?\s*[:=]?\s*)\d+"), r"\1<pid>"),
)


def normalize_volatile(text: str) -> str:
    """Replace UUIDs, ISO timestamps, clock times, long hex nonces, durations and pids.

    Two results that differ only in these count as the same result, so a call that
    keeps returning "done in 12 ms (pid 4711)" with fresh numbers is seen as making
    no progress. Opt-in (`volatile_results`, or `ToolPolicy(volatile=True)`): for most
    tools a changed number is real progress. Every duration goes, a countdown's too
    ("ETA 90s", "ETA 60s" are the same): do not turn it on for a tool whose progress
    is a shrinking time; pass your own `normalizer` instead.

    Example:
        >>> normalize_volatile("job 3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d9e0f took 12 ms, pid 4711")
        'job <uuid> took <duration>, pid <pid>'
        >>> normalize_volatile("at 2026-11-30T01:27:13Z, nonce=9f86d081884c7d65")
        'at <time>, nonce=<hex>'
    """
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
