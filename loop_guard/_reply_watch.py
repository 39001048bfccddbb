"""Watching a chat model's replies for repeated text, as they stream and once finished
(the detector: `_repeated_text.py`), and cutting a reply where its repetition began.

Shared by the faces that see a model's tokens: the middleware cuts the stream (`Cutter`,
raised out of the model's generation), the callback handler counts it (`ReplyWatches`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from contextvars import ContextVar, Token
from typing import Any, cast, final
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.messages.utils import message_chunk_to_message
from langchain_core.tracers import _streaming
from langchain_core.tracers.context import register_configure_hook
from langgraph.config import get_config
from langgraph.constants import TAG_NOSTREAM
from langgraph.errors import GraphBubbleUp
from typing_extensions import override

from loop_guard import _messages
from loop_guard._langchain import block_text, text_of
from loop_guard._messages import GUARD_NAME
from loop_guard._repeated_text import Repetition, TextWatch, find_repetition

REPEATED_TEXT_MARK = "repeated_text"
"""`response_metadata["loop_guard"]` of a reply cut where it began repeating its own text."""

REPEATS_KEY = "loop_guard_repeats"
"""`response_metadata` key of a cut reply: how many times it had repeated its text."""


def repetition_in(message: BaseMessage, min_chars: int) -> Repetition | None:
    """Where a finished reply began repeating its own text, if it did."""
    content = message.content
    if not content:
        return None  # a reply of tool calls only: no text to read
    return find_repetition(text_of(content), min_chars)


def repeats_in(message: AIMessage, min_chars: int) -> int | None:
    """How many times a reply in a history repeated its own text: as the guard cut it
    (its mark), or as it was recorded; `None` when it did not."""
    metadata = message.response_metadata
    if metadata.get("loop_guard") == REPEATED_TEXT_MARK:
        repeats = metadata.get(REPEATS_KEY)
        return repeats if isinstance(repeats, int) else 0
    if message.name == GUARD_NAME:
        return None
    found = repetition_in(message, min_chars)
    return None if found is None else found.repeats


def cut_reply(message: AIMessage, repetition: Repetition) -> AIMessage:
    """`message` cut where its repetition began: the text it said before, one copy of the
    repeated text and a note; its calls, id and metadata kept, marked as cut. Content
    blocks other than text (reasoning, thinking with its signature, tool use) stay as
    they were: a provider may need them back."""
    note = _messages.repeated_text_note(repetition.repeats)
    content = message.content
    if isinstance(content, str):
        cut: str | list[str | dict[Any, Any]] = content[: repetition.start].rstrip() + note
    else:
        cut = _cut_blocks(content, repetition.start, note)
    metadata = {
        **message.response_metadata,
        "loop_guard": REPEATED_TEXT_MARK,
        REPEATS_KEY: repetition.repeats,
    }
    return AIMessage(
        content=cut,
        id=message.id,
        name=message.name,
        tool_calls=message.tool_calls,
        usage_metadata=message.usage_metadata,
        response_metadata=metadata,
        additional_kwargs=message.additional_kwargs,
    )


def _cut_blocks(
    blocks: list[str | dict[Any, Any]], start: int, note: str
) -> list[str | dict[Any, Any]]:
    """Content blocks with their text cut at `start` (counted as `text_of` counts) and the
    note after it; every other block kept in its place."""
    kept: list[str | dict[Any, Any]] = []
    seen = 0  # characters of text before the block
    cut = False
    for block in blocks:
        text = block if isinstance(block, str) else block_text(block)
        if text is None:
            kept.append(block)  # reasoning, thinking, tool use: not text
            continue
        if cut:
            continue  # the repetition
        if seen + len(text) < start:
            kept.append(block)
            seen += len(text)
            continue
        shortened = text[: start - seen].rstrip() + note
        kept.append(shortened if isinstance(block, str) else {**block, "text": shortened})
        cut = True
    return kept if cut else [*kept, {"type": "text", "text": note}]


def may_stream(model: object) -> bool:
    """Whether a chat model call on `model` may stream its reply, as LangChain decides
    (`BaseChatModel._should_stream`): not when the model's streaming is disabled, else
    when it streams by itself (`streaming=True`) or a streaming callback handler watches
    the run (`stream_mode="messages"`, `astream_events`). A model deciding for itself,
    or a runnable around one, may; so may a call outside a run.

    Only a call that may stream is worth a `Cutter`: LangChain hands every handler of a
    model run each event, and checks it against its streaming protocol first.
    """
    if not isinstance(model, BaseChatModel):
        return True
    if type(model)._should_stream is not BaseChatModel._should_stream:
        return True
    if model.disable_streaming is True:
        return False
    if getattr(model, "streaming", None) is True:
        return True
    try:
        callbacks = get_config().get("callbacks")
    except RuntimeError:
        return True
    return any(map(_streams, (*_handlers(callbacks), *_handlers(model.callbacks))))


def _handlers(callbacks: object) -> Sequence[object]:
    if isinstance(callbacks, BaseCallbackManager):
        return callbacks.handlers
    return callbacks if isinstance(callbacks, list) else ()


def _streams(handler: object) -> bool:
    """Whether a callback handler makes a model stream: LangChain's streaming protocol,
    read by its methods (`isinstance` on a protocol costs much more), or a handler of
    its events (`_V2StreamingCallbackHandler`)."""
    return getattr(handler, "tap_output_iter", None) is not None or isinstance(
        handler, _EVENT_STREAMERS
    )


_EVENT_STREAMERS: tuple[type[Any], ...] = tuple(
    kind
    for kind in (getattr(_streaming, "_V2StreamingCallbackHandler", None),)
    if isinstance(kind, type)
)
"""LangChain's handlers of its v2 stream events, in the releases that have them."""


def kept_out(tags: object) -> bool:
    """Whether a model run with these tags is kept out of the stream (`nostream`): not
    the agent's reply (the middleware's judge, say), so not watched for repeated text."""
    return isinstance(tags, list) and TAG_NOSTREAM in tags


class RepeatedTextCut(GraphBubbleUp):
    """Raised out of a model's generation to stop it where its reply began repeating
    itself. Control flow, as an interrupt is (`GraphBubbleUp`): the middleware that raised
    it catches it, and no middleware between (retries, fallbacks) takes it for a failure.

    Attributes:
        reply: The reply generated until then (its chunks merged).
        repetition: Where it began repeating itself.
    """

    def __init__(self, reply: AIMessage, repetition: Repetition) -> None:
        super().__init__("the reply began repeating itself")
        self.reply = reply
        self.repetition = repetition


class ReplyWatches:
    """The `TextWatch` of each chat model run in progress, by run id."""

    __slots__ = ("_lock", "_runs", "min_chars")

    def __init__(self, min_chars: int) -> None:
        self.min_chars = min_chars
        self._runs: dict[UUID, TextWatch] = {}
        self._lock = threading.Lock()

    def start(self, run_id: UUID) -> None:
        """Watch a model run from its first token."""
        with self._lock:
            self._runs[run_id] = TextWatch(self.min_chars)

    def feed(self, run_id: UUID, content: Any) -> Repetition | None:
        """The next chunk's content; the run's repetition, newly found (then no longer
        watched), else `None`."""
        watch = self._runs.get(run_id)
        if watch is None:
            return None
        found = watch.feed(text_of(content))
        if found is not None:
            self.end(run_id)
        return found

    def end(self, run_id: UUID) -> TextWatch | None:
        """Stop watching a run: its watch, `None` when it was not watched (or its
        repetition was found already)."""
        if run_id not in self._runs:
            return None  # most runs ending are chains and tools, never watched
        with self._lock:
            return self._runs.pop(run_id, None)

    def finished(self, run_id: UUID, message: BaseMessage) -> Repetition | None:
        """A run's reply is complete: its repetition, when it has one not found before.
        A reply that did not stream is read whole."""
        watch = self.end(run_id)
        if watch is None:
            return None
        if watch.length == 0:
            return repetition_in(message, self.min_chars)
        return watch.finish()


@final
class _Stream:
    """A watched model run: the chunks its reply streamed (to rebuild it once cut), and
    their text gathered until the watch's next check, then fed to it at once: a token's
    work is two appends and a count, not a call."""

    __slots__ = ("chunks", "due", "texts", "watch")

    def __init__(self, min_chars: int) -> None:
        self.watch = TextWatch(min_chars)
        self.chunks: list[Any] = []
        self.texts: list[str] = []
        self.due = self.watch.due

    def feed(self) -> Repetition | None:
        """Feed the watch the text gathered; the repetition, once found."""
        found = self.watch.feed("".join(self.texts))
        self.texts.clear()
        self.due = self.watch.due
        return found

    def finish(self) -> Repetition | None:
        """The reply is complete: its repetition, its last characters checked too."""
        return self.feed() or self.watch.finish()


class Cutter(BaseCallbackHandler):
    """Cuts a streaming reply where it begins repeating itself: raises `RepeatedTextCut`
    out of the model's generation (closing its stream). Attached to every chat model run
    within its `with` block by a configure hook, as LangChain attaches its tracers. A
    model that does not stream is not watched: its finished reply is read whole
    (`repetition_in`).

    It watches the runs of the agent's own model call, those whose prompt ends as
    `prompt` does (the model request's messages, a system message maybe before them): a
    model that other middleware calls on its own prompt (a tool selector, a summarizer, the
    judge) is not the agent's reply. Once it has cut a reply, it ends every other such
    run (`cut`): middleware between the guard and the model that takes the cut for a
    failure (a retry, a fallback, in langchain releases that do not pass control flow
    through) gets no new generation.
    """

    raise_error = True
    run_inline = True  # in the generation's own loop, before its next chunk

    def __init__(self, min_chars: int, prompt: Sequence[BaseMessage] = ()) -> None:
        super().__init__()
        self.min_chars = min_chars
        self.prompt = prompt
        self.cut: RepeatedTextCut | None = None
        """The cut made, once made."""
        self.read: set[str] = set()
        """The ids of the replies read to their end and found clean: not read again."""
        # Per model run, its stream; the last one looked up, by identity (a run's tokens
        # come with one `UUID` object, and hashing one costs more than a token's work).
        self._runs: dict[UUID, _Stream] = {}
        self._last: tuple[UUID | None, _Stream | None] = (None, None)
        self._attached: Token[Cutter | None] | None = None

    def __enter__(self) -> Cutter:
        """Attach the cutter to the chat model runs that start within the block."""
        self._attached = _cutter.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        """Detach it: model runs that start after the block are not watched."""
        if self._attached is not None:
            _cutter.reset(self._attached)
            self._attached = None

    @override
    def on_chat_model_start(
        self, serialized: dict[str, Any] | None, messages: list[list[BaseMessage]], *,
        run_id: UUID, **kwargs: Any,
    ) -> None:  # fmt: skip
        if not messages or not self._replies_to(messages[0], kwargs.get("tags")):
            return
        if self.cut is not None:
            raise self.cut
        self._runs[run_id] = _Stream(self.min_chars)

    def _replies_to(self, prompt: list[BaseMessage], tags: object) -> bool:
        """Whether a model run with this prompt is the agent's own model call."""
        if kept_out(tags):
            return False
        expected = self.prompt
        if not expected:
            return True
        last = expected[-1]
        return (
            len(prompt) - len(expected) in (0, 1)
            and bool(prompt)
            and (prompt[-1] is last or prompt[-1] == last)
        )

    @override
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
        # Called for every token: the arguments LangChain passes are named (no dict of
        # them is built), and the chunk is kept as it is (reading it costs a pydantic check).
        last, stream = self._last
        if last is not run_id:
            stream = self._runs.get(run_id)
            self._last = (run_id, stream)
        if stream is None:
            return
        stream.chunks.append(chunk)
        if token.__class__ is not str:  # content blocks, from some providers
            token = text_of(token)
        stream.texts.append(token)
        stream.due -= len(token)
        if stream.due <= 0 and (found := stream.feed()) is not None:
            self._forget(run_id)
            self.cut = _cut(stream.chunks, found)
            raise self.cut

    @override
    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A watched reply streamed to its end: its last characters are checked too (a
        repetition found there cuts it all the same); clean, it is not read again."""
        stream = self._runs.get(run_id)
        self._forget(run_id)
        if stream is None or not stream.chunks:
            return  # not watched, or not streamed: the finished reply is read whole
        chunks = stream.chunks
        found = stream.finish()
        if found is not None:
            self.cut = _cut(chunks, found)
            return
        # The reply keeps the id its chunks carry (a provider's, else the run's): read
        # off the first and the last, not merged from every chunk.
        for end in (chunks[0], chunks[-1]):
            reply_id = getattr(getattr(end, "message", None), "id", None)
            if isinstance(reply_id, str):
                self.read.add(reply_id)

    @override
    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._forget(run_id)

    def _forget(self, run_id: UUID) -> None:
        self._runs.pop(run_id, None)
        self._last = (None, None)


def _reply(chunks: list[Any]) -> AIMessage | None:
    """The reply streamed as `chunks` (`ChatGenerationChunk`s), whole."""
    messages = [m for c in chunks if isinstance(m := getattr(c, "message", None), AIMessageChunk)]
    if not messages:
        return None
    reply = message_chunk_to_message(add_ai_message_chunks(messages[0], *messages[1:]))
    return cast("AIMessage", reply)


def _cut(chunks: list[Any], found: Repetition) -> RepeatedTextCut:
    """The cut of a reply streamed as `chunks`, which began repeating itself at `found`."""
    return RepeatedTextCut(_reply(chunks) or AIMessage(""), found)


_cutter: ContextVar[Cutter | None] = ContextVar("loop_guard_cutter", default=None)
register_configure_hook(_cutter, inheritable=False)


class _CutIsNotAnError(logging.Filter):
    """Drops langchain-core's "Error in Cutter.on_llm_new_token callback" warning: the cut
    is how the guard stops a generation on purpose, and it has its own event."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and args[:1] == (Cutter.__name__,))


logging.getLogger("langchain_core.callbacks.manager").addFilter(_CutIsNotAnError())
