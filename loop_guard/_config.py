"""Configuration: thresholds and ignore rules, from arguments or `LOOP_GUARD_*` variables."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, final

from typing_extensions import TypedDict, Unpack

from loop_guard._repeated_text import DEFAULT_MIN_CHARS
from loop_guard._volatile import normalize_fresh, normalize_made, normalize_volatile

logger = logging.getLogger("loop_guard")

ENV_PREFIX = "LOOP_GUARD_"

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class LoopGuardConfigWarning(UserWarning):
    """A `LOOP_GUARD_*` variable the guard could not use as given, and what it uses instead.

    A bad value never switches the guard off: the setting falls back to its default, and this
    warning says so once per process, visible with no logging set up and pointing at the line
    that built the guard; a `loop_guard` log record says it too. Make it an error where a typo
    must fail a deployment: `warnings.simplefilter("error", LoopGuardConfigWarning)`.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     config = LoopGuardConfig.from_env({"LOOP_GUARD_WARN_THRESHOLD": "three"})
        >>> config.enabled, config.warn_threshold
        (True, 3)
        >>> print(caught[0].message)
        LOOP_GUARD_WARN_THRESHOLD='three' is not an integer >= 1; using the default warn_threshold=3
    """


Normalizer = Callable[[str], str]
"""Rewrites a result's text before it is fingerprinted (see `ToolPolicy.normalizer`)."""


class Thresholds(NamedTuple):
    """The streak (or cycle laps) that steers, and the identical call that is blocked."""

    warn: int
    block: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPolicy:
    """Settings for one tool that differ from the guard's (`LoopGuardConfig.tools`).

    Unset fields (`None`) fall back to the guard's own setting.

    Attributes:
        warn_threshold: Streak (or cycle laps) that steers, for this tool.
        block_threshold: The Nth identical call of this tool is blocked.
        ignore: Never count or block this tool (like `ignore_tools`).
        ignore_errors: Error results of this tool are not counted.
        volatile: Results differing only in ids, timestamps, durations, pids or
            nonces count as unchanged (see `normalize_volatile`).
        normalizer: Your own rewrite of the result text before it is compared, e.g.
            to drop a field that changes on every call; applied after `volatile`.
        detect_same_error: Whether identical errors for different args mean this tool
            is broken (`LoopGuardConfig.detect_same_error`); turn it off for a tool
            whose failures say nothing about their input.
        fresh: Whether results differing only in what is fresh on every call are
            near-repeats (`LoopGuardConfig.fresh_results`).
        changes_state: Whether a successful call of this tool changes something (an
            edit, a write, a send), so that a check repeated after it asks a new
            question (see `changes_state`). Unset: the tool's MCP annotations, else
            its name.
        shell: Whether this tool runs commands whose errors are exit statuses: a
            sweep of different commands failing alike is steered once, never blocked
            (see `is_shell`). Unset: its name.

    Examples:
        >>> config = LoopGuardConfig(tools={"poll_job": ToolPolicy(block_threshold=30)})
        >>> tuple(config.thresholds("poll_job")), tuple(config.thresholds("read"))
        ((3, 30), (3, 5))
    """

    warn_threshold: int | None = None
    block_threshold: int | None = None
    ignore: bool | None = None
    ignore_errors: bool | None = None
    volatile: bool | None = None
    normalizer: Normalizer | None = field(default=None, compare=False)
    detect_same_error: bool | None = None
    fresh: bool | None = None
    changes_state: bool | None = None
    shell: bool | None = None

    def __post_init__(self) -> None:
        for name in _POLICY_BOOLEANS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                msg = f"{name} must be a bool, got {value!r}"
                raise ValueError(msg)
        for name in ("warn_threshold", "block_threshold"):
            value = getattr(self, name)
            if value is not None:
                _check_threshold(name, value)
        normalizer: object = self.normalizer  # checked at run time: callers may be untyped
        if normalizer is not None and not callable(normalizer):
            msg = f"normalizer must be callable, got {normalizer!r}"
            raise ValueError(msg)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LoopGuardConfig:
    """Immutable settings of a loop guard, validated on construction.

    See How the guard decides: configuration.

    Attributes:
        enabled: Master switch. A disabled guard never steers, blocks or stops.
        warn_threshold: The streak of identical steps that steers.
        block_threshold: The Nth identical call is blocked; must be greater than
            `warn_threshold`.
        abort_threshold: Blocks within one request before the stop.
        ignore_tools: Tool names the guard never counts or blocks.
        ignore_errors: When true, error results are invisible: they neither count nor
            reset a streak.
        use_terminate: When true, a batch whose every call was blocked also stops the
            request.
        detect_cycles: Catch a sequence of 2..`max_cycle_period` steps repeated with
            identical calls and results (`read(A) -> bash(cmd) -> read(A) -> ...`):
            laps count like a streak (steer at `warn_threshold` laps, block the call
            that would continue the cycle from `block_threshold - 1` laps).
        max_cycle_period: The longest cycle looked for, in steps (>= 2).
        detect_interleaved: Steer when the same call returns the same result again
            while other calls come between (`A, X, A, Y, A`): `warn_threshold`
            occurrences within the last `repeat_window` counted steps of the
            conversation. A model that ignores the steer meets its backstop.
        repeat_window: How many recent counted steps `detect_interleaved` looks at.
        escalate_ignored: A steer is never the last word. When the model returns to
            a call it was steered away from, its streak resumes where it was instead
            of restarting: it is steered once more, and the next identical call is
            blocked. However far apart the returns are, the backstop holds: the
            `backstop_threshold`-th identical call of the request is blocked.
        backstop_threshold: Within one request, once the model was steered away
            from a call, the Nth identical call (same args, the same result every
            time), however many other calls came between, is blocked, and so is every
            later one; the blocks count toward the stop. Never below the tool's
            `block_threshold`. Needs `escalate_ignored`.
            The default 10 bounds a failing read between diagnostics at 9 runs,
            while a test re-run between real edits stays unblocked for 8 rounds.
        detect_unknown_tools: Calls to a tool that does not exist count as the same
            call whatever their args; the steer lists the tools that do exist.
        detect_same_error: A tool whose last `same_error_threshold` calls all
            returned the identical error, for at least three different argument sets,
            is failing whatever its input: the model is steered, and from then on the tool's
            calls count as one call whatever their args (a streak already at
            `warn_threshold`), so the next-but-one is blocked and the request
            stopped like any streak; calls made between other calls meet the
            backstop (with `escalate_ignored`). A result that is not that error makes
            the tool judged by its args again.
        same_error_threshold: Calls of one tool in a row, with the identical error
            and at least three different argument sets, that show it broken (>= 3).
            The default 4: three variants failing alike is ordinary debugging (a
            build tried three ways); a fourth is not.
        volatile_results: Treat results that differ only in ids, timestamps,
            durations, pids or nonces as unchanged, for every tool (per tool:
            `ToolPolicy(volatile=True)`).
        fresh_results: Results that differ only in what is fresh on every call
            (message, run and request ids, timestamps, durations, pids, attempt and
            session counters; `normalize_fresh`) are near-repeats: they count as the
            same result, steered and blocked `near_repeat_patience` calls later than
            exact repeats. Progress (percentages, counts, a changed status) and a
            changed identity (a conversation, file or order id) stay different.
        near_repeat_patience: How many calls later a streak of near-repeats is
            steered and blocked than one of exact repeats (>= 0).
        dedupe_siblings: Identical calls within one model response run once; the
            others receive the same result, marked as a duplicate.
        detect_repeated_text: Catch a reply that keeps repeating a chunk of its own
            text (a sentence, a line, a code block): it is cut where the repetition
            began (while it streams, the generation stops there), the model is steered,
            and further such replies in the request count as blocks toward the stop.
            Tables, lists, code with similar lines, dividers and refrains are not
            repetitions (see Repeated text).
        repeated_text_chars: How much text must repeat back to back before a reply is
            cut, in characters (>= 100; about 4 per token). A short unit said ten
            times or more needs half as much, a sentence whose counter alone changes
            twice as much; data (a unit without a letter, text in a code block) four
            times as much, but for many copies of symbols alone and for words, numbers
            and spaces running on in one line.
        tools: A `ToolPolicy` per tool name: thresholds, ignore rules, normalisers.

    Raises:
        ValueError: If a threshold is not an integer >= 1, or `warn_threshold >=
            block_threshold` (also for a tool's policy).

    Examples:
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
    detect_cycles: bool = True
    max_cycle_period: int = 6
    detect_interleaved: bool = True
    repeat_window: int = 8
    escalate_ignored: bool = True
    backstop_threshold: int = 10
    detect_unknown_tools: bool = True
    detect_same_error: bool = True
    same_error_threshold: int = 4
    volatile_results: bool = False
    fresh_results: bool = True
    near_repeat_patience: int = 2
    dedupe_siblings: bool = False
    detect_repeated_text: bool = True
    repeated_text_chars: int = DEFAULT_MIN_CHARS
    tools: Mapping[str, ToolPolicy] = field(default_factory=dict, hash=False)

    def __new__(cls, *args: Any, **options: Any) -> LoopGuardConfig:
        """Reject an unknown option by name, with the one it is closest to, as the faces
        do (`unknown loop guard option: warn_treshold (did you mean warn_threshold?)`)."""
        if options.keys() - _FIELD_NAMES:
            _check_names(options)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        for name in _BOOLEANS:
            if not isinstance(getattr(self, name), bool):
                msg = f"{name} must be a bool, got {getattr(self, name)!r}"
                raise ValueError(msg)
        for name in ("warn_threshold", "block_threshold", "abort_threshold"):
            _check_threshold(name, getattr(self, name))
        for name in ("max_cycle_period", "repeat_window", "backstop_threshold"):
            _check_threshold(name, getattr(self, name), minimum=2)
        _check_threshold("same_error_threshold", self.same_error_threshold, minimum=3)
        _check_threshold("near_repeat_patience", self.near_repeat_patience, minimum=0)
        _check_threshold("repeated_text_chars", self.repeated_text_chars, minimum=100)
        _check_order(self.warn_threshold, self.block_threshold, "")
        object.__setattr__(self, "ignore_tools", _as_names(self.ignore_tools))
        object.__setattr__(self, "tools", MappingProxyType(_as_policies(self.tools)))
        for tool in self.tools:
            _check_order(*self.thresholds(tool), f" for tool {tool!r}")

    @classmethod
    def pi(cls, **overrides: Unpack[LoopGuardOptions]) -> LoopGuardConfig:
        """The Pi extension's behaviour exactly: every detector beyond it turned off.

        Examples:
            >>> LoopGuardConfig.pi().detect_cycles
            False
        """
        from loop_guard._detectors import PI_OFF  # read off the detectors, which read this

        settings: dict[str, Any] = {**PI_OFF, **overrides}
        return cls().replace(**settings)

    def thresholds(self, tool: str) -> Thresholds:
        """The thresholds in force for one tool.

        Examples:
            >>> LoopGuardConfig(tools={"poll": ToolPolicy(block_threshold=30)}).thresholds("poll")
            Thresholds(warn=3, block=30)
        """
        policy = self.tools.get(tool)
        if policy is None:
            return Thresholds(self.warn_threshold, self.block_threshold)
        return Thresholds(
            self.warn_threshold if policy.warn_threshold is None else policy.warn_threshold,
            self.block_threshold if policy.block_threshold is None else policy.block_threshold,
        )

    def backstop(self, tool: str) -> int:
        """The identical call of a steered call, in one request, that is blocked however
        spread out (see `backstop_threshold`).

        Examples:
            >>> LoopGuardConfig(tools={"poll": ToolPolicy(block_threshold=30)}).backstop("poll")
            30
        """
        return max(self.backstop_threshold, self.thresholds(tool).block)

    def detects_same_error(self, tool: str) -> bool:
        """Whether identical errors for different args make this tool count as broken."""
        policy = self.tools.get(tool)
        if policy is None or policy.detect_same_error is None:
            return self.detect_same_error
        return policy.detect_same_error

    def changes_state(self, tool: str, hint: bool | None = None) -> bool:
        """Whether a successful call of this tool changes something, so that a check
        repeated after it asks a new question: the tool's policy, else `hint` (what
        its MCP annotations say), else its name (`state_changing_name`).

        Examples:
            >>> config = LoopGuardConfig(tools={"deploy_check": ToolPolicy(changes_state=False)})
            >>> config.changes_state("write_file"), config.changes_state("deploy_check")
            (True, False)
            >>> config.changes_state("read_file"), config.changes_state("mcp_tool", hint=True)
            (False, True)
        """
        policy = self.tools.get(tool)
        if policy is not None and policy.changes_state is not None:
            return policy.changes_state
        return state_changing_name(tool) if hint is None else hint

    def is_shell(self, tool: str) -> bool:
        """Whether this tool runs commands, whose failures are exit statuses: its
        policy's `shell`, else its name (`bash`, `run_shell_command`, `execute`).

        Examples:
            >>> LoopGuardConfig().is_shell("bash"), LoopGuardConfig().is_shell("read_file")
            (True, False)
        """
        policy = self.tools.get(tool)
        if policy is not None and policy.shell is not None:
            return policy.shell
        return shell_name(tool)

    def ignores(self, tool: str, *, is_error: bool = False) -> bool:
        """Whether a step of this tool (with this error flag) is invisible to the guard."""
        policy = self.tools.get(tool)
        if policy is None:
            return tool in self.ignore_tools or (is_error and self.ignore_errors)
        if policy.ignore if policy.ignore is not None else tool in self.ignore_tools:
            return True
        return is_error and (
            self.ignore_errors if policy.ignore_errors is None else policy.ignore_errors
        )

    def normalizers(self, tool: str) -> tuple[Normalizer, ...]:
        """The rewrites applied to this tool's result text before it is compared."""
        policy = self.tools.get(tool)
        volatile = self.volatile_results
        if policy is not None and policy.volatile is not None:
            volatile = policy.volatile
        found: tuple[Normalizer, ...] = (normalize_volatile,) if volatile else ()
        if policy is not None and policy.normalizer is not None:
            found = (*found, policy.normalizer)
        fresh = self.fresh_results
        if policy is not None and policy.fresh is not None:
            fresh = policy.fresh
        if not fresh:
            return found
        # Last: what it masks marks a near-repeat (`Result.variant`).
        return (*found, normalize_made if self.changes_state(tool) else normalize_fresh)

    def replace(self, **overrides: Unpack[LoopGuardOptions]) -> LoopGuardConfig:
        """Return a copy with some fields replaced, validated like the constructor.

        Examples:
            >>> LoopGuardConfig().replace(block_threshold=8).block_threshold
            8
        """
        _check_names(overrides)
        # Wider than the fields: `__post_init__` makes `ignore_tools` and `tools` of them.
        changes: dict[str, Any] = dict(overrides)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoopGuardConfig:
        """Read the `LOOP_GUARD_*` variables; unset ones keep their defaults.

        See How the guard decides: configuration.

        An invalid value does not raise and never switches the guard off (the Pi extension
        disables itself; a typo must not remove the cap): the setting keeps its default, and
        `warn >= block` the default pair, said by a `LoopGuardConfigWarning` naming the
        variable, the value and what is used instead. Only `LOOP_GUARD_ENABLED=false` turns
        the guard off.

        Examples:
            >>> env = {"LOOP_GUARD_BLOCK_THRESHOLD": "8", "LOOP_GUARD_IGNORE_TOOLS": "todo, bash"}
            >>> config = LoopGuardConfig.from_env(env)
            >>> config.block_threshold, sorted(config.ignore_tools)
            (8, ['bash', 'todo'])
        """
        return resolve_config(None, {}, environ)


class LoopGuardOptions(TypedDict, total=False):
    """The settings as keyword arguments: `LoopGuard(warn_threshold=2)`,
    `LoopGuardMiddleware(block_threshold=8)`, `LoopGuardConfig.replace(...)`.

    One key per `LoopGuardConfig` field, which says in full what each does; every key is
    optional. A setting not given keeps its value from the `config` passed, else from its
    `LOOP_GUARD_*` variable, else its default (in brackets below). A name that is no setting
    raises `ValueError` naming the setting it is closest to.

    Attributes:
        enabled: Master switch (`True`).
        warn_threshold: Identical steps in a row that steer the model (3).
        block_threshold: The Nth identical call is blocked; above `warn_threshold` (5).
        abort_threshold: Blocks in one request before the request stops (3).
        ignore_tools: Tool names never counted or blocked: names, or one comma-separated
            string (none).
        ignore_errors: Error results neither count nor reset a streak (`False`).
        use_terminate: A batch whose every call was blocked stops the request too (`False`).
        detect_cycles: Catch a sequence of calls repeated lap after lap (`True`).
        max_cycle_period: The longest cycle looked for, in steps (6).
        detect_interleaved: Steer a call and result that keep coming back between other
            calls (`True`).
        repeat_window: Recent counted steps that `detect_interleaved` looks at (8).
        escalate_ignored: A return to a call the model was steered away from resumes its
            streak (`True`).
        backstop_threshold: The Nth identical call of a steered call in one request is
            blocked, however spread out (10).
        detect_unknown_tools: Calls to a missing tool count as one call (`True`).
        detect_same_error: A tool failing the same way for varied args counts as one
            call (`True`).
        same_error_threshold: Calls in a row with the identical error that show a tool
            broken (4).
        volatile_results: Results differing only in ids, timestamps, durations, pids or
            nonces count as unchanged (`False`).
        fresh_results: Results differing only in what is fresh on every call are
            near-repeats (`True`).
        near_repeat_patience: How many calls later near-repeats are steered and blocked
            than exact repeats (2).
        dedupe_siblings: Identical calls in one model response run once (`False`).
        detect_repeated_text: A reply that keeps repeating its own text is cut, steered
            and stopped (`True`).
        repeated_text_chars: Characters that must repeat back to back before a reply is
            cut (1000).
        tools: A `ToolPolicy`, or its fields as a dict, per tool name (none).

    Examples:
        >>> options: LoopGuardOptions = {"warn_threshold": 2, "block_threshold": 4}
        >>> LoopGuardConfig().replace(**options).block_threshold
        4
    """

    enabled: bool
    warn_threshold: int
    block_threshold: int
    abort_threshold: int
    ignore_tools: str | Iterable[str]
    ignore_errors: bool
    use_terminate: bool
    detect_cycles: bool
    max_cycle_period: int
    detect_interleaved: bool
    repeat_window: int
    escalate_ignored: bool
    backstop_threshold: int
    detect_unknown_tools: bool
    detect_same_error: bool
    same_error_threshold: int
    volatile_results: bool
    fresh_results: bool
    near_repeat_patience: int
    dedupe_siblings: bool
    detect_repeated_text: bool
    repeated_text_chars: int
    tools: Mapping[str, ToolPolicy | Mapping[str, Any]]


_POLICY_BOOLEANS = (
    "ignore",
    "ignore_errors",
    "volatile",
    "fresh",
    "detect_same_error",
    "changes_state",
    "shell",
)
_BOOLEANS = (
    "enabled",
    "ignore_errors",
    "use_terminate",
    "detect_cycles",
    "detect_interleaved",
    "escalate_ignored",
    "detect_unknown_tools",
    "detect_same_error",
    "volatile_results",
    "fresh_results",
    "dedupe_siblings",
    "detect_repeated_text",
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Tool names say what a tool does in their words: a read verb first (`get_order`,
# `can_send_mms`) reads, a write verb anywhere (`write_file`, `send_stdin`,
# `toggle_airplane_mode`) changes state. Measured on the recorded traces; a policy or
# the tool's MCP annotations win over the name.
_READ_WORDS = _words(
    "get read list search find view show fetch query check can is has cat ls grep glob"
    " lookup look describe inspect status poll wait sleep count think verify validate"
    " diff stat head tail open browse navigate screenshot print echo"
)
_WRITE_WORDS = _words(
    "write edit create update delete remove rm send post put patch set apply insert move"
    " mv rename install commit push upload replace modify add save append toggle enable"
    " disable reset restart configure submit cancel book pay transfer change assign"
    " deploy mkdir touch exchange refund reboot grant revoke"
)
_SHELL_WORDS = _words("bash sh zsh shell terminal powershell cmd command exec execute")
_WORDS = re.compile(r"[a-z]+|[A-Z][a-z]*")


@functools.lru_cache(maxsize=256)  # read for every result; an agent has few tool names
def _name_words(tool: str) -> tuple[str, ...]:
    return tuple(word.lower() for word in _WORDS.findall(tool))


def state_changing_name(tool: str) -> bool:
    """Whether a tool's name says it changes state (see `LoopGuardConfig.changes_state`).

    Examples:
        >>> [state_changing_name(n) for n in ("str_replace", "can_send_mms", "bash")]
        [True, False, False]
    """
    words = _name_words(tool)
    return bool(words) and words[0] not in _READ_WORDS and not _WRITE_WORDS.isdisjoint(words)


def shell_name(tool: str) -> bool:
    """Whether a tool's name says it runs commands (see `LoopGuardConfig.is_shell`).

    Examples:
        >>> [shell_name(n) for n in ("run", "execute_bash", "run_speed_test")]
        [True, True, False]
    """
    return tool == "run" or not _SHELL_WORDS.isdisjoint(_name_words(tool))


def annotation_hint(metadata: object) -> bool | None:
    """Whether a tool's MCP annotations say it changes state; `None` when they are silent.

    `readOnlyHint: true` reads; `readOnlyHint: false` or `destructiveHint: true` may
    change state (MCP's defaults are silent on both, so their absence says nothing).

    Examples:
        >>> annotation_hint({"readOnlyHint": True}), annotation_hint({"destructiveHint": True})
        (False, True)
        >>> annotation_hint(None) is None
        True
    """
    if not isinstance(metadata, Mapping):
        return None
    read_only = metadata.get("readOnlyHint")
    if isinstance(read_only, bool):
        return not read_only
    return True if metadata.get("destructiveHint") is True else None


def _check_threshold(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        msg = f"{name} must be an integer >= {minimum}, got {value!r}"
        raise ValueError(msg)


def _check_order(warn: int, block: int, where: str) -> None:
    if warn >= block:
        msg = f"warn_threshold ({warn}) must be less than block_threshold ({block}){where}"
        raise ValueError(msg)


def _as_policies(value: object) -> dict[str, ToolPolicy]:
    """`tools` as given: a mapping of names to `ToolPolicy` or to its fields as a dict."""
    if not isinstance(value, Mapping):
        msg = f"tools must map tool names to ToolPolicy, got {value!r}"
        raise ValueError(msg)
    policies = {}
    for tool, policy in value.items():
        if not isinstance(tool, str):
            msg = f"tools must map tool names to ToolPolicy, got key {tool!r}"
            raise ValueError(msg)
        if isinstance(policy, Mapping):
            _check_known(
                policy, dataclasses.fields(ToolPolicy), "tool policy option", f" for {tool!r}"
            )
            policy = ToolPolicy(**policy)
        if not isinstance(policy, ToolPolicy):
            msg = f"the policy for tool {tool!r} must be a ToolPolicy, got {policy!r}"
            raise ValueError(msg)
        policies[tool] = policy
    return policies


def _read_env(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse the variables that are set: valid values and error texts, both by field."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    _warn_misspelt(environ, _PARSERS)
    for name, parse in _PARSERS.items():
        variable = ENV_PREFIX + name.upper()
        raw = environ.get(variable)
        if raw is None:
            continue
        try:
            values[name] = parse(raw)
        except ValueError as error:
            errors[name] = f"{variable}={raw!r} {error}"
    return values, errors


_said: set[str] = set()  # guards are built often: each text is said once per process


def _say(text: str) -> None:
    """Tell a user, once per process, about an environment variable the guard did not take as
    given: a warning that shows with no logging set up, pointing at the first line outside
    this package (where the guard was built), and a log record for those who collect them."""
    if text in _said:
        return
    _said.add(text)
    frame, depth = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(__package__):
        frame, depth = frame.f_back, depth + 1
    warnings.warn(text, LoopGuardConfigWarning, stacklevel=depth + 1)
    logger.warning(text)


# `LOOP_GUARD_*` variables that are no setting but that the package's own tools read: the
# command line's traceback, the example server's model, the test suite's servers and files.
_TOOL_VARIABLES = frozenset(
    (
        "DEBUG",
        "EXAMPLE_MODEL",
        "TEST_POSTGRES_URL",
        "TEST_PHOENIX_URL",
        "ARTIFACTS",
        "PG_PORT",
        "PG_DATA",
        "PG_NO_INSTALL",
        "PHOENIX_PORT",
        "PHOENIX_VENV",
        "PHOENIX_UV",
    )
)


def _warn_misspelt(environ: Mapping[str, str], names: Iterable[str]) -> None:
    """Say so when a `LOOP_GUARD_*` variable is not a setting (`LOOP_GUARD_WARN=abc`,
    `LOOP_GUARD_WARN_TRESHOLD`): it would otherwise be ignored without a word. The setting
    it is closest to is named: one it is a misspelling of, else one it begins
    (`LOOP_GUARD_BLOCK` for `LOOP_GUARD_BLOCK_THRESHOLD`)."""
    settings = [name.upper() for name in names]
    for variable in environ:
        if not variable.startswith(ENV_PREFIX):
            continue
        given = variable[len(ENV_PREFIX) :]
        if given in settings or given in _TOOL_VARIABLES:
            continue
        close = (
            difflib.get_close_matches(given, settings, n=1)
            or [setting for setting in settings if given and setting.startswith(given)][:1]
        )
        hint = f"did you mean {ENV_PREFIX}{close[0]}?" if close else "no setting is named so"
        _say(f"{variable} is not a loop guard setting and is ignored; {hint}")


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


def _parse_count(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        msg = "is not an integer >= 0"
        raise ValueError(msg)
    return int(text)


def _parse_names(raw: str) -> frozenset[str]:
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def _parse_policies(raw: str) -> dict[str, ToolPolicy]:
    """`LOOP_GUARD_TOOLS`: JSON mapping tool names to policy fields (no normalizers)."""
    try:
        data = json.loads(raw)
    except RecursionError as error:
        msg = "is nested too deeply to be a tool policy"
        raise ValueError(msg) from error
    except json.JSONDecodeError as error:
        msg = f'is not JSON ({error.msg}); expected e.g. {{"poll": {{"block_threshold": 20}}}}'
        raise ValueError(msg) from error
    if isinstance(data, Mapping) and any(
        isinstance(p, Mapping) and "normalizer" in p for p in data.values()
    ):
        msg = "cannot set a normalizer from the environment (use volatile: true)"
        raise ValueError(msg)
    return _as_policies(data)


_PARSERS: dict[str, Callable[[str], Any]] = {
    **dict.fromkeys(_BOOLEANS, _parse_bool),
    "warn_threshold": _parse_threshold,
    "block_threshold": _parse_threshold,
    "abort_threshold": _parse_threshold,
    "max_cycle_period": _parse_threshold,
    "repeat_window": _parse_threshold,
    "backstop_threshold": _parse_threshold,
    "same_error_threshold": _parse_threshold,
    "near_repeat_patience": _parse_count,
    "repeated_text_chars": _parse_threshold,
    "ignore_tools": _parse_names,
    "tools": _parse_policies,
}


def parse_setting(name: str, raw: str) -> Any:
    """A setting's value from its text, spelt as its `LOOP_GUARD_*` variable spells it;
    `ValueError` says what is wrong with the text.

    Examples:
        >>> sorted(parse_setting("ignore_tools", "todo, bash"))
        ['bash', 'todo']
        >>> parse_setting("tools", '{"poll": {"block_threshold": 20}}')["poll"].block_threshold
        20
    """
    return _PARSERS[name](raw)


def resolve_config(
    config: LoopGuardConfig | None,
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> LoopGuardConfig:
    """Combine an explicit config or the environment with keyword overrides.

    Overrides are explicit arguments, so a mistake in them raises `ValueError` at once
    (see How the guard decides: configuration); the environment alone never raises.
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
    return layered_config(overrides, os.environ if environ is None else environ)


def layered_config(
    overrides: Mapping[str, Any],
    environ: Mapping[str, str],
    *,
    base: LoopGuardConfig | None = None,
    strict: bool = False,
) -> LoopGuardConfig:
    """`overrides`, over what `base` changes from the defaults, over the `LOOP_GUARD_*`
    variables, over the defaults.

    A mistake in `overrides` or `base` raises `ValueError`. A bad variable that they do not
    replace falls back to its setting's default, and variables that clash (`warn >= block`)
    to the default pair, said by a `LoopGuardConfigWarning`; the guard is never switched off
    by a mistake. With `strict` a bad variable raises `ValueError` instead (a scan must not
    read with settings it was not given).

    Examples:
        >>> env = {"LOOP_GUARD_WARN_THRESHOLD": "2", "LOOP_GUARD_DETECT_CYCLES": "yes"}
        >>> config = layered_config({"block_threshold": 4}, env, base=LoopGuardConfig.pi())
        >>> config.warn_threshold, config.block_threshold, config.detect_cycles
        (2, 4, False)
    """
    defaults = LoopGuardConfig()
    if base is not None:  # what it leaves at the defaults, a variable may still set
        names = [f.name for f in dataclasses.fields(base)]
        changed = {n: getattr(base, n) for n in names if getattr(base, n) != getattr(defaults, n)}
        overrides = {**changed, **overrides}
    env_values, env_errors = _read_env(environ)
    # An override replaces a variable, good or bad; a bad one left keeps its default.
    env_values = {name: value for name, value in env_values.items() if name not in overrides}
    unresolved = [text for name, text in env_errors.items() if name not in overrides]
    if unresolved and strict:
        raise ValueError("; ".join(unresolved))
    for name, text in env_errors.items():
        if name not in overrides:
            _say(f"{text}; using the default {name}={_shown(getattr(defaults, name))}")
    try:
        return defaults.replace(**{**env_values, **overrides})
    except ValueError as error:
        defaults.replace(**overrides)  # wrong on their own: raise that alone
        if strict:
            raise ValueError(f"{error} (with {_variables(env_values, environ)})") from error
        # The variables clash with each other or with the arguments: the usual suspects
        # (the threshold pair, then the per-tool policies) fall back first, then every one.
        for dropped in (_THRESHOLD_PAIR, {"tools"}, _THRESHOLD_PAIR | {"tools"}, set(env_values)):
            kept = {n: v for n, v in env_values.items() if n not in dropped}
            try:
                config = defaults.replace(**{**kept, **overrides})
            except ValueError:
                continue
            gone = [name for name in env_values if name not in kept]
            used = ", ".join(f"{name}={_shown(getattr(config, name))}" for name in gone)
            _say(f"{_variables(gone, environ)}: {error}; using {used}")
            return config
        raise  # unreachable: `overrides` alone were just accepted


def _variables(names: Iterable[str], environ: Mapping[str, str]) -> str:
    """The variables behind some settings, as they were set."""
    spelt = (ENV_PREFIX + name.upper() for name in names)
    return ", ".join(f"{variable}={environ[variable]!r}" for variable in spelt)


_THRESHOLD_PAIR = frozenset({"warn_threshold", "block_threshold"})


def _shown(value: object) -> str:
    """A setting's value as a message shows it (no `mappingproxy(...)` or `frozenset(...)`)."""
    if isinstance(value, Mapping):
        return repr(dict(value))
    if isinstance(value, frozenset):
        return repr(sorted(value))
    return repr(value)


_FIELD_NAMES = frozenset(field.name for field in dataclasses.fields(LoopGuardConfig))


def _check_names(overrides: Mapping[str, Any]) -> None:
    _check_known(overrides, dataclasses.fields(LoopGuardConfig), "loop guard option")


def _check_known(
    given: Iterable[str], fields: Iterable[dataclasses.Field[Any]], noun: str, where: str = ""
) -> None:
    """Raise `ValueError` naming each of `given` that is no field, with the field it is
    closest to: `unknown loop guard option: warn_treshold (did you mean warn_threshold?)`."""
    known = [field.name for field in fields]
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    plural = "s" if len(unknown) > 1 else ""
    msg = f"unknown {noun}{plural}{where}: {', '.join(named)}"
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
