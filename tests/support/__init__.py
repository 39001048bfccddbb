"""What the test packages share: scripted agents and their drivers, worker processes run
by path, fixtures, the repository's root, and what the quick suite samples."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repository: README.md, examples/, ...
FIXTURES = Path(__file__).resolve().parent / "fixtures"

QUICK = False
"""Whether this run leaves `slow` out (`-m "not slow"`); tests/conftest.py sets it before
any test module is imported."""


def examples(full: int) -> int:
    """How many examples a property test draws: `full` in the whole suite, a tenth (at least
    10) in the quick one, which samples what the whole suite searches."""
    return max(10, full // 10) if QUICK else full


def slow_except(cases: Iterable[Any], quick: Callable[[Any], bool]) -> list[Any]:
    """`cases` for `parametrize`, those `quick` does not pick marked `slow`: the quick suite
    runs a sample, the whole suite every case. A tuple is one case of several arguments."""
    return [
        case
        if quick(case)
        else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
        for case in cases
    ]
