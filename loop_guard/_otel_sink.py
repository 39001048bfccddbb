"""The OpenTelemetry sink of guard events, for the `otel` extra.

The faces subscribe `record_event` when `opentelemetry` can be imported (the extra
installs its API; `_faces.attach_sinks`); without it, nothing imports it. Each steer, block and stop
becomes an event on the span current where it happened, and a count on the meter
`loop_guard`: `loop_guard.steers`, `loop_guard.blocks`, `loop_guard.stops` and
`loop_guard.errors` (the guard's own faults). Attributes follow OpenTelemetry's GenAI
semantic conventions where one exists (`gen_ai.tool.name`, `gen_ai.tool.call.id`) and
carry a `loop_guard.` prefix otherwise. Without an SDK configured, the API does nothing.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from loop_guard._events import EventKind, GuardEvent


def _available() -> bool:
    # The API's own module: `opentelemetry` alone is a namespace any of its packages makes.
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # not installed, or a broken install: none
        return False


AVAILABLE = _available()
"""Whether the OpenTelemetry API can be imported: the faces then subscribe `record_event`."""

_SPAN_EVENT: dict[EventKind, str] = {
    "steer": "loop_guard.steer",
    "block": "loop_guard.block",
    "stop": "loop_guard.stop",
    "error": "loop_guard.error",
    "judge": "loop_guard.judgment",
}
_COUNTER: dict[EventKind, str] = {
    "steer": "loop_guard.steers",
    "block": "loop_guard.blocks",
    "stop": "loop_guard.stops",
    "error": "loop_guard.errors",
    "judge": "loop_guard.judgments",
}
_COUNTER_HELP = {
    "loop_guard.steers": "Steer messages the guard delivered to the model",
    "loop_guard.blocks": "Tool calls the guard blocked",
    "loop_guard.stops": "Requests the guard ended",
    "loop_guard.errors": "Events the guard failed on and let through unguarded",
    "loop_guard.judgments": "Times the judge model was asked whether an agent made progress",
}

_counters: dict[str, Any] = {}
_making = threading.Lock()


def record_event(event: GuardEvent) -> None:
    """Add `event` to the current span and count it on the `loop_guard` meter."""
    from opentelemetry import trace

    attributes = _attributes(event)
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(_SPAN_EVENT[event.kind], attributes)
    counted = {key: attributes[key] for key in _COUNTED if key in attributes}
    _counter(_COUNTER[event.kind]).add(1, counted)


_COUNTED = ("gen_ai.tool.name", "loop_guard.reason")
"""The attributes a count is split by: few values each (a call id or a conversation
would make a series per call)."""


def _attributes(event: GuardEvent) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "gen_ai.tool.name": event.tool,
        "loop_guard.kind": event.kind,
        "loop_guard.conversation": event.conversation,
        "loop_guard.streak": event.streak,
        "loop_guard.blocks": event.blocks,
        "loop_guard.message": event.message,
    }
    if event.call_id:
        attributes["gen_ai.tool.call.id"] = event.call_id
    if event.reason is not None:
        attributes["loop_guard.reason"] = event.reason
    cost = event.cost  # what loops cost the request so far (`LoopCost`)
    attributes["loop_guard.loop.model_calls"] = cost.model_calls
    attributes["loop_guard.loop.tool_runs"] = cost.tool_runs
    attributes["loop_guard.loop.tokens"] = cost.tokens
    attributes["loop_guard.loop.tool_runs_saved"] = cost.tool_runs_saved
    attributes["loop_guard.loop.chars_kept_out"] = cost.chars_kept_out
    attributes["loop_guard.loop.tokens_kept_out"] = cost.tokens_kept_out
    return attributes


def _counter(name: str) -> Any:
    """The counter `name` of the global meter provider's `loop_guard` meter (made once:
    the API's proxies follow a provider set later)."""
    counter = _counters.get(name)
    if counter is None:
        from opentelemetry import metrics

        with _making:
            counter = _counters.get(name)
            if counter is None:
                meter = metrics.get_meter("loop_guard")
                counter = meter.create_counter(name, unit="1", description=_COUNTER_HELP[name])
                _counters[name] = counter
    return counter
