"""Identity (see How the guard decides: identity): args fingerprints and result fingerprints."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import tracemalloc
from collections import OrderedDict
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loop_guard import Call, _fingerprint
from loop_guard._fingerprint import args_fingerprint, result_fingerprint

# Keys as a model may send them, tag lookalikes and `$`-escaped lookalikes included.
_json_keys = (
    st.text(max_size=5)
    | st.sampled_from(["$bytes", "$set", "$float", "$$bytes", "$", "$$", "fields", "repr"])
    | st.text(max_size=4).map(lambda key: "$" + key)
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_json_keys, children, max_size=4)
    ),
    max_leaves=20,
)


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(item) for item in value]
    return value


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@given(json_values)
def test_key_order_never_matters_at_any_depth(value: Any) -> None:
    """Reversing the key order of every nested dict gives the same fingerprint."""
    assert args_fingerprint(value) == args_fingerprint(_reordered(value))


def _ints_for_integral_floats(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _ints_for_integral_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_ints_for_integral_floats(item) for item in value]
    return value


def _unescaped(value: Any) -> Any:
    """A parsed fingerprint of plain JSON, its escaped `$` keys taken back."""
    if isinstance(value, dict):
        return {(key[1:] if key[:1] == "$" else key): _unescaped(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_unescaped(item) for item in value]
    return value


def _tag_keys(value: Any) -> list[str]:
    """Keys anywhere in a parsed fingerprint that read as a tag: one `$`, then no `$`."""
    if isinstance(value, dict):
        found = [key for key in value if key[:1] == "$" and key[1:2] != "$"]
        return found + [tag for item in value.values() for tag in _tag_keys(item)]
    if isinstance(value, list):
        return [tag for item in value for tag in _tag_keys(item)]
    return []


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@given(json_values)
def test_plain_json_fingerprint_is_canonical_json(value: Any) -> None:
    """For JSON values the fingerprint is sorted, compact JSON of the same value (with
    `$` keys escaped), from which the value can be read back: no two JSON values share
    one, and none of them contains a tag."""
    text = args_fingerprint(value)
    parsed = json.loads(text)
    assert _unescaped(parsed) == _ints_for_integral_floats(value)
    assert _tag_keys(parsed) == []
    assert text == json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_integral_float_equals_int() -> None:
    """1.0 and 1 are the same argument, as in JavaScript; 1.5 is not."""
    assert args_fingerprint({"n": 1.0}) == args_fingerprint({"n": 1})
    assert args_fingerprint({"n": [2.0, -0.0]}) == args_fingerprint({"n": [2, 0]})
    assert args_fingerprint({"n": 1.5}) != args_fingerprint({"n": 1})


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_strings_never_collide_with_numbers_or_tags() -> None:
    """ "1" is not 1, and a string that looks like a tag is still a string."""
    assert args_fingerprint({"n": "1"}) != args_fingerprint({"n": 1})
    assert args_fingerprint('{"$bytes":"YQ=="}') != args_fingerprint(b"a")
    assert args_fingerprint(True) != args_fingerprint(1)


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Model(pydantic.BaseModel):
    name: str
    tags: list[str]


class Opaque:
    def __init__(self, value: int) -> None:
        self.value = value


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    __hash__ = object.__hash__


class Shade(enum.Enum):
    DARK = 1


@dataclasses.dataclass
class Box:
    size: int


def _cyclic() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


def _lookalike(value: Any) -> Any:
    """The plain JSON that spells `value`'s tagged encoding, as a model could send it."""
    return json.loads(args_fingerprint(value))


# One typed value per tag the encoder writes.
_TYPED = [
    b"hi",
    {1, 2},
    frozenset({"a"}),
    math.nan,
    math.inf,
    -math.inf,
    datetime.datetime(2024, 1, 2, 3, 4, 5),
    datetime.date(2024, 1, 2),
    datetime.time(3, 4),
    decimal.Decimal("1.50"),
    Shade.DARK,
    Box(1),
    pydantic.create_model("Tagged", n=(int, ...))(n=1),
    {1: "a"},
    10**4300,
    Opaque(1),
    BrokenRepr(),
    _cyclic(),
]  # Not `$deep`: below MAX_DEPTH every value is the marker, a lookalike too.


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@pytest.mark.parametrize("typed", _TYPED, ids=lambda value: type(value).__name__)
def test_plain_json_never_spells_a_tagged_value(typed: Any) -> None:
    """`{"$bytes": "aGk="}` sent as JSON is not `b"hi"`; likewise for every tag, nested too."""
    lookalike = _lookalike(typed)
    assert args_fingerprint(lookalike) != args_fingerprint(typed)
    assert args_fingerprint({"x": [lookalike]}) != args_fingerprint({"x": [typed]})


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_the_reported_lookalikes_are_different_args() -> None:
    assert args_fingerprint({"$bytes": "aGk="}) != args_fingerprint(b"hi")
    assert args_fingerprint({"$set": [1, 2]}) != args_fingerprint({1, 2})
    assert args_fingerprint({"$float": "nan"}) != args_fingerprint(math.nan)
    # The escape itself cannot be spelt: `$$` keys are escaped again.
    assert args_fingerprint({"$$bytes": "aGk="}) != args_fingerprint({"$bytes": "aGk="})


_typed_values = (
    st.binary(max_size=6)
    | st.frozensets(st.integers() | st.text(max_size=3), max_size=3)
    | st.sampled_from([math.nan, math.inf, -math.inf, Shade.DARK])
    | st.datetimes()
    | st.dates()
    | st.times()
    | st.decimals(allow_nan=False)
    | st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=3)
    | st.builds(Box, st.integers())
)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@given(_typed_values, json_values)
def test_typed_values_and_their_lookalikes_never_collide(typed: Any, around: Any) -> None:
    """Wherever it sits, a typed value and the JSON that spells its encoding differ."""
    assert args_fingerprint([around, typed]) != args_fingerprint([around, _lookalike(typed)])


# Canonical fingerprints (`Call.of`) computed before `$` keys were escaped: snapshots keep
# them, so a checkpointed thread must decide the same after an upgrade.
_PINNED = [
    ({"path": "src/app.py"}, "d4327e004589f30313fcb9de8e01f43241a2152633a438889effd0b6d4615df1"),
    (
        {
            "query": "weather in Paris",
            "limit": 10,
            "exact": False,
            "score": 0.5,
            "tags": ["a", None],
        },
        "93a89f616be22d8991acc5e3d98eed19b591a799f9c9cf81aad097994e165463",
    ),
    (
        {"n": 1.0, "nested": {"b": [1, 2.5, {"c": "d"}], "a": "\u00e9\u2028"}},
        "19f56c31a7d56460724011ca828ee007f0f64141e2ef64f6bb667591baef02ce",
    ),
    (
        {
            "data": b"hi",
            "ids": {3, 1, 2},
            "x": math.nan,
            "when": datetime.date(2024, 1, 2),
            "price": decimal.Decimal("1.50"),
            1: "one",
        },
        "61abe4cd5838cc8849e253ac5b93843aee3e2f8329e674bce30e5106ea5dcf53",
    ),
    ([], "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"),
    ("a price of $5", "6ff3774f0dda7ea5394d89ca3563c8400ad3c56071ae98141745e2d169004fe5"),
    ({"cost": "$5", "us$": 1}, "448507db50ce2e66168adc21637539856a3480cb177d6b5c83eb0a88775a8725"),
]


@pytest.mark.parametrize(("args", "digest"), _PINNED)
def test_fingerprints_of_args_without_dollar_keys_are_unchanged(args: Any, digest: str) -> None:
    assert Call.of("tool", args).fingerprint == digest


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"ab", '{"$bytes":"YWI="}'),
        ({3, 1, 2}, '{"$set":[1,2,3]}'),
        (frozenset({"b", "a"}), '{"$set":["a","b"]}'),
        ((1, 2), "[1,2]"),
        (datetime.datetime(2024, 1, 2, 3, 4, 5), '{"$datetime":"2024-01-02T03:04:05"}'),
        (datetime.date(2024, 1, 2), '{"$date":"2024-01-02"}'),
        (decimal.Decimal("1.50"), '{"$decimal":"1.50"}'),
        (Color.RED, '{"$enum":"Color.RED"}'),
        (float("nan"), '{"$float":"nan"}'),
        (float("inf"), '{"$float":"inf"}'),
        (float("-inf"), '{"$float":"-inf"}'),
        (Point(1, 2), '{"$dataclass":"' + __name__ + '.Point","fields":{"x":1,"y":2}}'),
        (
            Model(name="a", tags=["x"]),
            '{"$model":"' + __name__ + '.Model","fields":{"name":"a","tags":["x"]}}',
        ),
        ({1: "a", "b": 2}, '{"$map":[["b",2],[1,"a"]]}'),
    ],
)
def test_non_json_values_have_a_documented_encoding(value: Any, expected: str) -> None:
    """Each non-JSON type gets a deterministic tagged encoding, without raising."""
    assert args_fingerprint(value) == expected
    assert args_fingerprint(value) == args_fingerprint(value)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_arbitrary_objects_are_encoded_without_memory_addresses() -> None:
    """Two equal-looking objects get the same fingerprint: no `at 0x...` in it."""
    first, second = args_fingerprint(object()), args_fingerprint(object())
    assert first == second
    assert "0x" not in first
    assert "Opaque" in args_fingerprint(Opaque(1))


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_objects_whose_repr_and_eq_raise_are_encoded() -> None:
    """A hostile object never makes the guard raise."""
    assert "unrepresentable" in args_fingerprint({"x": BrokenRepr()})
    assert args_fingerprint({BrokenRepr()}) == args_fingerprint({BrokenRepr()})


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_cyclic_structures_do_not_crash_or_hang() -> None:
    """A dict or list that contains itself is encoded with a cycle marker."""
    looped: dict[str, Any] = {"a": 1}
    looped["self"] = looped
    items: list[Any] = [1]
    items.append(items)
    assert args_fingerprint(looped) == '{"a":1,"self":{"$cycle":true}}'
    assert args_fingerprint(items) == '[1,{"$cycle":true}]'


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_shared_but_acyclic_references_are_not_cycles() -> None:
    """The same list used twice side by side is encoded in full both times."""
    shared = [1, 2]
    assert args_fingerprint({"a": shared, "b": shared}) == '{"a":[1,2],"b":[1,2]}'


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_very_deep_nesting_is_bounded() -> None:
    """10,000 levels of nesting neither recurse out of the stack nor grow the output."""
    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    text = args_fingerprint(deep)
    assert text.endswith('{"$deep":true}' + "]" * 100)


class Level(enum.IntEnum):
    HIGH = 2


class Label(str):
    pass


class Ratio(float):
    pass


class Pair(tuple[Any, ...]):
    pass


# Values at the edges of the fast path: integral and non-finite floats (`-0.0`, `2**53`,
# `1e16`), ints around Python's 4300-digit str() limit, subclasses of JSON types and values
# JSON cannot hold at all.
_edge_leaves = st.sampled_from(
    [
        0.0,
        -0.0,
        1.0,
        -3.0,
        2.0**53,
        1e16,
        0.5,
        -2.5e-8,
        5e-324,
        1.7976931348623157e308,
        math.nan,
        math.inf,
        -math.inf,
        2**64,
        Level.HIGH,
        Color.RED,
        Label("a"),
        Ratio(0.5),
        b"a",
        decimal.Decimal("1.5"),
    ]
)
_any_text = st.text(st.characters(exclude_categories=()), max_size=8)  # incl. lone surrogates
_any_keys = (
    _any_text | st.integers() | st.booleans() | st.none() | st.floats() | st.just(Label("a"))
)
any_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _any_text | _edge_leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(_any_text, children, max_size=4)
        | st.dictionaries(_any_keys, children, max_size=3)
        | st.dictionaries(_any_text, children, max_size=3).map(OrderedDict)
        | st.frozensets(st.integers() | _any_text, max_size=3)
    ),
    max_leaves=20,
)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@given(any_values)
def test_fast_path_is_byte_identical_to_the_reference_encoder(value: Any) -> None:
    """Plain JSON goes through C `json`; every value still gets the reference's exact text."""
    assert args_fingerprint(value) == _fingerprint._canonical_slow(value)


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@given(st.floats())
def test_every_float_is_encoded_as_the_reference_does(number: float) -> None:
    """The fast path's one-step float check: integral, NaN, ±inf, -0.0 and subnormals."""
    assert args_fingerprint([number]) == _fingerprint._canonical_slow([number])


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@pytest.mark.parametrize("levels", [99, 100, 101, 102])
@pytest.mark.parametrize("container", [list, dict])
def test_fast_path_agrees_at_the_depth_limit(levels: int, container: type) -> None:
    """Nesting just above and below MAX_DEPTH: the `$deep` marker lands in the same place."""
    value: Any = [1.5, "x"]
    for _ in range(levels - 1):
        value = [value] if container is list else {"k": value}
    assert args_fingerprint(value) == _fingerprint._canonical_slow(value)


def _slow_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    slow = _fingerprint._canonical_slow

    def spy(args: Any) -> str:
        calls.append(args)
        return slow(args)

    monkeypatch.setattr(_fingerprint, "_canonical_slow", spy)
    return calls


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_plain_json_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table of records never reaches the Python encoder (the case benchmark 1 measures)."""
    calls = _slow_calls(monkeypatch)
    rows = [{"id": i, "name": f"r{i}", "score": i + 0.5, "tags": ("a", None)} for i in range(3)]
    assert args_fingerprint({"rows": rows}).startswith('{"rows":[{"id":0,"name":"r0"')
    assert calls == []


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
@pytest.mark.parametrize(
    "value",
    [{"n": 1.0}, [math.inf], {1: "a"}, {"n": Level.HIGH}, [Label("a")], OrderedDict(a=1), Pair()],
)
def test_values_c_json_writes_its_own_way_take_the_slow_path(
    monkeypatch: pytest.MonkeyPatch, value: Any
) -> None:
    """Integral floats, NaN and inf, non-str keys, subclasses: never C `json`'s text."""
    calls = _slow_calls(monkeypatch)
    args_fingerprint(value)
    assert calls == [value]


@pytest.mark.internals(
    reason="the canonical JSON a call's fingerprint hashes; Call.of shows only the hash"
)
def test_an_int_past_the_str_digit_limit_takes_the_slow_path() -> None:
    """C `json` raises on it (the pre-check does not look at ints); the slow path tags it."""
    assert args_fingerprint([10**4300]) == '[{"$int":"' + format(10**4300, "x") + '"}]'


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_result_fingerprint_is_sha256_hex() -> None:
    """A full 64-hex-digit SHA-256, never truncated."""
    digest = result_fingerprint("hello")
    assert len(digest) == 64
    int(digest, 16)


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_result_text_and_text_blocks_are_the_same_result() -> None:
    """A plain string and the same text as one content block are the same result."""
    assert result_fingerprint("abc") == result_fingerprint([{"type": "text", "text": "abc"}])
    assert result_fingerprint("abc") != result_fingerprint("abd")


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_block_boundaries_are_part_of_the_result() -> None:
    """["ab"] and ["a", "b"] differ: blocks are length-prefixed."""
    one = [{"type": "text", "text": "ab"}]
    two = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert result_fingerprint(one) != result_fingerprint(two)


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            {"type": "image", "base64": "AAAA", "mime_type": "image/png"},
            {"type": "image", "base64": "BBBB", "mime_type": "image/png"},
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}},
        ),
        ({"type": "image", "url": "https://x/a.png"}, {"type": "image", "url": "https://x/b.png"}),
        ({"type": "image", "file_id": "file-1"}, {"type": "image", "file_id": "file-2"}),
        (
            {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
            {"type": "image", "source": {"type": "base64", "data": "BBBB"}},
        ),
    ],
)
def test_different_images_with_the_same_caption_are_different_results(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    """Image data is hashed (the Pi extension only counted images)."""
    caption = {"type": "text", "text": "screenshot"}
    assert result_fingerprint([caption, first]) != result_fingerprint([caption, second])
    assert result_fingerprint([caption, first]) == result_fingerprint([caption, dict(first)])


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_non_string_results_are_hashed_through_canonical_json() -> None:
    """Dict results compare by content, not key order."""
    assert result_fingerprint({"a": 1, "b": 2}) == result_fingerprint({"b": 2, "a": 1})
    assert result_fingerprint(None) != result_fingerprint("null ")


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_lone_surrogates_and_odd_text_do_not_crash() -> None:
    """Text that is not valid UTF-8 still hashes deterministically."""
    assert result_fingerprint("\ud800x") == result_fingerprint("\ud800x")
    assert result_fingerprint("\ud800x") != result_fingerprint("\ud801x")


@pytest.mark.internals(reason="a result's hash on its own; Result.of shows it only inside a Result")
def test_a_large_result_is_hashed_without_a_second_full_copy() -> None:
    """Hashing a 20 MB string allocates far less than the string itself."""
    text = "x" * 20_000_000
    tracemalloc.start()
    try:
        digest = result_fingerprint(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    expected = hashlib.sha256(b"error:0\n" + b"text:20000000:" + text.encode()).hexdigest()
    assert digest == expected
