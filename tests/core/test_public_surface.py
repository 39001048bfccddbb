"""The package's public surface: small, every name documented, moved names still usable."""

from __future__ import annotations

import importlib
import inspect

import pytest

import loop_guard
from loop_guard import LoopGuard

MOVED = [
    ("BLOCK_MARK", "loop_guard.marks"),
    ("DUPLICATE_MARK", "loop_guard.marks"),
    ("FINAL_ANSWER_MARK", "loop_guard.marks"),
    ("STEER_MARK", "loop_guard.marks"),
    ("GUARD_NAME", "loop_guard.marks"),
    ("JUDGE", "loop_guard.marks"),
    ("REPLY", "loop_guard.marks"),
    ("Normalizer", "loop_guard.normalize"),
    ("normalize_fresh", "loop_guard.normalize"),
    ("normalize_volatile", "loop_guard.normalize"),
    ("Repetition", "loop_guard.repeated_text"),
    ("find_repetition", "loop_guard.repeated_text"),
    ("upgrade_thread", "loop_guard.upgrades"),
    ("aupgrade_thread", "loop_guard.upgrades"),
]


def test_the_top_level_names_at_most_thirty_each_documented() -> None:
    assert len(loop_guard.__all__) <= 30
    assert len(set(loop_guard.__all__)) == len(loop_guard.__all__)
    for name in loop_guard.__all__:
        value = getattr(loop_guard, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), name


@pytest.mark.parametrize(("name", "home"), MOVED)
def test_a_moved_name_warns_names_its_home_and_is_the_same_object(name: str, home: str) -> None:
    assert name not in loop_guard.__all__
    module = importlib.import_module(home)
    assert name in module.__all__
    with pytest.warns(DeprecationWarning, match=rf"loop_guard\.{name} is deprecated: use {home}"):
        value = getattr(loop_guard, name)
    assert value is getattr(module, name)


def test_a_public_module_exports_only_what_it_defines_or_reexports() -> None:
    for home in sorted({home for _, home in MOVED}):
        module = importlib.import_module(home)
        assert inspect.getdoc(module), home
        for name in module.__all__:
            assert hasattr(module, name), (home, name)


def test_the_engine_is_private_and_the_old_attribute_warns() -> None:
    guard = LoopGuard()
    with pytest.warns(DeprecationWarning, match="LoopGuard.engine is private"):
        engine = guard.engine
    assert engine.config is guard.config
