"""Replies for the in-reply repetition ("chanting") detector: `LOOPS`, degenerate replies it
must catch, and `NOT_LOOPS`, legitimate replies that merely look repetitive and must never be
flagged.

A loop runs on well past the point of detection (as a model streams until its output limit,
at least 4,000 characters of repetition for most), its `prefix` is the healthy text before the
repetition starts, and its `cut_by` the repetition a watch of the generation may read before
it must have found it (give or take a unit and a check). Each prefix ends on a character the
repeated chunk does not end on, so the repetition cannot be stretched back into the prefix: a
detector that keeps less than the prefix has cut healthy text.

Every text is deterministic: variety comes from SHA-256 digests of counters, never `random`.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class Text:
    """One whole reply fed to the detector."""

    name: str  # short id, used as the pytest id
    text: str  # the whole reply
    loop: bool  # True: a repeated-text loop the detector must catch
    prefix: str = ""  # for loops: the healthy text the detector must keep ("" if none)
    cut_by: int = 4000  # for loops: characters of repetition by which it is found


def _digest(*key: object) -> bytes:
    return hashlib.sha256("|".join(map(str, key)).encode()).digest()


def _num(low: int, high: int, *key: object) -> int:
    """A number in [low, high], fixed by `key`."""
    return low + int.from_bytes(_digest(*key)[:4], "big") % (high - low + 1)


def _pick(options: Sequence[str], *key: object) -> str:
    return options[_num(0, len(options) - 1, *key)]


def _chant(chunk: str, length: int) -> str:
    """`chunk` back to back for `length` characters, cut mid-chunk as an output limit cuts."""
    return (chunk * (length // len(chunk) + 1))[:length]


def _loop(name: str, prefix: str, chunk: str, length: int, cut_by: int = 4000) -> Text:
    return Text(name, prefix + _chant(chunk, length), loop=True, prefix=prefix, cut_by=cut_by)


def _ok(name: str, text: str) -> Text:
    return Text(name, text, loop=False)


# Varied prose: 12**5 sentences, so a sentence rarely recurs and never back to back.
_OPENERS = (
    "In practice,", "Over time,", "For a small team,", "Seen from outside,", "Oddly enough,",
    "In most codebases,", "During an incident,", "Historically,", "On a good day,", "Put simply,",
    "At larger scale,", "Early in a project,",
)  # fmt: skip
_SUBJECTS = (
    "the cost of a flaky test", "a well-named function", "the first draft of a schema",
    "an unread error message", "the on-call rotation", "a vague ticket", "code review",
    "a dependency upgrade", "the deployment pipeline", "a missing log line",
    "the shape of the data", "a shared glossary",
)  # fmt: skip
_VERBS = (
    "tends to outweigh", "quietly shapes", "rarely reflects", "often hides", "slowly erodes",
    "can double", "usually predicts", "sets the tone for", "makes visible", "undermines",
    "pays for", "outlives",
)  # fmt: skip
_OBJECTS = (
    "the design choices of the first week", "how newcomers read the system",
    "the trust people place in alerts", "every estimate that follows",
    "the time spent in meetings", "the value of a careful rollback plan",
    "what the team believes is safe to change", "the real cost of a feature",
    "the habits of the people who maintain it", "the speed of later debugging",
    "the patience of its users", "a release schedule",
)  # fmt: skip
_TAILS = (
    ".", ", which is easy to forget.", ", even when nobody says so.", " more than any metric.",
    ", and the effect compounds.", " in ways that are hard to measure.", ", at least at first.",
    ", as several postmortems show.", " long after the original authors leave.",
    ", so it deserves attention.", " without anyone deciding it should.", ", for better or worse.",
)  # fmt: skip


def _essay(seed: str, length: int) -> str:
    """Paragraphs of varied sentences, at least `length` characters, ending on a full stop."""
    paragraphs: list[str] = []
    sentences: list[str] = []
    size, last, i = 0, "", 0
    while size < length:
        parts = (_OPENERS, _SUBJECTS, _VERBS, _OBJECTS, _TAILS)
        opener, subject, verb, obj, tail = (_pick(p, seed, i, k) for k, p in enumerate(parts))
        i += 1
        sentence = f"{opener} {subject} {verb} {obj}{tail}"
        if sentence == last:
            continue
        sentences.append(sentence)
        size += len(sentence) + 1
        last = sentence
        if len(sentences) == _num(4, 7, seed, "paragraph", len(paragraphs)):
            paragraphs.append(" ".join(sentences))
            sentences = []
    return "\n\n".join([*paragraphs, " ".join(sentences)] if sentences else paragraphs)


def _square_free(count: int) -> list[int]:
    """The ternary square-free word (the runs of 1s between the 0s of Thue-Morse): 2, 1, 0,
    2, 0, 1, ... No block of it follows itself, so the choices it drives never repeat exactly
    back to back."""
    word: list[int] = []
    run, n = 0, 1
    while len(word) < count:
        if bin(n).count("1") % 2:
            run += 1
        else:
            word.append(run)
            run = 0
        n += 1
    return word


_MAYBE = ("Let me look at it. ", "Let me think. ", "Maybe not. ")
_NEAR_REPEAT = "".join(f"I should try again. {_MAYBE[c]}" for c in _square_free(400))

_FUNCTION = '''
def parse_config(path: str) -> dict[str, str]:
    """Read a KEY=VALUE file into a dict, skipping comments and blank lines."""
    result: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
            result[key.strip()] = value.strip()
    return result
'''

_PARAGRAPH = (
    "\n\nThe migration moves every table from the legacy cluster to the new one in three "
    "phases. First, writes are mirrored to both clusters while reads stay on the old one. "
    "Second, once the row counts and checksums agree for a full day, reads switch over behind "
    "a feature flag that can be turned off within a minute. Third, the mirror is removed and "
    "the old cluster is kept read-only for two weeks before it is finally decommissioned."
)

_COUNTED_PREFIX = (
    "The search returned no order, although the order id is in the customer's email. The "
    "index may lag behind the database by a few seconds, so I will query it again:"
)

LOOPS: tuple[Text, ...] = (
    # Gemini CLI's own chanting test: the model announces it is done, forever.
    _loop(
        "gemini_chant",
        "",
        "I will not output any text.\n I will just end the turn.\n I am done.\n",
        12_000,
    ),
    _loop(
        "dead_loop",
        "The tests fail because the fixture path is relative. I changed it to an absolute path, "
        "re-ran the suite and the same failure came back, so the cause is elsewhere. The traceback "
        "points at `load_fixture`, which opens the file before the temporary directory exists. "
        "Moving the directory set-up into the session fixture should fix the ordering.\n\n",
        "OK I'm in a dead loop. Let me just write the summary. ",
        24_000,
    ),
    _loop(
        "thinking_done",
        "The plan has three parts: rename the `users` table, backfill the new `account_id` "
        "column, and switch the API to read it. Let me work through them in order.\n\n",
        "Thinking... Done. ",
        21_600,
    ),
    _loop(
        "wait_reread",
        "The service reads `config.yaml` at start-up, and the port there is 8080, yet the log "
        "says it bound 9090. Either an environment variable overrides it or another file is "
        "loaded first. The Dockerfile sets no PORT, but the compose file might.\n\n",
        "Wait, I need to check the config again. Let me re-read the file. ",
        8_000,
    ),
    # A whole function re-emitted inside one code fence; the chunk opens on its line break.
    _loop(
        "python_function",
        "Here is a parser for the settings file:\n\n```python\nfrom __future__ import annotations"
        "\n\n\n# The installer writes KEY=VALUE lines.",
        _FUNCTION,
        22_000,
    ),
    _loop(
        "code_line",
        "```python\ndef process(x):",
        "\n    result = compute(x)",
        6_000,
    ),
    _loop("word_the", "The answer depends on", " the", 5_000),
    _loop("digits_zero", "The probability is 3.", "0", 20_000),
    _loop("paragraph", "## Migration plan", _PARAGRAPH, 24_000),
    # One anchor, three continuations in a non-periodic order: only the near-repeat rule sees it.
    _loop(
        "near_repeat",
        "The request to the billing API timed out again after 30 seconds. The retry budget "
        "allows five attempts and this was the third, so there is room for two more, but the "
        "timeouts may come from the upstream rate limit rather than the network.\n\n",
        _NEAR_REPEAT,
        len(_NEAR_REPEAT),
    ),
    _loop(
        "list_item",
        "Here is what to try next:\n\n- Restart the service with `systemctl restart api`\n"
        "- Check the disk usage with `df -h`",
        "\n- Check the logs for errors",
        6_000,
    ),
    # The stuck object is cut after its last digit, which differs from the healthy one's, so
    # the repetition starts at Bob's closing brace.
    _loop(
        "json_object",
        'The users are:\n\n```json\n[\n  {"id": 1, "name": "Alice", "role": "admin", "age": 31},'
        '\n  {"id": 2, "name": "Bob", "role": "editor", "age": 45',
        '},\n  {"id": 3, "name": "Carol", "role": "viewer", "age": 28',
        10_000,
    ),
    # Pure symbols: these need about 4,000 characters, so they run on to 20,000.
    _loop("divider_equals", "## Results\n", "=", 20_000),
    _loop("newlines", "All done.", "\n", 20_000),
    _loop("box_never_closes", "┌" + "─" * 58 + "┐", "\n│" + " " * 58 + "│", 20_000),
    # A long healthy answer first: the detector must not cut into it.
    _loop(
        "after_long_answer",
        _essay("answer", 5_200),
        "\n\nLet me know if you have any other questions!",
        8_000,
    ),
    _loop(
        "chinese",
        # Chinese punctuation: the full-width commas are meant.
        "好的，我来分析这个问题。首先需要读取配置文件，然后检查数据库连接是否正常。"  # noqa: RUF001
        "日志显示服务在启动后三十秒内退出，错误码为一，这通常意味着配置有误。\n\n",  # noqa: RUF001
        "我需要再检查一下配置文件。",
        6_000,
    ),
    _loop(
        "emoji",
        "All 214 tests pass now, the build is green on all three platforms, and the coverage "
        "report shows 93% for the new module. The release notes are drafted too.\n\n",
        "🎉 Great job! 🚀 Let's keep going! ✨ ",
        6_000,
    ),
    # Short chants: a unit of five characters or more, ten times or more back to back, is cut
    # within 600 characters of repetition.
    _loop("again", "I could not reach the database, so I will try it", " again", 4_000, 600),
    _loop(
        "chunk_50",
        "The import failed twice with the same error.\n\n",
        "Retrying the import with the same settings now... ",  # 50 characters
        4_000,
        600,
    ),
    _loop(
        "sentence_72",
        "The cache key includes the user id, so two users never share an entry. ",
        "I think the problem is in the cache layer, so I will look at it closer. ",
        4_000,
        600,
    ),
    _loop(
        "chinese_short",
        "测试仍然失败，错误信息与之前相同。\n\n",  # noqa: RUF001
        "让我再试一次。",
        4_000,
        600,
    ),
    # A whole line of code, verbatim, in a block of a programming language.
    _loop(
        "fenced_statement",
        "```python\nfor row in rows:",
        "\n    total = total + row.amount  # add the amount of the row",
        4_000,
        600,
    ),
    # Letterless runaways: the same symbols, with no variation at all, many times over.
    _loop("one_emoji", "All tests pass.", "😂", 3_000, 1_000),
    _loop("party_emoji", "Deployed to production!", "🎉", 8_000, 1_000),
    _loop("table_flip", "I give up.", "\n(╯°□°)╯︵ ┻━┻", 110 * 13, 1_000),
    _loop("dash_blank", "Summary:", "\n\n-", 680 * 3, 1_000),
    # Digits, letters and spaces back to back, with no separator but spaces, run on in one
    # line: cut within 1,000 characters of repetition, in a code block too.
    _loop("fenced_digits", "```text\n", "3141592653589", 3_000, 1_000),
    _loop("fenced_counting", "```\n", "1 2 3 4 5 6 7 ", 3_000, 1_000),
    # The same sentence with only its counter changing: cut within 2,000 characters.
    Text(
        "counted_steps",
        _COUNTED_PREFIX
        + "".join(f"\nStep {n}: let me try the same query again." for n in range(41, 241)),
        loop=True,
        prefix=_COUNTED_PREFIX,
        cut_by=2_000,
    ),
)

_CHECKS = ("parser", "lexer", "cache", "router", "auth", "billing", "search", "export", "queue")
_ACTIONS = ("rejects", "accepts", "trims", "retries", "logs", "rounds", "sorts")
_TABLE = "\n".join(
    [
        "## Test results\n",
        "| # | Test | Module | Duration | Status | Result |",
        "|---|------|--------|----------|--------|--------|",
        *(
            f"| {i} | test_{_ACTIONS[i % 7]}_{_CHECKS[i // 7]}_{i:02d} "
            f"| tests/test_{_CHECKS[i // 7]}.py | {_num(3, 950, 'ms', i)} ms | ✅ | PASS |"
            for i in range(63)
        ),
        "\nAll 63 tests passed.",
    ]
)

# Gemini CLI's test: 40 items sharing a 70-character prefix are a list, not a loop.
_SHARED_PREFIX = "Here are the changes:\n\n" + "".join(
    f"- Update the import statement in src/components/module_{n}.tsx to use the new API\n"
    for n in range(1, 41)
)


def _java_class() -> str:
    """A class whose methods nest three blocks deep: runs of closing braces."""
    fields = ("name", "email", "phone", "city", "country", "zip", "company", "title", "notes")
    methods = "".join(
        f"\n    public void set{f.capitalize()}(String {f}) {{\n"
        f"        if ({f} != null) {{\n"
        f"            for (Listener listener : listeners) {{\n"
        f'                if (listener.accepts("{f}")) {{\n'
        f'                    listener.changed("{f}", this.{f}, {f});\n'
        "                }\n            }\n        }\n"
        f"        this.{f} = {f};\n    }}\n"
        for f in fields
    )
    declared = "".join(f"    private String {f};\n" for f in fields)
    body = "    private final List<Listener> listeners = new ArrayList<>();\n" + methods
    return f"```java\npublic class Contact {{\n{declared}{body}}}\n```\n"


_OPS = (
    ("ADD", "+"), ("SUB", "-"), ("MUL", "*"), ("DIV", "//"), ("MOD", "%"), ("AND", "&"),
    ("OR", "|"), ("XOR", "^"), ("SHL", "<<"), ("SHR", ">>"), ("EQ", "=="), ("NE", "!="),
    ("LT", "<"), ("LE", "<="), ("GT", ">"), ("GE", ">="),
)  # fmt: skip
_ELIF_CHAIN = (
    '```python\ndef step(vm: VM, op: str, arg: int) -> None:\n    if op == "PUSH":\n'
    "        vm.push(arg)\n"
    + "".join(
        f'    elif op == "{op}":\n        b, a = vm.pop(), vm.pop()\n        vm.push(a {sym} b)\n'
        for op, sym in _OPS
    )
    + '    else:\n        raise ValueError(f"unknown op {op!r}")\n```\n'
)

_ASSERTS = (
    "```python\nfrom calc import add, mul\n\n\ndef test_add() -> None:\n"
    + "".join(
        f"    assert add({a}, {b}) == {a + b}\n"
        for a, b in ((_num(-99, 999, "a", i), _num(0, 999, "b", i)) for i in range(40))
    )
    + "\n\ndef test_mul() -> None:\n"
    + "".join(
        f"    assert mul({a}, {b}) == {a * b}\n"
        for a, b in ((_num(-40, 99, "c", i), _num(0, 99, "d", i)) for i in range(40))
    )
    + "```\n"
)

_DICT_LITERAL = (
    "```python\nREASONS: dict[int, str] = {\n"
    + "".join(f'    {s.value}: "{s.phrase}",\n' for s in HTTPStatus)
    + "}\n```\n"
)

_BOX = "\n".join(
    ["┌" + "─" * 58 + "┐", *(["│" + " " * 58 + "│"] * 23), "└" + "─" * 58 + "┘"]
)  # 60 wide, 25 tall, empty inside: 1,400 characters of symbols

_BANNER = """\
*************************************************************
*                                                           *
*   ██████  ███████ ██████  ██       ██████  ██    ██       *
*   ██   ██ ██      ██   ██ ██      ██    ██  ██  ██        *
*   ██   ██ █████   ██████  ██      ██    ██   ████         *
*   ██   ██ ██      ██      ██      ██    ██    ██          *
*   ██████  ███████ ██      ███████  ██████     ██          *
*                                                           *
*          release 2.4.1  -  build 8812  -  2025-03-14      *
*                                                           *
*************************************************************
"""

_TREE = """\
loop_guard/
├── __init__.py
├── cli.py
├── core/
│   ├── __init__.py
│   ├── engine.py
│   ├── fingerprint.py
│   └── detectors/
│       ├── __init__.py
│       ├── repeat.py
│       ├── chant.py
│       └── progress.py
├── middleware.py
└── tests/
    ├── conftest.py
    ├── test_engine.py
    └── test_chant.py
"""

_DIVIDERS = ("-" * 40, "=" * 40, "***", "-" * 72, "=" * 72, "* * *")
_DOCUMENT = "\n\n".join(
    f"## Section {n}\n\n{_essay(f'section {n}', 700)}\n\n{_DIVIDERS[n % len(_DIVIDERS)]}"
    for n in range(1, 13)
)

_FIRST = ("Ada", "Brian", "Chen", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas")
_LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Novak", "Haddad", "Kowalski")
_JSON_ARRAY = json.dumps(
    [
        {
            "id": 1000 + i,
            "name": f"{_pick(_FIRST, 'first', i)} {_pick(_LAST, 'last', i)}",
            "email": f"user{1000 + i}@example.com",
            "score": _num(0, 10_000, "score", i) / 100,
            "active": _num(0, 3, "active", i) > 0,
        }
        for i in range(120)
    ],
    indent=2,
    ensure_ascii=False,
)

_VERSES = (
    "The kettle sings at half past five,\nthe street is grey and slow to wake,",
    "The bus is late, the coffee cold,\nthe rain has found my other shoe,",
    "My inbox holds a hundred flags,\neach one a fire someone lit,",
    "At noon the sun breaks through the cloud\nand paints the office window gold,",
    "The evening train is packed and warm,\na stranger sleeps against the door,",
    "And when the lamps are out at last\nand all the day is folded small,",
)
_REFRAIN = "But hold on, hold on, the morning comes,\nhold on, the morning comes again."
_SONG = "\n\n".join(f"{verse}\n{_REFRAIN}" for verse in _VERSES)

# Robert Frost, 1923, in the public domain: its last line is said twice, as written.
_FROST = """\
Stopping by Woods on a Snowy Evening

Whose woods these are I think I know.
His house is in the village though;
He will not see me stopping here
To watch his woods fill up with snow.

My little horse must think it queer
To stop without a farmhouse near
Between the woods and frozen lake
The darkest evening of the year.

He gives his harness bells a shake
To ask if there is some mistake.
The only other sound's the sweep
Of easy wind and downy flake.

The woods are lovely, dark and deep,
But I have promises to keep,
And miles to go before I sleep,
And miles to go before I sleep.
"""

_STATUSES = ("shipped", "pending", "delivered", "returned", "cancelled")
_CSV = "order_id,customer,date,amount,currency,status\n" + "".join(
    f"{50_000 + i},{_pick(_FIRST, 'c', i)} {_pick(_LAST, 'd', i)},2025-{_num(1, 12, 'm', i):02d}"
    f"-{_num(1, 28, 'day', i):02d},{_num(100, 99_999, 'amt', i) / 100:.2f},"
    f"{_pick(('EUR', 'USD', 'GBP'), 'cur', i)},{_pick(_STATUSES, 'st', i)}\n"
    for i in range(200)
)

_TIMES_TABLE = "\n".join(
    [
        "|  x | " + " | ".join(f"{c:3d}" for c in range(1, 13)) + " |",
        "|----|" + "-----|" * 12,
        *(
            "| " + f"{r:2d} | " + " | ".join(f"{r * c:3d}" for c in range(1, 13)) + " |"
            for r in range(1, 13)
        ),
    ]
)

_PARTS = ("api", "auth", "billing", "search", "export", "queue", "mailer", "ledger", "cache", "cli")
_DIRECTORIES = tuple(f"{a}/{p}" for a in ("services", "libs", "tools") for p in _PARTS)
_CHECK_FOR = (
    "the summary reports no failures", "no test is skipped", "the coverage stays above 90%",
    "the log shows no warnings", "the run takes under a minute",
)  # fmt: skip
_STEPS = "To verify the whole monorepo after the upgrade:\n\n" + "".join(
    f"Step {n}: Run `make test` in the {d} directory and check that "
    f"{_pick(_CHECK_FOR, 'check', n)}.\n"
    for n, d in enumerate(_DIRECTORIES, start=1)
)

_LOG = "".join(
    f"2025-03-14T09:{12 + i // 60:02d}:{i % 60:02d}.{_num(0, 999, 'ms', i):03d}Z "
    f"{'WARN' if _num(0, 9, 'lvl', i) == 0 else 'INFO'} [worker-{_num(1, 8, 'w', i)}] "
    f"processed batch {4_200 + i}: {_num(1, 512, 'n', i)} items in {_num(5, 900, 't', i)} ms "
    f"(queue depth {_num(0, 64, 'q', i)})\n"
    for i in range(150)
)

# Month names and weekdays written out: calendar's own depend on the locale.
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August")
_CALENDAR = "\n\n".join(
    f"{month} 2025\nMo Tu We Th Fr Sa Su\n"
    + "\n".join(
        " ".join(f"{day:2d}" if day else "  " for day in week).rstrip()
        for week in calendar.monthcalendar(2025, m)
    )
    for m, month in enumerate(_MONTHS, start=1)
)

_BLOB = b"".join(_digest("blob", i) for i in range(96))
_BASE64 = "```\n" + base64.encodebytes(_BLOB).decode() + "```\n"
_HEX_DUMP = "".join(
    f"{offset:08x}: "
    + " ".join(_BLOB[j : j + 2].hex() for j in range(offset, offset + 16, 2))
    + "  "
    + "".join(chr(b) if 32 <= b < 127 else "." for b in _BLOB[offset : offset + 16])
    + "\n"
    for offset in range(0, 1024, 16)
)

# Data a model is asked for: labels, test results, templates and traces that repeat a few values
# or lines, short of a loop (data and code blocks get four times the room of prose).
_LABELS = "\n".join(_pick(("positive", "negative", "neutral"), "label", n) for n in range(400))
_JSONL_LABELS = "\n".join(
    json.dumps({"label": _pick(("spam", "ham"), "jsonl", n)}) for n in range(300)
)
_TEST_RESULTS = "\n".join(
    f"test_{_pick(_CHECKS, 'test', n)}_{n:03d} {_pick(('PASS', 'PASS', 'FAIL'), 'result', n)}"
    for n in range(200)
)
_TILES = (
    "#..~~..#..~~..#..~~..#..~~..#",
    "#............................#",
    "#~~~~~~~~~~~~~~~~~~~~~~~~~~~~#",
)
_TILEMAP = "```\n" + "\n".join(_pick(_TILES, "tile", n) for n in range(60)) + "\n```\n"
_TRACE = (
    'The build fails with a stack overflow:\n\n```\nException in thread "main" '
    "java.lang.StackOverflowError\n"
    + "\tat com.example.Parser.parseExpression(Parser.java:42)\n" * 60
    + "```\n\nThe recursion in `parseExpression` never reaches its base case."
)
_WARNINGS = "```\n" + "WARN  retrying connection to db-primary:5432\n" * 50 + "```\n"
_ZERO_ROWS = "x0,x1,x2,x3,x4,x5,x6,x7\n" + "0,0,0,0,0,0,0,0\n" * 100
_ZERO_ARRAY = "```python\nweights = np.array([" + "0.0, " * 500 + "0.0])\n```\n"
_DEFAULT_OBJECTS = "```json\n[\n" + '  {"id": null, "name": "", "tags": []},\n' * 60 + "]\n```\n"
_ROWS_TEMPLATE = (
    "```html\n<table>\n" + "  <tr><td></td><td></td><td></td></tr>\n" * 50 + "</table>\n```\n"
)

# Look-alikes near the short-chant and the letterless thresholds.
_SERVICES = ("api", "worker", "scheduler", "gateway", "indexer", "mailer")
_TABLE_30 = "| Service | Region | p95 (ms) | Errors |\n|---|---|---|---|\n" + "".join(
    f"| {_pick(_SERVICES, 'svc', i)}-{i:02d} | eu-west-{_num(1, 3, 'region', i)} "
    f"| {_num(20, 900, 'p95', i)} | {_num(0, 40, 'err', i)} |\n"
    for i in range(30)
)
_YAML_HOSTS = "hosts:\n" + "".join(
    f"  - name: {_pick(_SERVICES, 'host', i)}-{i:02d}.internal.example.com\n" for i in range(40)
)
_YAML_ENVIRONMENTS = "".join(
    f"{env}:\n  replicas: 3\n  image: registry.example.com/shop/api:2.4.1\n"
    f"  log_level: info\n  database: postgres://db-{env}.internal:5432/shop\n"
    for env in ("dev", "test", "staging", "preprod", "prod", "prod-eu", "prod-us", "prod-ap")
)
_ROW_YOUR_BOAT = "Row, row, row your boat,\n"
_POEM = (
    "The harbour lights are burning low,\nthe gulls have gone to bed,\n"
    + _ROW_YOUR_BOAT * 4
    + "The tide is turning, slow and wide,\nthe moon is overhead.\n"
)
_PROGRESS = "".join(
    f"Downloading model.bin [{'#' * (p // 5):<20}] {p:3d}% {p * 42 // 10} MB\n"
    for p in range(0, 101, 2)
)
_FRAME = "\n".join(["╔" + "═" * 38 + "╗", *(["║" + " " * 38 + "║"] * 30), "╚" + "═" * 38 + "╝"])
_PIPE_COLUMN = "".join(
    f"| {_num(0, 9, 'cell', i, 0)} | {_num(0, 9, 'cell', i, 1)} | {_num(0, 9, 'cell', i, 2)} |\n"
    for i in range(120)
)
_LINES_ASKED = "Here are your lines:\n\n" + "I will not waste chalk.\n" * 18
_LONG_DIVIDERS = "\n\n".join(f"{_essay(f'part {n}', 300)}\n\n{'=' * 100}" for n in range(1, 6))

# Look-alikes near the rules for a unit that runs on in one line and for a counted sentence.
_ZERO_VECTOR = "```\n[" + "0 " * 1500 + "0]\n```\n"
_DEFAULT_OBJECTS_LINE = "```json\n[" + '{"id": null, "tags": []}, ' * 120 + "{}]\n```\n"
_DIGIT_ROWS = "Test vectors:\n\n```\n" + "3141592653589\n" * 250 + "```\n"
_BIG_NUMBER = f"2 ** 5000 is:\n\n```\n{2**5000}\n```\n"
_TASKS = (
    ("Install", "the package with pip in a fresh virtual environment"),
    ("Configure", "the database URL in the settings file of the project"),
    ("Create", "the tables by running the migrations against the new database"),
    ("Load", "the fixtures that hold the countries, currencies and tax rates"),
    ("Start", "the development server and open the admin page in a browser"),
    ("Add", "a superuser account for yourself with a strong password"),
    ("Import", "last year's orders from the CSV export of the old shop"),
    ("Check", "that the totals per month match the old shop's reports"),
)
_NUMBERED_LIST = "To set the shop up:\n\n" + "".join(
    f"{n}. {verb} {what} for the {part} service.\n"
    for n, ((verb, what), part) in enumerate(zip(_TASKS * 5, _PARTS * 4, strict=True), start=1)
)
_SHORT_STEPS = "Steps:\n\n" + "".join(
    f"{n}. {verb} the {thing}.\n"
    for n, (verb, thing) in enumerate(
        ((v, t) for v in ("Open", "Check", "Save") for t in _PARTS), start=1
    )
)
_SQL_INSERTS = "".join(
    f"INSERT INTO users (id, name, email, role) VALUES ({100 + i}, "
    f"'{_pick(_FIRST, 'sql', i)} {_pick(_LAST, 'sql last', i)}', 'user{100 + i}@example.com', "
    f"'{_pick(('admin', 'editor', 'viewer'), 'sql role', i)}');\n"
    for i in range(60)
)
_LOG_MESSAGES = (
    "Connected to the database.", "Loaded the settings from config.yaml.",
    "Started the scheduler.", "Retrying the connection to the cache.",
    "Processed a batch of orders.", "Sent the daily report.",
)  # fmt: skip
_LOG_LINES = "".join(
    f"2025-03-14 09:{12 + i // 60:02d}:{i % 60:02d} "
    f"{_pick(('INFO', 'INFO', 'WARN'), 'log level', i)} {_pick(_LOG_MESSAGES, 'log', i)}\n"
    for i in range(80)
)
_INDEX_TABLE = "| Seat | State | Note |\n|---|---|---|\n" + "".join(
    f"| {n} | free | Nobody has booked this seat yet. |\n" for n in range(1, 81)
)

# Horizontal rules of 1,000 characters (Qwen Code's repeated-text cases): layout, not a
# model repeating itself.
DIVIDERS = ("-", "=", "*", "_", "+", "─", "━")

NOT_LOOPS: tuple[Text, ...] = (
    *(_ok(f"divider_{ord(rule):x}", rule * 1000) for rule in DIVIDERS),
    _ok("results_table", _TABLE),
    _ok("shared_prefix_list", _SHARED_PREFIX),
    _ok("closing_braces", _java_class()),
    _ok("elif_chain", _ELIF_CHAIN),
    _ok("similar_asserts", _ASSERTS),
    _ok("dict_literal", _DICT_LITERAL),
    _ok("ascii_box", _BOX),
    _ok("ascii_banner", _BANNER),
    _ok("ascii_tree", _TREE),
    _ok("dividers", _DOCUMENT),
    _ok("json_array", "```json\n" + _JSON_ARRAY + "\n```\n"),
    _ok("song_refrain", _SONG),
    _ok("frost", _FROST),
    _ok("csv_dump", _CSV),
    _ok("times_table", _TIMES_TABLE),
    _ok("calendar", _CALENDAR),
    _ok("numbered_steps", _STEPS),
    _ok("log_excerpt", "```\n" + _LOG + "```\n"),
    _ok("essay", _essay("essay", 10_500)),
    # Repetition the user asked for, and that stays short.
    _ok("ho_ho_ho", "Sure! Ho ho ho! Ho ho ho! Ho ho ho! Merry Christmas to you and yours."),
    _ok("i_love_you", "As you asked: I love you. I love you. I love you. I love you. "),
    _ok("base64_blob", _BASE64),
    _ok("hex_dump", "```\n" + _HEX_DUMP + "```\n"),
    _ok("labels", _LABELS),
    _ok("jsonl_labels", _JSONL_LABELS),
    _ok("test_results", _TEST_RESULTS),
    _ok("checklist", "Done so far:\n" + "- [x] done\n" * 30),
    _ok("tilemap", _TILEMAP),
    _ok("java_trace", _TRACE),
    _ok("warnings", _WARNINGS),
    _ok("zero_rows", _ZERO_ROWS),
    _ok("zero_array", _ZERO_ARRAY),
    _ok("default_objects", _DEFAULT_OBJECTS),
    _ok("rows_template", _ROWS_TEMPLATE),
    _ok(
        "zero_matrix",
        "```python\nmatrix = [\n" + "    [0, 0, 0, 0, 0, 0, 0, 0],\n" * 8 + "]\n```\n",
    ),
    _ok("table_30_rows", _TABLE_30),
    _ok("yaml_hosts", _YAML_HOSTS),
    _ok("yaml_environments", _YAML_ENVIRONMENTS),
    _ok("poem_refrain", _POEM),
    _ok("progress_bar", _PROGRESS),
    _ok("box_frame", _FRAME),
    _ok("pipe_column", _PIPE_COLUMN),
    _ok("lines_asked", _LINES_ASKED),
    _ok("long_dividers", _LONG_DIVIDERS),
    _ok("zero_vector", _ZERO_VECTOR),
    _ok("default_objects_line", _DEFAULT_OBJECTS_LINE),
    _ok("digit_rows", _DIGIT_ROWS),
    _ok("big_number", _BIG_NUMBER),
    _ok("numbered_list", _NUMBERED_LIST),
    _ok("short_steps", _SHORT_STEPS),
    _ok("sql_inserts", _SQL_INSERTS),
    _ok("log_lines", _LOG_LINES),
    _ok("index_table", _INDEX_TABLE),
)
