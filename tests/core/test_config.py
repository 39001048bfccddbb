"""Configuration invariants from the environment and from arguments.

See How the guard decides: configuration.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import warnings

import pytest

from loop_guard import LoopGuard, LoopGuardConfig, LoopGuardConfigWarning, _config


def test_defaults_match_the_pi_extension() -> None:
    """Warn 3, block 5, abort 3, nothing ignored, terminate off."""
    config = LoopGuardConfig.from_env({})
    assert config == LoopGuardConfig()
    assert (config.warn_threshold, config.block_threshold, config.abort_threshold) == (3, 5, 3)
    assert config.enabled
    assert config.ignore_tools == frozenset()
    assert not config.ignore_errors
    assert not config.use_terminate


def test_every_variable_is_read() -> None:
    """Each LOOP_GUARD_* variable lands in its field."""
    config = LoopGuardConfig.from_env(
        {
            "LOOP_GUARD_ENABLED": "yes",
            "LOOP_GUARD_WARN_THRESHOLD": "5",
            "LOOP_GUARD_BLOCK_THRESHOLD": "8",
            "LOOP_GUARD_ABORT_THRESHOLD": "2",
            "LOOP_GUARD_IGNORE_TOOLS": " todo, bash ,,",
            "LOOP_GUARD_IGNORE_ERRORS": "On",
            "LOOP_GUARD_USE_TERMINATE": "1",
        }
    )
    assert config == LoopGuardConfig(
        warn_threshold=5,
        block_threshold=8,
        abort_threshold=2,
        ignore_tools=frozenset({"todo", "bash"}),
        ignore_errors=True,
        use_terminate=True,
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True), ("TRUE", True), (" 1 ", True), ("yes", True), ("On", True),
        ("false", False), ("0", False), ("No", False), ("OFF", False),
    ],
)  # fmt: skip
def test_booleans_accept_every_documented_spelling(raw: str, expected: bool) -> None:
    """true/false, 1/0, yes/no, on/off, any case, whitespace ignored."""
    assert LoopGuardConfig.from_env({"LOOP_GUARD_IGNORE_ERRORS": raw}).ignore_errors is expected


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("LOOP_GUARD_WARN_THRESHOLD", "abc"),
        ("LOOP_GUARD_WARN_THRESHOLD", "0"),
        ("LOOP_GUARD_BLOCK_THRESHOLD", "-3"),
        ("LOOP_GUARD_ABORT_THRESHOLD", "2.5"),
        ("LOOP_GUARD_ABORT_THRESHOLD", ""),
        ("LOOP_GUARD_ENABLED", "maybe"),
        ("LOOP_GUARD_USE_TERMINATE", ""),
        ("LOOP_GUARD_BLOCK_THRESHOLD", "٣"),  # a non-ASCII digit
    ],
)
def test_an_invalid_variable_falls_back_to_its_default_and_says_so_once(
    variable: str, raw: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad environment value never raises and never switches the guard off: the setting
    keeps its default, and one warning (and one log record) per process names the variable,
    the value and what is used instead, however many guards are built."""
    monkeypatch.setattr(_config, "_said", set())
    name = variable.removeprefix("LOOP_GUARD_").lower()
    with pytest.raises(ValueError, match="is not") as reason:
        _config.parse_setting(name, raw)
    with (
        caplog.at_level(logging.WARNING, logger="loop_guard"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        configs = [LoopGuardConfig.from_env({variable: raw}) for _ in range(3)]
    assert configs[0] == LoopGuardConfig()
    assert configs[0].enabled
    said = [str(w.message) for w in caught if w.category is LoopGuardConfigWarning]
    assert said == [
        f"{variable}={raw!r} {reason.value}; "
        f"using the default {name}={getattr(LoopGuardConfig(), name)!r}"
    ]
    assert [r.getMessage() for r in caplog.records] == said


@pytest.mark.parametrize(
    ("env", "pair", "said"),
    [
        (
            {"LOOP_GUARD_WARN_THRESHOLD": "5", "LOOP_GUARD_BLOCK_THRESHOLD": "5"},
            (3, 5),
            "LOOP_GUARD_WARN_THRESHOLD='5', LOOP_GUARD_BLOCK_THRESHOLD='5': warn_threshold (5) "
            "must be less than block_threshold (5); using warn_threshold=3, block_threshold=5",
        ),
        (
            {"LOOP_GUARD_BLOCK_THRESHOLD": "2"},
            (3, 5),
            "LOOP_GUARD_BLOCK_THRESHOLD='2': warn_threshold (3) must be less than "
            "block_threshold (2); using block_threshold=5",
        ),
        (
            {"LOOP_GUARD_WARN_THRESHOLD": "9", "LOOP_GUARD_DETECT_CYCLES": "no"},
            (3, 5),
            "LOOP_GUARD_WARN_THRESHOLD='9': warn_threshold (9) must be less than "
            "block_threshold (5); using warn_threshold=3",
        ),
    ],
)
def test_warn_not_below_block_in_the_environment_falls_back_to_the_default_pair(
    env: dict[str, str], pair: tuple[int, int], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """warn >= block from the environment keeps the default pair (and every other variable),
    and says so."""
    monkeypatch.setattr(_config, "_said", set())
    with pytest.warns(LoopGuardConfigWarning) as caught:
        config = LoopGuardConfig.from_env(env)
    assert config.enabled
    assert (config.warn_threshold, config.block_threshold) == pair
    assert config.detect_cycles is (env.get("LOOP_GUARD_DETECT_CYCLES") != "no")
    assert [str(w.message) for w in caught] == [said]


def test_a_tool_policy_that_clashes_in_the_environment_is_dropped_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_config, "_said", set())
    raw = '{"poll": {"warn_threshold": 9}}'
    with pytest.warns(LoopGuardConfigWarning, match=r"^LOOP_GUARD_TOOLS=.*using tools={}$"):
        config = LoopGuardConfig.from_env(
            {"LOOP_GUARD_TOOLS": raw, "LOOP_GUARD_ABORT_THRESHOLD": "4"}
        )
    assert config.enabled
    assert dict(config.tools) == {}
    assert config.abort_threshold == 4


def test_only_enabled_false_turns_the_guard_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_config, "_said", set())
    assert not LoopGuardConfig.from_env({"LOOP_GUARD_ENABLED": "false"}).enabled
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoopGuardConfigWarning)
        for bad in ({"LOOP_GUARD_ENABLED": "fasle"}, {"LOOP_GUARD_ENABLE": "false"}):
            assert LoopGuardConfig.from_env(bad).enabled


def test_a_strict_reading_raises_on_a_bad_variable() -> None:
    """What the scan uses: it must not read with settings it was not given."""
    with pytest.raises(ValueError, match="LOOP_GUARD_WARN_THRESHOLD='abc'"):
        _config.layered_config({}, {"LOOP_GUARD_WARN_THRESHOLD": "abc"}, strict=True)
    with pytest.raises(ValueError, match="must be less than"):
        _config.layered_config({}, {"LOOP_GUARD_BLOCK_THRESHOLD": "2"}, strict=True)


def test_large_thresholds_are_accepted() -> None:
    """There is no upper bound: a huge block threshold simply never triggers."""
    config = LoopGuardConfig.from_env({"LOOP_GUARD_BLOCK_THRESHOLD": "1000000000000"})
    assert config.block_threshold == 10**12


@pytest.mark.parametrize(
    "overrides",
    [
        {"warn_threshold": 5, "block_threshold": 5},
        {"warn_threshold": 6},
        {"block_threshold": 0},
        {"abort_threshold": -1},
        {"warn_threshold": 2.0},
        {"warn_threshold": True},
        {"enabled": "yes"},
        {"ignore_tools": [1, 2]},
        {"unknown_option": 1},
    ],
)
def test_invalid_explicit_values_raise_at_once(overrides: dict[str, object]) -> None:
    """Explicit arguments are checked: a mistake raises ValueError at construction."""
    with pytest.raises(ValueError):  # noqa: PT011 - the message is checked elsewhere
        LoopGuard(**overrides)


def test_keyword_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """LoopGuard(block_threshold=8) keeps the other values from the environment."""
    monkeypatch.setenv("LOOP_GUARD_WARN_THRESHOLD", "4")
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "6")
    config = LoopGuard(block_threshold=8).config
    assert (config.warn_threshold, config.block_threshold) == (4, 8)


def test_an_override_replaces_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad variable that an explicit argument replaces does not disable the guard."""
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "lots")
    assert LoopGuard(block_threshold=8).config.block_threshold == 8
    with pytest.warns(LoopGuardConfigWarning, match="LOOP_GUARD_BLOCK_THRESHOLD='lots'"):
        config = LoopGuard(warn_threshold=2).config
    assert (config.enabled, config.warn_threshold, config.block_threshold) == (True, 2, 5)


def test_an_explicit_config_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passing a config object means exactly that config, plus overrides."""
    monkeypatch.setenv("LOOP_GUARD_ENABLED", "false")
    config = LoopGuard(LoopGuardConfig(warn_threshold=2), abort_threshold=1).config
    assert config.enabled
    assert (config.warn_threshold, config.abort_threshold) == (2, 1)


def test_ignore_tools_accepts_a_comma_separated_string() -> None:
    """The argument takes the same form as the variable, or any collection of names."""
    assert LoopGuard(ignore_tools="a, b").config.ignore_tools == {"a", "b"}
    assert LoopGuard(ignore_tools=["a"]).config.ignore_tools == {"a"}


def test_config_is_immutable() -> None:
    """LoopGuardConfig is frozen."""
    config = LoopGuardConfig()
    with pytest.raises(AttributeError):
        config.warn_threshold = 1  # type: ignore[misc]


def test_a_non_config_object_is_rejected() -> None:
    """Passing a dict where a config belongs is a clear error."""
    with pytest.raises(ValueError, match="LoopGuardConfig"):
        LoopGuard({"warn_threshold": 2})  # type: ignore[arg-type]


def test_bad_guard_arguments_raise() -> None:
    """max_conversations and on_event are validated too."""
    with pytest.raises(ValueError, match="max_conversations"):
        LoopGuard(max_conversations=0)
    with pytest.raises(ValueError, match="on_event"):
        LoopGuard(on_event="print")  # type: ignore[arg-type]


def test_a_misspelt_option_names_the_option_meant() -> None:
    """A misspelt keyword raises `ValueError` at once, naming the option it is closest to, for
    the middleware as for the guard, `replace` and `pi`, and for a tool's policy given as a
    dict; a name like no option is named alone."""
    from loop_guard import LoopGuardMiddleware

    meant = "unknown loop guard option: warn_treshold (did you mean warn_threshold?)"
    with pytest.raises(ValueError, match=re.escape(meant)):
        LoopGuardMiddleware(warn_treshold=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=re.escape(meant)):
        LoopGuardConfig.pi(warn_treshold=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=re.escape(meant)):
        LoopGuardConfig(warn_treshold=2)  # type: ignore[call-arg]
    both = "unknown loop guard options: abort_treshold (did you mean abort_threshold?), colour"
    with pytest.raises(ValueError, match=re.escape(both)):
        LoopGuard(colour="red", abort_treshold=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=re.escape("option: blok_threshold (did you mean")):
        LoopGuardConfig().replace(blok_threshold=4)  # type: ignore[call-arg]
    policy = "unknown tool policy option for 'poll': block_treshold (did you mean block_threshold?)"
    with pytest.raises(ValueError, match=re.escape(policy)):
        LoopGuard(tools={"poll": {"block_treshold": 20}})


def test_every_setting_is_a_typed_keyword() -> None:
    """`LoopGuardOptions` holds every `LoopGuardConfig` field and nothing else, each one
    optional, and it types the keywords of `LoopGuard` and `LoopGuardMiddleware`, so an
    editor completes them and a type checker checks them."""
    from loop_guard import LoopGuardMiddleware, LoopGuardOptions

    fields = {field.name for field in dataclasses.fields(LoopGuardConfig)}
    assert LoopGuardOptions.__optional_keys__ == fields
    assert not LoopGuardOptions.__required_keys__
    for face in (LoopGuard, LoopGuardMiddleware):
        options = inspect.signature(face).parameters["options"]
        assert options.kind is inspect.Parameter.VAR_KEYWORD
        assert options.annotation == "Unpack[LoopGuardOptions]"


def test_a_misspelt_variable_is_named_once_with_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A misspelt variable (`LOOP_GUARD_WARN_TRESHOLD`) is never ignored without a word:
    one warning per process names it and the setting meant, however many guards are
    built. A variable like no setting (a project's own `LOOP_GUARD_EXAMPLE_MODEL`) is left
    alone."""
    from loop_guard import LoopGuardMiddleware

    monkeypatch.setattr(_config, "_said", set())
    monkeypatch.setenv("LOOP_GUARD_WARN_TRESHOLD", "2")
    monkeypatch.setenv("LOOP_GUARD_EXAMPLE_MODEL", "gpt")
    monkeypatch.setenv("LOOP_GUARD_BLOCK_THRESHOLD", "6")
    with (
        caplog.at_level(logging.WARNING, logger="loop_guard"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        for _ in range(3):
            middleware = LoopGuardMiddleware()
        LoopGuardConfig.from_env()
    assert middleware.guard.config.warn_threshold == 3  # still ignored, as documented
    assert middleware.guard.config.block_threshold == 6
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [
        "LOOP_GUARD_WARN_TRESHOLD is not a loop guard setting and is ignored; "
        "did you mean LOOP_GUARD_WARN_THRESHOLD?"
    ]
    assert logged == said
    assert [str(w.message) for w in caught] == said
    assert caught[0].filename == __file__  # it points at the line that built the guard
