"""Fingerprints: what makes two calls or two results "the same".

See How the guard decides: identity.

Pure functions with no framework imports. `args_fingerprint` is canonical JSON, so key
order never matters; `result_fingerprint` is a streaming SHA-256 of the result's text
and image data plus its error flag.

Values JSON cannot hold are encoded as objects whose first key is a tag (`$` and a
name), so they can never be confused with plain strings of the same text, nor with a
plain object, whose keys that begin with `$` are escaped with one more `$`: a model
sending `{"$bytes": "aGk="}` as JSON is not sending `b"hi"`. Keys without a leading `$`
(nearly all) are written as they are, so their fingerprints never change.

| value | encoding |
|---|---|
| dict key beginning with `$` (`"$ref"`) | the key with one more `$` (`"$$ref"`) |
| integral float (`1.0`) | the int (`1`), as in JavaScript |
| NaN, Infinity, -Infinity | `{"$float":"nan"}`, `{"$float":"inf"}`, `{"$float":"-inf"}` |
| tuple | a list |
| bytes, bytearray, memoryview | `{"$bytes":"<base64>"}` |
| set, frozenset | `{"$set":[...]}`, elements sorted by their encoding |
| datetime, date, time | `{"$datetime":"<isoformat>"}` (likewise `$date`, `$time`) |
| Decimal | `{"$decimal":"<str>"}` |
| Enum member | `{"$enum":"<Class>.<NAME>"}` |
| pydantic model | its `model_dump(mode="json")`, under `{"$model":"<Class>","fields":...}` |
| dataclass instance | `{"$dataclass":"<Class>","fields":{...}}` |
| numpy array or scalar (anything with `tolist()`) | its `tolist()` |
| mapping with non-string keys | `{"$map":[[key, value], ...]}`, pairs sorted by encoding |
| a container already being encoded | `{"$cycle":true}` (no crash, no hang) |
| nesting deeper than 100 levels | `{"$deep":true}` below that level |
| int beyond 4300 digits | `{"$int":"<hex>"}` |
| anything else | `{"$object":"<module.Class>","repr":"<repr without memory addresses>"}` |
| an object that raises while encoded | `{"$object":"<module.Class>"}` |
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MAX_DEPTH = 100
"""Nesting below this many levels is encoded as `{"$deep":true}`: bounded time and stack."""

_CHUNK = 1 << 16
_encode_str = json.encoder.encode_basestring  # C-accelerated JSON string quoting
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def args_fingerprint(args: Any) -> str:
    """Return the canonical JSON of a call's args: sorted keys at every depth.

    Never raises: every value has a deterministic encoding (see the module docstring);
    an object that fails while being encoded is encoded by its type alone.

    Examples:
        >>> args_fingerprint({"b": 1.0, "a": {"y": 2, "x": [1, 2]}})
        '{"a":{"x":[1,2],"y":2},"b":1}'
        >>> args_fingerprint({"a": 1, "b": 2}) == args_fingerprint({"b": 2, "a": 1})
        True
    """
    if _is_plain_json((args,), 0):
        try:
            return "".join(_plain_chunks(args, 0))
        except (ValueError, RecursionError):  # an int past the str() digit limit; args mutated
            pass
    return _canonical_slow(args)


# The fast path. For plain JSON (exact dict with str keys, list, tuple, str, int, bool, None,
# finite non-integral float, nesting within MAX_DEPTH) C `json` writes exactly what `_encode`
# writes: the same string quoting (`encode_basestring`), `int.__repr__`, `float.__repr__`,
# keys sorted by code point, a tuple as a list. Anything else (integral floats, which we
# write as ints; subclasses, whose JSON the C encoder would take from the base type;
# non-str keys, which it would turn into strings; keys beginning with `$`, which we escape)
# goes to the slow path. Ints are not checked: one past Python's str() digit limit makes
# the encoder raise, as `int.__repr__` does, and the slow path tags it.
_plain = json.JSONEncoder(
    ensure_ascii=False,
    # No cycle bookkeeping: `_is_plain_json` bounds the depth, so a cycle never gets here.
    check_circular=False,
    sort_keys=True,
    separators=(",", ":"),
)
# `_plain.encode` makes its C encoder anew on every call, which costs as much as
# encoding small args: this one is made once, as `iterencode` makes it, and called with
# (value, 0) as `iterencode` calls it.
_make_c_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_plain_chunks: Callable[[Any, int], Iterable[str]] = (
    (lambda value, _: _plain.iterencode(value, _one_shot=True))  # json without C
    if _make_c_encoder is None
    else _make_c_encoder(
        None,
        _plain.default,
        _encode_str,
        _plain.indent,
        _plain.key_separator,
        _plain.item_separator,
        _plain.sort_keys,
        _plain.skipkeys,
        _plain.allow_nan,
    )
)
_PLAIN_ATOMS = frozenset({str, int, bool, type(None)})


def _is_plain_json(items: Iterable[Any], depth: int) -> bool:
    """Whether `items` (at nesting `depth`) are plain JSON that `_plain` writes as we do.

    Types only, one Python-level step per value: no string is copied.
    """
    for item in items:
        kind = type(item)
        if kind in _PLAIN_ATOMS:
            continue
        if kind is float:
            # Finite and not integral, in one step: an integral float gives 0.0 and
            # NaN or ±inf give NaN, neither of which is > 0.
            if not item % 1.0 > 0.0:
                return False
        elif kind is dict:
            if depth >= MAX_DEPTH:
                return False
            for key in item:
                # `$` keys are escaped (see `_key`), which C `json` does not do.
                if type(key) is not str or key[:1] == "$":
                    return False
            if not _is_plain_json(item.values(), depth + 1):
                return False
        elif kind is list or kind is tuple:
            if depth >= MAX_DEPTH or not _is_plain_json(item, depth + 1):
                return False
        else:
            return False
    return True


def _canonical_slow(args: Any) -> str:
    """The reference encoder: every value, any depth, cycles (see the module docstring)."""
    out: list[str] = []
    _encode(args, out, 0, set())
    return "".join(out)


def _encode(value: Any, out: list[str], depth: int, active: set[int]) -> None:
    kind = type(value)
    if kind is str:
        out.append(_encode_str(value))
    elif value is None:
        out.append("null")
    elif kind is bool:
        out.append("true" if value else "false")
    elif kind is int:
        out.append(_int(value))
    elif kind is float:
        out.append(_float(value))
    elif depth >= MAX_DEPTH:
        out.append('{"$deep":true}')
    elif isinstance(value, (dict, list, tuple, set, frozenset, Mapping)):
        if id(value) in active:
            out.append('{"$cycle":true}')
            return
        active.add(id(value))
        try:
            _encode_container(value, out, depth + 1, active)
        finally:
            active.discard(id(value))
    else:
        try:
            _encode_other(value, out, depth, active)
        except Exception:  # a hostile object (raising properties, broken dumps): its type
            out.append(_tagged("$object", _qualname(type(value))))


def _encode_container(value: Any, out: list[str], depth: int, active: set[int]) -> None:
    if isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out, depth, active)
        out.append("]")
    elif isinstance(value, (set, frozenset)):
        out.append('{"$set":[')
        out.append(",".join(sorted(_encoded(item, depth, active) for item in value)))
        out.append("]}")
    elif all(type(key) is str for key in value):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if index:
                out.append(",")
            out.append(_encode_str(_key(key)))
            out.append(":")
            _encode(value[key], out, depth, active)
        out.append("}")
    else:
        pairs = sorted(
            f"[{_encoded(key, depth, active)},{_encoded(item, depth, active)}]"
            for key, item in value.items()
        )
        out.append('{"$map":[' + ",".join(pairs) + "]}")


def _key(key: str) -> str:
    """A plain object's key as written: one more `$` in front of a leading `$`, so that no
    plain object spells a tag (tags are one `$` and a letter). The escape keeps the keys'
    sorted order, so sorting the raw keys sorts the written ones."""
    return "$" + key if key[:1] == "$" else key


def _encode_other(value: Any, out: list[str], depth: int, active: set[int]) -> None:
    if isinstance(value, bool):  # a bool subclass would otherwise look like an int
        out.append("true" if value else "false")
    elif isinstance(value, enum.Enum):
        out.append(_tagged("$enum", f"{type(value).__name__}.{value.name}"))
    elif isinstance(value, int):
        out.append(_int(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, str):
        out.append(_encode_str(str(value)))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(_tagged("$bytes", base64.b64encode(bytes(value)).decode("ascii")))
    elif isinstance(value, datetime.datetime):
        out.append(_tagged("$datetime", value.isoformat()))
    elif isinstance(value, datetime.date):
        out.append(_tagged("$date", value.isoformat()))
    elif isinstance(value, datetime.time):
        out.append(_tagged("$time", value.isoformat()))
    elif isinstance(value, decimal.Decimal):
        out.append(_tagged("$decimal", str(value)))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        _encode_record("$dataclass", value, fields, out, depth, active)
    elif _is_pydantic_model(value):
        _encode_record("$model", value, _pydantic_fields(value), out, depth, active)
    elif callable(getattr(type(value), "tolist", None)):  # numpy arrays and scalars
        _encode(value.tolist(), out, depth + 1, active)
    else:
        out.append(
            f'{{"$object":{_encode_str(_qualname(type(value)))},'
            f'"repr":{_encode_str(_safe_repr(value))}}}'
        )


def _encode_record(
    tag: str, value: Any, fields: Any, out: list[str], depth: int, active: set[int]
) -> None:
    if id(value) in active:
        out.append('{"$cycle":true}')
        return
    active.add(id(value))
    try:
        out.append(f'{{"{tag}":{_encode_str(_qualname(type(value)))},"fields":')
        _encode(fields, out, depth + 1, active)
        out.append("}")
    finally:
        active.discard(id(value))


def _encoded(value: Any, depth: int, active: set[int]) -> str:
    out: list[str] = []
    _encode(value, out, depth, active)
    return "".join(out)


def _int(value: int) -> str:
    try:
        return int.__repr__(value)
    except ValueError:  # beyond Python's int-to-str digit limit: hex has no limit
        return _tagged("$int", format(value, "x"))


def _float(value: float) -> str:
    if math.isnan(value):
        return '{"$float":"nan"}'
    if math.isinf(value):
        return '{"$float":"inf"}' if value > 0 else '{"$float":"-inf"}'
    if value.is_integer():
        return _int(int(value))
    return float.__repr__(value)


def _tagged(tag: str, text: str) -> str:
    return f'{{"{tag}":{_encode_str(text)}}}'


def _qualname(kind: type) -> str:
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not break the agent
        return "<unrepresentable>"
    return _ADDRESS.sub("", text) if isinstance(text, str) else "<unrepresentable>"


def _is_pydantic_model(value: Any) -> bool:
    # Looked up on the class: an instance's __getattr__ may raise or lie.
    kind = type(value)
    return callable(getattr(kind, "model_dump", None)) and hasattr(kind, "model_fields")


def _pydantic_fields(value: Any) -> Any:
    try:
        return value.model_dump(mode="json")
    except Exception:  # a model that cannot dump itself still gets a stable encoding
        return _safe_repr(value)


def result_fingerprint(content: Any, *, is_error: bool = False) -> str:
    """Return the SHA-256 (hex) of a result's text and image data and its error flag.

    `content` is a string, a list of content blocks (`{"type": "text", "text": ...}`,
    image blocks with `base64`/`data`, `url`/`image_url` or `file_id`) or any other
    value, which is hashed through its canonical JSON. Long strings are hashed in
    chunks, never copied whole.

    Examples:
        >>> result_fingerprint("ok") == result_fingerprint([{"type": "text", "text": "ok"}])
        True
        >>> result_fingerprint("ok") == result_fingerprint("ok", is_error=True)
        False
    """
    head = b"error:1\n" if is_error else b"error:0\n"
    if isinstance(content, str) and len(content) <= _CHUNK:  # most results: one update
        return hashlib.sha256(head + _text_head(b"text", content)).hexdigest()
    digest = hashlib.sha256(head)
    if isinstance(content, str):
        _hash_text(digest, b"text", content)
    elif isinstance(content, list):
        for block in content:
            _hash_block(digest, block)
    else:
        _hash_text(digest, b"json", args_fingerprint(content))
    return digest.hexdigest()


def _hash_block(digest: Any, block: Any) -> None:
    if isinstance(block, str):
        _hash_text(digest, b"text", block)
        return
    if not isinstance(block, Mapping):
        _hash_text(digest, b"json", args_fingerprint(block))
        return
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        _hash_text(digest, b"text", block["text"])
        return
    payload = _image_payload(block)
    if payload is not None:
        _hash_text(digest, b"image", payload)
        return
    _hash_text(digest, b"json", args_fingerprint(block))


def _image_payload(block: Mapping[str, Any]) -> str | None:
    """The data that identifies an image: base64 payload, URL or file id."""
    if block.get("type") not in ("image", "image_url", "file"):
        return None
    for key in ("base64", "data", "url", "file_id"):
        value = block.get(key)
        if isinstance(value, str):
            return value
    image_url = block.get("image_url")  # OpenAI: {"image_url": {"url": ...}}
    if isinstance(image_url, Mapping) and isinstance(image_url.get("url"), str):
        return str(image_url["url"])
    if isinstance(image_url, str):
        return image_url
    source = block.get("source")  # Anthropic: {"source": {"data": ...}}
    if isinstance(source, Mapping):
        for key in ("data", "url", "file_id"):
            if isinstance(source.get(key), str):
                return str(source[key])
    return None


def _hash_text(digest: Any, tag: bytes, text: str) -> None:
    digest.update(_text_head(tag, text))
    for start in range(_CHUNK, len(text), _CHUNK):
        digest.update(text[start : start + _CHUNK].encode("utf-8", "surrogatepass"))


def _text_head(tag: bytes, text: str) -> bytes:
    """A text's length prefix (so block boundaries can never be shifted into a
    collision) and its first chunk: most texts are one chunk, hashed in one update."""
    return b"%s:%d:%s" % (tag, len(text), text[0:_CHUNK].encode("utf-8", "surrogatepass"))
