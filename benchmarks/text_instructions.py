"""Machine instructions per streamed chunk: the repeated-text watch against LangChain's work.

A healthy reply (`bench_text.healthy_text`: no 40-character stretch repeated) is streamed in
4-character chunks, each row at a short and a long reply in one valgrind process (as
`instructions.py` counts steps), so one chunk is (long - short) / the difference in chunks:

- through `create_agent` (`stream_mode="messages"`) with no middleware: LangChain's work
  per streamed chunk; with `LoopGuardMiddleware(detect_repeated_text=False)` and with
  `LoopGuardMiddleware()`, for context;
- from the model's own stream, in one thread: with nothing attached; with a do-nothing
  token handler that takes the cutter's parameters (the floor: what LangChain costs to hand
  a chunk to a handler before any work); with the cutter the middleware attaches around its
  model call.

The watch's own work is the cutter less the floor, per chunk; the target is at most 1% of
LangChain's work per streamed chunk. The garbage collector is paused while a reply streams:
a collection's work grows with everything alive in the process, so it would land in
whichever row it happened in, and move the floor between runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any
from uuid import UUID

from _harness import Scale, Section, Target
from bench_text import CHUNK, healthy_text, stream_run
from instructions import segments
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from loop_guard import LoopGuardMiddleware
from loop_guard._repeated_text import DEFAULT_MIN_CHARS
from loop_guard._reply_watch import Cutter
from loop_guard.testing import ScriptedChatModel

ROWS = {
    "none": "create_agent streaming, no middleware: LangChain's work",
    "off": "create_agent + LoopGuardMiddleware(detect_repeated_text=False)",
    "on": "create_agent + LoopGuardMiddleware()",
    "direct-off": "the model's own stream, nothing attached",
    "direct-null": "the model's own stream, a do-nothing token handler: the floor",
    "direct-on": "the model's own stream, the middleware's cutter attached",
}
TOKENS = (1_000, 5_000)
"""The short and the long reply, in chunks."""
TARGET = 0.01
"""The watch's own work per chunk, at most, as a share of LangChain's."""


class NullTokenHandler(BaseCallbackHandler):
    """Takes every streamed token and does nothing with it; its parameters are the
    cutter's, so that the two differ in the work alone."""

    run_inline = True

    def on_llm_new_token(
        self,
        token: Any,
        *,
        chunk: Any = None,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        pass


def stream(row: str, reply: str, mark: Callable[[], object] = lambda: None) -> None:
    """Stream `reply` through `row`, between two marks; checked uncut and unspoken after."""
    expected = -(-len(reply) // CHUNK) + 1  # the text's chunks, then the closing one
    if not row.startswith("direct"):
        middleware = {
            "none": None,
            "off": LoopGuardMiddleware(detect_repeated_text=False),
            "on": LoopGuardMiddleware(),
        }[row]
        mark()
        _, model = stream_run(lambda messages, index: AIMessage(reply), middleware)
        mark()
        assert model.chunks == expected, (row, model.chunks, expected)
        assert middleware is None or not middleware.guard.stats.steers, row
        return
    model = ScriptedChatModel(script=lambda messages, index: AIMessage(reply), chunk_chars=CHUNK)
    prompt: list[BaseMessage] = [HumanMessage("Why does the build fail?")]
    watching = Cutter(DEFAULT_MIN_CHARS, prompt) if row == "direct-on" else nullcontext()
    config: Any = {"callbacks": [NullTokenHandler()]} if row == "direct-null" else None
    mark()
    with watching:
        for _ in model.stream(prompt, config):
            pass
    mark()
    assert model.chunks == expected, (row, model.chunks, expected)
    if isinstance(watching, Cutter):  # it read the whole reply, and found it clean
        assert watching.cut is None, row
        assert len(watching.read) == 1, row


def child(rows: list[str], tokens: tuple[int, int]) -> None:
    import gc
    import os

    for row in rows:
        stream(row, healthy_text(50 * CHUNK))  # the warm-up
        for length in tokens:
            # A collection's work grows with all that lives in the process, so it would land
            # in whichever row it happens in: the collector is paused while a reply streams.
            gc.collect()
            gc.disable()
            try:
                stream(row, healthy_text(length * CHUNK), os.getppid)
            finally:
                gc.enable()


def count(rows: list[str], tokens: tuple[int, int] = TOKENS) -> dict[str, float]:
    """Instructions per chunk of each row, in one valgrind process."""
    runs = segments([__file__, "--child", json.dumps([rows, tokens])])
    assert len(runs) == 2 * len(rows), (len(runs), len(rows))
    short, long = tokens
    return {row: (runs[2 * n + 1] - runs[2 * n]) / (long - short) for n, row in enumerate(rows)}


def run(scale: Scale) -> Section:
    out = Section(
        "text-instructions",
        "Instructions per streamed chunk (valgrind)",
        "A healthy reply streamed in 4-character chunks, every row in one valgrind process "
        "(`text_instructions.py`): through `create_agent` (LangChain's work per chunk), and "
        "from the model's own stream in one thread with nothing, a do-nothing token handler "
        "(the floor) or the middleware's cutter attached. The watch's own work is the cutter "
        "less the floor.",
        columns=["row", "per chunk"],
    )
    if scale.quick:
        for row in ROWS:
            stream(row, healthy_text(100 * CHUNK))
        out.notes.append("quick: every row streamed plainly once, not counted")
        return out
    per_chunk = count(list(ROWS))
    out.rows = [
        [f"`{row}`: {what}", f"{per_chunk[row] / 1e3:,.1f} k"] for row, what in ROWS.items()
    ]
    own = per_chunk["direct-on"] - per_chunk["direct-null"]
    langchain = per_chunk["none"]
    floor = per_chunk["direct-null"] - per_chunk["direct-off"]
    out.notes += [
        f"the watch's own work per chunk (direct-on - direct-null): {own / 1e3:,.2f} k",
        f"the floor, a chunk handed to a handler (direct-null - direct-off): {floor / 1e3:,.1f} k",
        "the middleware's watch in the agent (on - off): "
        f"{(per_chunk['on'] - per_chunk['off']) / 1e3:,.2f} k per chunk",
    ]
    share = own / langchain
    name = "the watch's own work ÷ LangChain's, per chunk"
    out.targets.append(Target(name, f"≤ {TARGET:.0%}", f"{share:.2%}", share <= TARGET))
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    rows, tokens = json.loads(sys.argv[2])
    child(rows, tuple(tokens))
