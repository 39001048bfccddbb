"""`normalize_fresh`: per-call fresh values go, progress and identity stay."""

from __future__ import annotations

import json
import string
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loop_guard._volatile import mask_fresh
from loop_guard.normalize import normalize_fresh, normalize_volatile

U1, U2 = "3f2a9c1e-0b7d-4c1a-9e2f-5a6b7c8d9e0f", "7c1d0e2f-9a8b-4c3d-8e7f-6a5b4c3d2e1f"


def js(value: Any) -> str:
    return json.dumps(value)


SAME = [
    # Text: sessions, pids, attempts, uuids, times, durations.
    (
        "Command still running (session sess-3, pid 1003)",
        "Command still running (session sess-4, pid 1004)",
    ),
    ("Runtime failed before spawn: attempt 7", "Runtime failed before spawn: attempt 8"),
    ("retries: 2, last error: timeout", "retries: 3, last error: timeout"),
    (f"request {U1} failed", f"request {U2} failed"),
    ("at 2026-11-30T01:27:13Z: not ready", "at 2026-11-30T01:29:40.512+01:00: not ready"),
    ("[01:27:13] waiting", "[01:27:19] waiting"),
    ("3 passed in 0.12s", "3 passed in 0.15s"),
    ("done in 12 ms", "done in 340 ms"),
    ("real\t0m0.013s", "real\t0m1.250s"),
    ("duration=1.5 status=ok", "duration=2.25 status=ok"),
    ("rate limited (request id: req_8f2a91)", "rate limited (request id: req_1c44b0)"),
    ("x-request-id=9f86d081884c7d65", "x-request-id=1b4f0e9851971998"),
    ("Out[7]: 4", "Out[8]: 4"),
    ("ts=1764466033 ok", "ts=1764466099 ok"),
    # JSON: fresh keys, fresh value shapes, key order and spacing.
    (js({"ok": True, "messageId": "m-1"}), js({"ok": True, "messageId": "m-2"})),
    (js({"message_id": 1, "run_id": "r1"}), js({"message_id": 2, "run_id": "r2"})),
    (js({"receipt": {"platformMessageId": "1"}}), js({"receipt": {"platformMessageId": "2"}})),
    (
        js({"requestId": "a", "eventId": "b", "traceId": "c"}),
        js({"requestId": "d", "eventId": "e", "traceId": "f"}),
    ),
    (js({"id": U1, "ok": True}), js({"id": U2, "ok": True})),
    (js({"id": "01HZX3K4M5N6P7Q8R9S0T1V2W3"}), js({"id": "01HZX3K4M5N6P7Q8R9S0T1V2W4"})),
    (js({"id": 1234567890123456789}), js({"id": 1234567890123456790})),
    (js({"id": "chatcmpl-9q8w7e6r5t4y3u2i1o"}), js({"id": "chatcmpl-1a2s3d4f5g6h7j8k9l"})),
    (js({"result": {"id": "9f86d081884c7d65"}}), js({"result": {"id": "1b4f0e9851971998"}})),
    (js({"ts": 1764466033, "ok": 1}), js({"ts": 1764466099, "ok": 1})),
    (js({"createdAt": "2026-11-30T01:27:13Z"}), js({"createdAt": "2026-11-30T01:28:00Z"})),
    (js({"created_at": 1764466033123}), js({"created_at": 1764466099456})),
    (js({"sentAt": U1, "date": "2026-11-30"}), js({"sentAt": U1, "date": "2026-12-01"})),
    (js({"timestamp": 1764466033}), js({"timestamp": 1764466099})),
    (js({"duration": 12, "elapsed": "3s"}), js({"duration": 15, "elapsed": "4s"})),
    (js({"latency_ms": 12, "took": 3}), js({"latency_ms": 40, "took": 9})),
    (js({"pid": 1003, "attempt": 7}), js({"pid": 1004, "attempt": 8})),
    (js({"session": "sess-3", "state": "running"}), js({"session": "sess-4", "state": "running"})),
    (js({"log": "started pid 1003"}), js({"log": "started pid 1004"})),
    ('{"a": 1, "b": [1, 2]}', '{ "b": [1,2], "a": 1 }'),
    (
        js({"status": "ok", "stdout": "4\n", "execution_count": 7, "duration_seconds": 0.013}),
        js({"status": "ok", "stdout": "4\n", "execution_count": 8, "duration_seconds": 0.021}),
    ),
    (  # an MCP text part that holds JSON
        js({"content": [{"type": "text", "text": js({"messageId": "m1", "ok": True})}]}),
        js({"content": [{"type": "text", "text": js({"ok": True, "messageId": "m2"})}]}),
    ),
]

DIFFERENT = [
    ("progress: 40%", "progress: 60%"),
    ("3 of 10 done", "4 of 10 done"),
    ("3 passed", "4 passed"),
    ("3 passed in 0.12s", "4 passed in 0.12s"),
    ("12:foo", "13:foo"),
    ("  12\tdef foo():\n  13\t    return 1", "  12\tdef foo():\n  13\t    return 2"),
    ("ETA 90s", "ETA 60s"),
    ("90s remaining", "60s remaining"),
    ("status: running", "status: done"),
    ("report for 2026-11-30", "report for 2026-12-01"),
    (f"opened conversation {U1}", f"opened conversation {U2}"),
    (f"/threads/{U1}/messages", f"/threads/{U2}/messages"),
    ("rows: 100", "rows: 200"),
    (
        js({"status": "running", "rows_processed": 100}),
        js({"status": "done", "rows_processed": 200}),
    ),
    (js({"status": "running"}), js({"status": "done"})),
    (js({"state": "queued"}), js({"state": "running"})),
    (js({"count": 1}), js({"count": 2})),
    (js({"total": 10, "remaining": 3}), js({"total": 10, "remaining": 2})),
    (js({"percent": 40}), js({"percent": 60})),
    (js({"progress": 0.4}), js({"progress": 0.6})),
    (js({"processed": 1764466033}), js({"processed": 1764466099})),
    (js({"timeRemaining": 90}), js({"timeRemaining": 60})),
    (
        js({"ok": True, "conversationId": "c1", "messageId": "m1"}),
        js({"ok": True, "conversationId": "c2", "messageId": "m2"}),
    ),
    (js({"thread_id": U1, "runId": "r1"}), js({"thread_id": U2, "runId": "r2"})),
    (js({"channel": "C1", "ts": 1764466033}), js({"channel": "C2", "ts": 1764466099})),
    (js({"user": U1}), js({"user": U2})),
    (js({"file": {"id": U1}}), js({"file": {"id": U2}})),
    (js({"orderId": "o-17"}), js({"orderId": "o-18"})),
    (js({"plan": {"id": "p1", "steps": 3}}), js({"plan": {"id": "p2", "steps": 3}})),
    (js([{"id": U1, "name": "a"}]), js([{"id": U2, "name": "a"}])),
    (js({"id": "p1"}), js({"id": "p2"})),
    (js({"bytes": 1764466033}), js({"bytes": 1764466099})),
    (js({"status": "ok", "stdout": "4\n"}), js({"status": "ok", "stdout": "5\n"})),
    (js({"a": 1}), js({"a": 1.5})),
    (js({"a": True}), js({"a": 1})),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_fresh_values_are_masked(a: str, b: str) -> None:
    assert a != b
    assert normalize_fresh(a) == normalize_fresh(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_progress_and_identity_stay(a: str, b: str) -> None:
    assert normalize_fresh(a) != normalize_fresh(b)


@pytest.mark.internals(reason="mask_fresh also says whether it masked; normalize_fresh does not")
def test_the_same_message_sent_21_times() -> None:
    replies = [
        js(
            {
                "ok": True,
                "messageId": str(uuid.uuid4()),
                "runId": f"run_{uuid.uuid4().hex}",
                "receipt": {"platformMessageId": str(1_900_000_000_000_000_000 + n)},
                "timestamp": 1_764_466_033_000 + 997 * n,
            }
        )
        for n in range(21)
    ]
    masked = [mask_fresh(reply) for reply in replies]
    assert len({found for found, _ in masked}) == 1
    assert all(changed for _, changed in masked)


@pytest.mark.internals(reason="mask_fresh also says whether it masked; normalize_fresh does not")
def test_whether_anything_was_masked() -> None:
    assert mask_fresh("pid 1003") == ("pid <pid>", True)
    assert mask_fresh("3 of 10 done") == ("3 of 10 done", False)
    # Canonical key order alone is no masking.
    assert mask_fresh('{"b": 1, "a": 2}') == ('{"a":2,"b":1}', False)
    assert mask_fresh('{"messageId": "m1"}') == ('{"messageId":"<id>"}', True)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "{",
        "[" * 100_000,
        "[" * 500 + "]" * 500,
        '{"a":' * 200 + "1" + "}" * 200,
        "[1e999, NaN, -Infinity]",
        "[" + "9" * 5000 + "]",
        '["\\ud800"]',
        "\x00\udcff{}",
        '{"id": null, "pid": null, "duration": true, "messageId": {"x": 1}}',
    ],
)
def test_hostile_input_never_raises(text: str) -> None:
    found = normalize_fresh(text)
    assert normalize_fresh(found) == found


def test_deep_json_falls_back_to_text() -> None:
    deep = "[" * 200 + '"pid 1003"' + "]" * 200
    assert normalize_fresh(deep) == deep.replace("1003", "<pid>")


def test_big_json_is_read_as_text() -> None:
    big = js({"messageId": "m-1", "pad": "x" * 1_100_000})
    assert normalize_fresh(big) == big.replace('"m-1"', '"<id>"')


def test_normalize_volatile_is_unchanged() -> None:
    assert normalize_volatile("done in 12 ms, pid 4711") == "done in <duration>, pid <pid>"
    assert normalize_volatile("ETA 90s") == "ETA <duration>"


def test_a_large_result_is_masked_in_one_pass() -> None:
    """Its cost is counted in the benchmarks (`benchmarks/instructions.py`, the sized
    rows), not timed here: a megabyte of log lines and a 100-row JSON document are masked
    line by line and row by row, every fresh value and nothing else."""
    record = {"id": U1, "name": "row", "createdAt": "2026-11-30T01:27:13Z", "count": 3}
    doc = js({"ok": True, "rows": [record] * 100})
    assert len(doc) > 9_000
    rows = json.loads(normalize_fresh(doc))["rows"]
    assert len(rows) == 100
    assert len({json.dumps(row, sort_keys=True) for row in rows}) == 1
    assert rows[0]["name"] == "row"
    assert rows[0]["createdAt"] != record["createdAt"]
    text = ("12: a line of output, took 3 ms, pid 17\n" * 26_000)[:1_000_000]
    lines = normalize_fresh(text).splitlines()
    assert len(set(lines[:-1])) == 1
    assert "pid 17" not in lines[0]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.sampled_from(["id", "ts", "pid", "messageId", "status", "text", "n"]) | st.text(),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@given(json_values)
def test_idempotent_and_never_raises(value: Any) -> None:
    once = normalize_fresh(js(value))
    assert normalize_fresh(once) == once


@given(st.text(max_size=200))
def test_text_is_idempotent(text: str) -> None:
    once = normalize_fresh(text)
    assert normalize_fresh(once) == once


STABLE_KEYS = ["status", "state", "rows_processed", "count", "conversationId", "name", "path", "a"]
plain = st.none() | st.booleans() | st.integers() | st.text(string.ascii_letters, max_size=12)


@given(
    st.dictionaries(st.text(string.ascii_letters, max_size=8), json_values, max_size=4),
    st.sampled_from(STABLE_KEYS),
    plain,
    plain,
)
def test_a_changed_stable_field_stays_different(
    rest: dict[str, Any], key: str, one: Any, other: Any
) -> None:
    if js(one) == js(other):
        return
    a, b = {**rest, key: one}, {**rest, key: other}
    assert normalize_fresh(js(a)) != normalize_fresh(js(b))
