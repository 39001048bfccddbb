"""Suite-wide settings: the `slow` marker for what needs subprocesses, servers or many runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

import tests.support

# Whole groups that start processes, servers or fresh environments: `-m "not slow"` leaves
# them out (the quick subset named in README.md).
_SLOW_GROUPS = ("deploy", "packaging")
_HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    tests.support.QUICK = "not slow" in (config.getoption("markexpr") or "")
    if tests.support.QUICK:  # property tests without a count of their own sample too
        settings.register_profile("quick", max_examples=tests.support.examples(100))
        settings.load_profile("quick")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(_HERE) and path.relative_to(_HERE).parts[0] in _SLOW_GROUPS:
            item.add_marker(pytest.mark.slow)
