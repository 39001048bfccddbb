"""Configuration: thresholds and ignore rules, from arguments or `LOOP_GUARD_*` variables."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, final

logger = logging.getLogger("loop_guard")

ENV_PREFIX = "LOOP_GUARD_"

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LoopGuardConfig:
    """Immutable settings of a loop guard (SPEC §6), validated on construction.

    Attributes:
        enabled: Master switch. A disabled guard never steers, blocks or stops.
        warn_threshold: Streak of identical steps that triggers the steer message.
        block_threshold: The Nth identical call is blocked; must be greater than
            `warn_threshold`.
        abort_threshold: Blocks within one request before the request ends.
        ignore_tools: Tool names the guard never counts or blocks.
        ignore_errors: When true, error results are invisible: they neither count nor
            reset a streak.
        use_terminate: When true, a batch whose every call was blocked also ends the
            request.

    Raises:
        ValueError: If a threshold is not an integer >= 1, or `warn_threshold >=
            block_threshold`.

    Example:
        >>> LoopGuardConfig(warn_threshold=2, block_threshold=4).block_threshold
        4
        >>> LoopGuardConfig(warn_threshold=5, block_threshold=5)
        Traceback (most recent call last):
        ...
        ValueError: warn_threshold (5) must be less than block_threshold (5)
    """

    enabled: bool = True
    warn_threshold: int = 3
    block_threshold: int = 5
    abort_threshold: int = 3
    ignore_tools: frozenset[str] = field(default_factory=frozenset)
    ignore_errors: bool = False
    use_terminate: bool = False

    def __post_init__(self) -> None:
        for name in ("enabled", "ignore_errors", "use_terminate"):
            if not isinstance(getattr(self, name), bool):
                msg = f"{name} must be a bool, got {getattr(self, name)!r}"
                raise ValueError(msg)
        for name in ("warn_threshold", "block_threshold", "abort_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{name} must be an integer >= 1, got {value!r}"
                raise ValueError(msg)
        if self.warn_threshold >= self.block_threshold:
            msg = (
                f"warn_threshold ({self.warn_threshold}) must be less than "
                f"block_threshold ({self.block_threshold})"
            )
            raise ValueError(msg)
        object.__setattr__(self, "ignore_tools", _as_names(self.ignore_tools))

    def replace(self, **overrides: Any) -> LoopGuardConfig:
        """Return a copy with some fields replaced, validated like the constructor.

        Example:
            >>> LoopGuardConfig().replace(block_threshold=8).block_threshold
            8
        """
        _check_names(overrides)
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoopGuardConfig:
        """Read the `LOOP_GUARD_*` variables (SPEC §6); unset ones keep their defaults.

        An invalid value does not raise: like the Pi extension, the guard disables
        itself and logs one error naming the variable and the value, so the agent keeps
        running unguarded.

        Example:
            >>> env = {"LOOP_GUARD_BLOCK_THRESHOLD": "8", "LOOP_GUARD_IGNORE_TOOLS": "todo, bash"}
            >>> config = LoopGuardConfig.from_env(env)
            >>> config.block_threshold, sorted(config.ignore_tools)
            (8, ['bash', 'todo'])
        """
        return resolve_config(None, {}, environ)


def _read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse the variables that are set: valid values and error texts, both by field."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    parsers = {
        "enabled": _parse_bool,
        "ignore_errors": _parse_bool,
        "use_terminate": _parse_bool,
        "warn_threshold": _parse_threshold,
        "block_threshold": _parse_threshold,
        "abort_threshold": _parse_threshold,
        "ignore_tools": _parse_names,
    }
    for name, parse in parsers.items():
        variable = ENV_PREFIX + name.upper()
        raw = environ.get(variable)
        if raw is None:
            continue
        try:
            values[name] = parse(raw)
        except ValueError as error:
            errors[name] = f"{variable}={raw!r} {error}"
    return values, errors


def _parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    msg = "is not a boolean (use true/false, 1/0, yes/no, on/off)"
    raise ValueError(msg)


def _parse_threshold(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        msg = "is not an integer >= 1"
        raise ValueError(msg)
    return int(text)


def _parse_names(raw: str) -> frozenset[str]:
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def resolve_config(
    config: LoopGuardConfig | None,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> LoopGuardConfig:
    """Combine an explicit config or the environment with keyword overrides.

    Overrides are explicit arguments, so a mistake in them raises `ValueError` at once
    (SPEC §6); the environment alone never raises.
    """
    given: object = config  # checked at run time: callers may not be type-checked
    if given is not None and not isinstance(given, LoopGuardConfig):
        msg = f"config must be a LoopGuardConfig, got {type(given).__name__}"
        raise ValueError(msg)
    _check_names(overrides)
    if "ignore_tools" in overrides:
        overrides = {**overrides, "ignore_tools": _as_names(overrides["ignore_tools"])}
    if config is not None:
        return config.replace(**overrides)
    env_values, env_errors = _read_env(os.environ if environ is None else environ)
    # An override replaces a bad variable; any bad variable left disables the guard.
    unresolved = [text for name, text in env_errors.items() if name not in overrides]
    if unresolved:
        logger.error("loop guard disabled: %s", "; ".join(unresolved))
        return LoopGuardConfig(enabled=False)
    try:
        return LoopGuardConfig().replace(**{**env_values, **overrides})
    except ValueError as error:
        LoopGuardConfig().replace(**overrides)  # wrong arguments on their own: raise
        variables = ", ".join(f"{ENV_PREFIX}{name.upper()}={value!r}" for name, value in
                              env_values.items() if name not in overrides)  # fmt: skip
        logger.error("loop guard disabled by the environment (%s): %s", variables, error)
        return LoopGuardConfig(enabled=False)


def _check_names(overrides: Mapping[str, Any]) -> None:
    unknown = set(overrides) - {f.name for f in dataclasses.fields(LoopGuardConfig)}
    if unknown:
        msg = f"unknown loop guard option(s): {', '.join(sorted(unknown))}"
        raise ValueError(msg)


def _as_names(value: object) -> frozenset[str]:
    if isinstance(value, str):
        return _parse_names(value)
    if isinstance(value, Iterable):
        names = frozenset(value)
        if all(isinstance(name, str) for name in names):
            return names
    msg = f"ignore_tools must be a collection of tool names, got {value!r}"
    raise ValueError(msg)
