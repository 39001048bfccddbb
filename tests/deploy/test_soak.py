"""A short soak of each face: concurrent conversations on one guard, none deviates, none leaks.

Runs `benchmarks/soak.py`'s rounds at a small size (2 rounds of 16 conversations per face,
threads and asyncio tasks at once); `python benchmarks/run.py soak` is the long soak.
"""

from __future__ import annotations

import pytest

from benchmarks import soak


@pytest.mark.parametrize("face", ["graph", "middleware"])
def test_a_short_soak_keeps_every_conversation_right(face: str) -> None:
    report = soak.soak(face, 0, tasks_per_round=8, min_rounds=2)
    assert report.rounds == 2
    assert report.conversations == 2 * (8 + soak.THREADS)
    assert report.problems == []
    assert report.errors == 0
    assert report.levelled, report.summary()
