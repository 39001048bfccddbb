"""Volatile result fields: what changes between two runs of a call that made no progress."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection

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

    Examples:
        >>> normalize_volatile("job 3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d9e0f took 12 ms, pid 4711")
        'job <uuid> took <duration>, pid <pid>'
        >>> normalize_volatile("at 2026-11-30T01:27:13Z, nonce=9f86d081884c7d65")
        'at <time>, nonce=<hex>'
    """
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# Fresh values ---------------------------------------------------------------------------
#
# `normalize_fresh` is the default-safe sibling of `normalize_volatile`: it masks only what
# is named or shaped as fresh on every call (message, run and request ids, timestamps,
# durations, pids, attempts, sessions) and keeps every other number, so polls that show
# progress, and results whose stable identity (a conversation, a file, an order) changes,
# stay different.

# JSON bigger than this is read as text: the patterns are linear, a parse and a walk cost more.
_JSON_LIMIT = 1_000_000
# Deeper documents are read as text, so a hostile nesting cannot exhaust the stack.
_DEPTH_LIMIT = 100
# JSON inside a JSON string (an MCP text part) is read as JSON this many levels down.
_EMBED_LIMIT = 3

# What names an object whose id is its identity: a changed one is progress.
_IDENTITY_NOUNS = (
    "conversation|thread|chat|channel|user|file|order|plan|document|doc|project|repo"
    "|repository|account|customer|item|product|issue|ticket|page|folder|workspace|team"
    "|org|organization|contact|room|space|note|record|job|task|member|group|branch|commit"
)


def _before(label: re.Pattern[str], match: re.Match[str]) -> bool:
    """Whether `label` ends right where `match` starts (looked for in the 40 chars before)."""
    start = match.start()
    return label.search(match.string, max(0, start - 40), start) is not None


_IDENTITY_LABEL = re.compile(
    rf"(?i)(?:{_IDENTITY_NOUNS})s?(?:[ _-]?ids?)?[\"']?\s*[:=#/]?\s*[\"']?$"
)
_FRESH_ID_LABEL = re.compile(
    r"(?i)(?:message|msg|run|request|req|event|trace|span|correlation|receipt|invocation"
    r"|execution)[ _-]?$"
)
_TIME_LABEL = re.compile(
    r"(?i)\b(?:timestamp|ts|time|date|(?:created|updated|sent|received|started|finished"
    r"|completed|ended|modified|expires)[ _-]?at)[\"']?\s*[:=]\s*[\"']?$"
)
_COUNTDOWN_LABEL = re.compile(r"(?i)\b(?:eta|remaining|left)\W{0,3}$")
_DURATION_UNIT = r"(?:ms|us|µs|ns|s|sec|secs|seconds|min|mins|minutes)"
_LABEL_END = r"\b[\"']?\s*[:=#]?\s*[\"']?"


def _uuid(match: re.Match[str]) -> str:
    return match[0] if _before(_IDENTITY_LABEL, match) else "<uuid>"


def _fresh_id(match: re.Match[str]) -> str:
    return f"{match[0][: -len(match[1])]}<id>" if _before(_FRESH_ID_LABEL, match) else match[0]


def _epoch_time(match: re.Match[str]) -> str:
    return "<time>" if _before(_TIME_LABEL, match) else match[0]


def _unit_duration(match: re.Match[str]) -> str:
    # A countdown ("ETA 90s", "30s left") is progress, not a fresh value.
    return match[0] if match[1] or _before(_COUNTDOWN_LABEL, match) else "<duration>"


# Each pattern masks a value that is fresh by shape (a uuid, a clock) or by the label before
# it, so unlabelled numbers (counts, percentages, line numbers) are never touched. Patterns
# start with a character class, and a "\w" look-behind after it stands for "\b": that keeps
# the scanner's fast skip to candidates. A label-led pattern runs only when the text holds
# one of its words, for the same reason.
_Replacement = str | Callable[[re.Match[str]], str]
_FRESH_PATTERNS: tuple[tuple[tuple[str, ...], re.Pattern[str], _Replacement], ...] = (
    (
        (),
        re.compile(r"[0-9a-fA-F](?<!\w.)[0-9a-fA-F]{7}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"),
        _uuid,
    ),
    ((), re.compile(r"(?i)id\b[\"']?\s*[:=#]?\s*[\"']?([\w.-]*\d[\w.-]*)"), _fresh_id),
    (
        (),
        re.compile(
            r"\d(?<!\w\d)(?:\d{3}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?|\d?:\d{2}:\d{2}(?:[.,]\d+)?)\b"
        ),
        "<time>",
    ),
    ((), re.compile(r"\d(?<!\w\d)\d{9}(?:\d{3}){0,3}(?:\.\d+)?\b"), _epoch_time),
    (
        ("duration", "elapsed", "latency", "took", "wall", "cpu", "taken", "execution", "response"),
        re.compile(
            r"(?i)\b((?:duration|elapsed|latency|took|wall[ _-]?time|cpu[ _-]?time"
            r"|time[ _-]?taken|execution[ _-]?time|response[ _-]?time)\w*[\"']?\s*[:=]\s*"
            rf"[\"']?)\d+(?:\.\d+)?(?:\s?{_DURATION_UNIT}\b)?"
        ),
        r"\1<duration>",
    ),
    (
        ("pid", "process"),
        re.compile(rf"(?i)(p(?<!\wp)(?:p?id|rocess[ _-]?id){_LABEL_END})\d+\b"),
        r"\1<pid>",
    ),
    (
        ("session",),
        re.compile(
            rf"(?i)(s(?<!\ws)ession(?:[ _-]?(?:id|number|no))?{_LABEL_END})([\w.-]*\d[\w.-]*)"
        ),
        r"\1<session>",
    ),
    (
        ("attempt", "retr", "execution"),
        re.compile(
            r"(?i)((?:a(?<!\wa)ttempts?|r(?<!\wr)etr(?:y|ies|ied)|e(?<!\we)xecution[ _-]?count)"
            rf"(?:[ _-]?(?:no|number|count))?{_LABEL_END})\d+\b"
        ),
        r"\1<n>",
    ),
    (
        ("in[", "in [", "out[", "out ["),
        re.compile(r"((?:I(?<!\wI)n|O(?<!\wO)ut)\s?\[)\d+(\])"),
        r"\1<n>\2",
    ),
    (
        (),
        re.compile(
            rf"\d(?<!\w\d)\d*(?:h\d+)?(?:m\d+)?(?:\.\d+)?\s?{_DURATION_UNIT}\b"
            r"(\s+(?:remaining|left|to go))?"
        ),
        _unit_duration,
    ),
)


_DIGIT = re.compile(r"\d")


def _mask_text(text: str) -> str:
    # Every fresh value holds a digit (a uuid its version digit): text without one, the
    # common result, is left as it is after one scan.
    if _DIGIT.search(text) is None:
        return text
    lowered = text.lower()
    for words, pattern, replacement in _FRESH_PATTERNS:
        if words and not any(word in lowered for word in words):
            continue
        text, count = pattern.subn(replacement, text)
        if count:
            lowered = text.lower()
    return text


# JSON keys, compared lower-case without "_", "-" and spaces ("message_id" is "messageid").
_COUNTER_KEYS = {
    "executioncount": "<n>",
    "attempt": "<n>",
    "attempts": "<n>",
    "attemptnumber": "<n>",
    "attemptcount": "<n>",
    "retry": "<n>",
    "retries": "<n>",
    "retrycount": "<n>",
    "pid": "<pid>",
    "ppid": "<pid>",
    "processid": "<pid>",
    "session": "<session>",
    "sessionid": "<session>",
    "sessionnumber": "<session>",
    "nonce": "<id>",
}
_FRESH_ID_SUFFIXES = (
    "messageid",
    "msgid",
    "runid",
    "requestid",
    "reqid",
    "eventid",
    "traceid",
    "spanid",
    "correlationid",
    "receiptid",
    "invocationid",
    "executionid",
    "responseid",
    "deliveryid",
)
_TIME_KEYS = frozenset(
    ("timestamp", "ts", "time", "date", "datetime", "now", "servertime", "lastmodified")
)
_TIME_SUFFIXES = ("at", "time", "timestamp", "date")
_DURATION_PARTS = ("duration", "elapsed", "latency")
_DURATION_KEYS = frozenset(
    (
        "took",
        "tookms",
        "timems",
        "timetaken",
        "walltime",
        "cputime",
        "runtimems",
        "executiontime",
        "responsetime",
        "processingtime",
        "timing",
        "timings",
    )
)
# Progress lives here even when the key also names a time ("timeRemaining").
_PROGRESS_SUFFIXES = ("count", "total", "remaining", "processed", "status", "state", "rows")
_PROGRESS_PARTS = ("percent", "progress")
# Strings under these keys are kept verbatim: they name something, and a changed name is
# a different result.
_VERBATIM_SUFFIXES = ("id", "ids", "uuid", "guid", "name", "path", "url", "uri", "hash", "sha")
_IDENTITY_KEYS = frozenset(_IDENTITY_NOUNS.split("|"))
# An object under one of these keys (or at the top) is the call's own product, so its
# generated `id` is fresh; anywhere else an `id` may be a record's identity.
_FRESH_NOUNS = frozenset(
    [
        "message",
        "msg",
        "run",
        "request",
        "event",
        "receipt",
        "trace",
        "span",
        "delivery",
        "execution",
        "invocation",
        "attempt",
    ]
)
_WRAPPERS = frozenset(("result", "data", "response", "payload", "body"))
_GENERATED = re.compile(
    r"(?:[A-Za-z]{1,16}[_-])?(?:[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}"
    r"|(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}|[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}"
    r"|\d{10,}|(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{16,})"
)
_MADE_TOKEN = re.compile(rf"(?<![\w-])(?:{_GENERATED.pattern})(?![\w-])")
_TIMELIKE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?|\d{10}(?:\d{3}){0,3}(?:\.\d+)?"
)


class _TooDeep(Exception):
    """The document nests deeper than `_DEPTH_LIMIT`."""


def _epoch(value: float) -> bool:
    # Seconds, millis, micros or nanos since 1970 for dates from 2001 on.
    return any(10**power <= value < 10 ** (power + 1) for power in (9, 12, 15, 18))


def _timelike(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return _epoch(value)
    return isinstance(value, str) and _TIMELIKE.fullmatch(value) is not None


def _generated(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 10**10
    return isinstance(value, str) and _GENERATED.fullmatch(value) is not None


# Keys whose generated value names what a call that changes something just made (an
# upload's `fileId`, a send's `id`, an `idempotencyKey`): a new one on every call.
_MADE_SUFFIXES = ("id", "key")


class _Walk:
    """One masking walk over a parsed document; `masked` says whether it masked anything,
    `made` whether the call changed something (its generated ids are fresh)."""

    def __init__(self, embedded: int, made: bool) -> None:
        self.embedded = embedded
        self.made = made
        self.masked = False

    def mask(self, token: str) -> str:
        self.masked = True
        return token

    def value(self, value: object, depth: int, fresh: bool) -> object:
        if depth > _DEPTH_LIMIT:
            raise _TooDeep
        if isinstance(value, dict):
            return {key: self.field(key, item, depth + 1, fresh) for key, item in value.items()}
        if isinstance(value, list):
            return [self.value(item, depth + 1, False) for item in value]
        if isinstance(value, str):
            return self.string(value)
        return value

    def string(self, text: str) -> str:
        found, masked = _mask(text, self.embedded + 1, made=self.made)
        self.masked |= masked
        return found

    def field(self, name: str, value: object, depth: int, fresh: bool) -> object:
        key = name.lower().replace("_", "").replace("-", "").replace(" ", "")
        scalar = value is not None and not isinstance(value, (bool, dict, list))
        if scalar and key in _COUNTER_KEYS:
            return self.mask(_COUNTER_KEYS[key])
        if scalar and key.endswith(_FRESH_ID_SUFFIXES):
            return self.mask("<id>")
        if key.endswith(_PROGRESS_SUFFIXES) or any(part in key for part in _PROGRESS_PARTS):
            return self.value(value, depth, False)
        if scalar and key in _TIME_KEYS:
            return self.mask("<time>")
        if scalar and key.endswith(_TIME_SUFFIXES) and _timelike(value):
            return self.mask("<time>")
        duration = key in _DURATION_KEYS or any(part in key for part in _DURATION_PARTS)
        if duration and value is not None and not isinstance(value, bool):
            return self.mask("<duration>")
        if self.made and scalar and key.endswith(_MADE_SUFFIXES) and _generated(value):
            return self.mask("<id>")
        if key in ("id", "uuid", "guid"):
            return self.mask("<id>") if fresh and _generated(value) else value
        if isinstance(value, str) and (key in _IDENTITY_KEYS or key.endswith(_VERBATIM_SUFFIXES)):
            return value
        inner = (fresh and key in _WRAPPERS) or key in _FRESH_NOUNS
        return self.value(value, depth, inner)


def _mask(text: str, embedded: int = 0, *, made: bool = False) -> tuple[str, bool]:
    if made and _generated(text.strip()):  # the whole answer is the id of what was made
        return "<id>", True
    if len(text) <= _JSON_LIMIT and embedded <= _EMBED_LIMIT and text.lstrip()[:1] in ("{", "["):
        try:
            document = json.loads(text)
            walk = _Walk(embedded, made)
            found = walk.value(document, 0, True)
            return json.dumps(found, sort_keys=True, separators=(",", ":")), walk.masked
        except (ValueError, RecursionError, _TooDeep):
            pass  # not JSON, or too deep to walk: the text patterns still apply
    found = _mask_text(text)
    if made:  # "Uploaded report.pdf as file_9f86d0...": the ids of what was made
        found = _MADE_TOKEN.sub("<id>", found)
    return found, found != text


def mask_fresh(text: str) -> tuple[str, bool]:
    """`normalize_fresh`, and whether it masked a fresh value.

    A result that equals another only once masked is a near-repeat, not a plain repeat.

    Examples:
        >>> mask_fresh("Command still running (session sess-3, pid 1003)")
        ('Command still running (session <session>, pid <pid>)', True)
        >>> mask_fresh("3 of 10 done")
        ('3 of 10 done', False)
    """
    return _mask(text)


def normalize_made(text: str) -> str:
    """`normalize_fresh` for the result of a call that changes something (a send, an
    upload): what it made is new on every call, so its generated ids are fresh whatever
    their key (`fileId`, `uploadId`, `id`, `idempotencyKey`), and so is a result that is
    nothing but such an id. Ids that do not look generated (`"c3"`) stay.

    Examples:
        >>> normalize_made('{"ok": true, "fileId": "file_9f86d081884c7d659a2feaa0"}')
        '{"fileId":"<id>","ok":true}'
        >>> normalize_made("msg_9f86d081884c7d659a2f")
        '<id>'
        >>> normalize_made('{"conversationId": "c3"}')  # read as JSON, written canonically
        '{"conversationId":"c3"}'
    """
    return _mask(text, made=True)[0]


_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_ID_WORDS = frozenset(("id", "uuid", "guid"))


def mask_named_ids(text: str, asked: Collection[str] = ()) -> str:
    """A JSON object's values at keys that name an identifier (`messageId`, `file_id`,
    a bare `id`), when the call did not ask for them (`asked`: the call's argument
    values, as text), each written `<id>`; any other text as it is.

    For the result of a call that recurs: what a send, an upload or a run returns is
    often nothing but a receipt naming what it just made, with an id of any shape
    (`"om_7"`, `"f_0"`), new on every call. Ids inside lists are kept: they name the
    records a listing found, and other records are another result.

    Examples:
        >>> mask_named_ids('{"ok": true, "fileId": "f_3", "message": {"id": "qa_1"}}')
        '{"fileId":"<id>","message":{"id":"<id>"},"ok":true}'
        >>> mask_named_ids('{"jobId": "j1", "done": 4}', asked={"j1"})
        '{"jobId": "j1", "done": 4}'
        >>> mask_named_ids('{"items": [{"id": 1}, {"id": 2}]}')  # nothing masked: as it is
        '{"items": [{"id": 1}, {"id": 2}]}'
    """
    if len(text) > _JSON_LIMIT or text.lstrip()[:1] != "{":
        return text
    try:
        document = json.loads(text)
        walk = _Walk(0, made=False)  # its `masked` says whether an id was masked
        found = _named_ids(document, asked, 0, walk)
    except (ValueError, RecursionError, _TooDeep):
        return text
    return json.dumps(found, sort_keys=True, separators=(",", ":")) if walk.masked else text


def _named_ids(value: object, asked: Collection[str], depth: int, walk: _Walk) -> object:
    if depth > _DEPTH_LIMIT:
        raise _TooDeep
    if not isinstance(value, dict):
        return value
    masked: dict[str, object] = {}
    for key, item in value.items():
        words = _WORDS.findall(key)
        if (
            isinstance(item, str | int)
            and not isinstance(item, bool)
            and words
            and words[-1].lower() in _ID_WORDS
            and str(item) not in asked
        ):
            masked[key] = walk.mask("<id>")
        else:
            masked[key] = _named_ids(item, asked, depth + 1, walk)
    return masked


def normalize_fresh(text: str) -> str:
    """Reduce a tool result to what is not fresh on every call.

    Safe as a default: it masks only what is named or shaped as per-call fresh: message,
    run, request, event and trace ids, timestamps, durations, pids, attempts, sessions,
    execution counts. A JSON object or array (below 1 MB) is masked by key and value
    shape and re-serialised with sorted keys; other text by labelled patterns. Every
    other number stays, so progress ("40%", "3 of 10", a changed status or count) and a
    changed identity (a conversation, thread, file or order id) still differ. A
    countdown ("ETA 90s") stays too. Never raises.

    Examples:
        >>> normalize_fresh('{"ok": true, "messageId": "9f86d081884c7d65", "ts": 1764466033}')
        '{"messageId":"<id>","ok":true,"ts":"<time>"}'
        >>> normalize_fresh("3 passed in 0.12s")
        '3 passed in <duration>'
    """
    return mask_fresh(text)[0]
