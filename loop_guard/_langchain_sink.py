"""The LangChain and LangGraph sink of guard events: every adapter subscribes it
(`LoopGuard.subscribe`), so a run's decisions show where its other events do."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from langchain_core.callbacks.manager import dispatch_custom_event
from langgraph.config import get_stream_writer

from loop_guard._events import GuardEvent
from loop_guard._fingerprint import args_fingerprint
from loop_guard._messages import GUARD_NAME


def dispatch_event(event: GuardEvent) -> None:
    """Publish a guard event as the LangChain custom event `loop_guard`, and on
    LangGraph's `custom` stream.

    It then shows in `astream_events(version="v2")`, in tracing under the run the event
    happened in, and to `stream(..., stream_mode="custom")` (a LangGraph server's
    clients included), as a JSON-safe dict with `"event": "loop_guard"`. Outside any
    run there is nowhere to publish it, so nothing is.
    """
    payload = event_payload(event)
    try:
        dispatch_custom_event(GUARD_NAME, payload)
    except RuntimeError:
        return  # not inside a run (the engine used on its own)
    try:
        write = get_stream_writer()
    except (RuntimeError, KeyError):
        return  # a run, but not a LangGraph graph: no stream to write to
    write(payload)


def event_payload(event: GuardEvent) -> dict[str, Any]:
    """A guard event as a JSON-safe dict (args in the guard's canonical JSON form)."""
    args = None if event.args is None else json.loads(args_fingerprint(event.args))
    return {
        "event": GUARD_NAME,
        "kind": event.kind,
        "reason": event.reason,
        "conversation": event.conversation,
        "tool": event.tool,
        "args": args,
        "streak": event.streak,
        "blocks": event.blocks,
        "message": event.message,
        "call_id": event.call_id,
        "cost": dataclasses.asdict(event.cost),
    }
