"""The history is the truth: requests, and a conversation's state read from its messages.

A request begins at a user message. A state held in a process is a cache that proves it
is current against the history before it is used (`up_to_date`); a state lost (a new
process) or stale (another process moved the thread on) is rebuilt or caught up by
replaying the history through the engine, which decides alike every time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import cast, final

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from loop_guard._engine import TURNS_KEPT, Earlier, Engine
from loop_guard._fingerprint import result_fingerprint
from loop_guard._langchain import (
    BLOCK_MARK,
    HANDOFF_KEY,
    STATE_KEY,
    STEER_MARK,
    answers_to,
    calls_of,
    earlier_runs,
    first_key,
    is_marked,
    result_of,
    tokens_of,
)
from loop_guard._messages import GUARD_NAME
from loop_guard._reply_watch import repeats_in
from loop_guard._state import RequestState
from loop_guard._values import Call, Decision, Proceed
from loop_guard._volatile import normalize_fresh


def current_request(messages: Sequence[BaseMessage]) -> tuple[str | None, Sequence[BaseMessage]]:
    """The id of the message that began the request and the messages from it on.

    A request begins with a user message; messages the guard inserted never count, but
    a request the guard stopped is over: whatever follows its stop is another request
    (another agent's turn on the same messages, say).
    """
    start = request_start(messages)
    if start is None:
        return None, messages
    return messages[start].id, messages[start:]


def question_of(request: Sequence[BaseMessage]) -> str:
    """The fingerprint of the user message a request begins with ("" when it begins with
    none): the same message asked again brings nothing new (`Engine.start_request`).

    Examples:
        >>> from langchain_core.messages import HumanMessage
        >>> question_of([HumanMessage("Why?")]) == question_of([HumanMessage("Why?")])
        True
        >>> question_of([])
        ''
    """
    if not request or not is_user_message(request[0]):
        return ""
    return result_fingerprint(request[0].content)[:16]


def worked_on(messages: Sequence[BaseMessage]) -> bool:
    """Whether the request `messages` end in already holds model calls of tools: agents
    before the one starting now worked on it (a handoff, a delegation, a resumed run).

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        >>> asked = [HumanMessage("Plan a trip", id="u1")]
        >>> worked_on(asked)
        False
        >>> handoff = AIMessage("", tool_calls=[{"name": "to_bob", "args": {}, "id": "c1"}])
        >>> worked_on([*asked, handoff, ToolMessage("ok", tool_call_id="c1")])
        True
    """
    if messages and begins_request(messages, len(messages) - 1, len(messages) + 1):
        return False  # it ends in a user message, or the guard's stop: a new request
    start = request_start(messages)
    return any(_is_response(message) for message in messages[start or 0 :])


def handed_over_response(messages: Sequence[BaseMessage]) -> AIMessage | None:
    """The model response whose results were handed to the agent starting now: the last
    one with tool calls, when nothing but other agents' reports on the work (`is_report`)
    follows it among the replies; `None` when an agent ended its turn with a reply.

    Examples:
        >>> from langchain_core.messages import AIMessage, ToolMessage
        >>> task = AIMessage("", tool_calls=[{"name": "to_w", "args": {}, "id": "c1"}])
        >>> history = [task, ToolMessage("ok", tool_call_id="c1")]
        >>> handed_over_response([*history, AIMessage("Found A", name="w")]) is task
        True
        >>> handed_over_response([*history, AIMessage("Done")]) is None
        True
    """
    replies: list[AIMessage] = []
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            if not message.tool_calls:
                replies.append(message)
            elif all(is_report(reply, message.name) for reply in replies):
                return message
            else:
                return None
    return None


def request_start(
    messages: Sequence[BaseMessage], known: RequestStarts | None = None
) -> int | None:
    """Where the request `messages` end in begins (see `current_request`), if anywhere.

    With `known`, the walk back stops at the newest message whose request start it
    remembers and proves still holds, so a history read again as it grows costs what it
    added since, however long its request is.
    """
    start: int | None = None
    for index in range(len(messages) - 1, -1, -1):
        if begins_request(messages, index):
            start = index
            break
        if known is not None and (start := known.recall(messages, index)) is not None:
            break
    if known is not None and messages:
        known.remember(messages, start)
    return start


@final
@dataclass(frozen=True, slots=True)
class _Start:
    """Where a message sits in its history, and where its request begins there."""

    index: int
    start: int
    start_id: str


class RequestStarts:
    """The request starts of histories read lately, by the id of their last message.

    A cache that proves it is current before it is used: histories get trimmed,
    summarized, rewritten and forked, so an entry holds only while its message is still
    at its position and the request's first message still at its own, still beginning
    a request (a message added or removed before either moves it); else the walk goes
    on past it. Thread-safe; the newest `size` entries are kept.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[str, _Start] = OrderedDict()
        self._lock = threading.Lock()

    def recall(self, messages: Sequence[BaseMessage], index: int) -> int | None:
        """Where the request of `messages[:index + 1]` begins, when a start remembered for
        `messages[index]` still holds there."""
        key = messages[index].id
        if key is None:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None or entry.index != index:
            return None
        first = messages[entry.start]
        if first.id != entry.start_id or not begins_request(messages, entry.start):
            return None
        return entry.start

    def remember(self, messages: Sequence[BaseMessage], start: int | None) -> None:
        """Remember where the request of `messages` begins, by its last message."""
        if start is None:
            return  # no start to prove again: the next look walks the history
        last = len(messages) - 1
        key, start_id = messages[last].id, messages[start].id
        if key is None or start_id is None:
            return
        with self._lock:
            self._entries[key] = _Start(last, start, start_id)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


def begins_request(messages: Sequence[BaseMessage], index: int, end: int | None = None) -> bool:
    """Whether `messages[index]` begins a request: a user message, or the guard's stop
    with messages after it (before `end`)."""
    message = messages[index]
    if isinstance(message, AIMessage):
        return message.name == GUARD_NAME and index + 1 < (len(messages) if end is None else end)
    return is_user_message(message)


def is_user_message(message: BaseMessage) -> bool:
    """Whether a message starts a request: a user's, not one the guard inserted, nor a
    summary of the conversation another middleware wrote in the user's place."""
    return (
        isinstance(message, HumanMessage)
        and message.name != GUARD_NAME
        and message.additional_kwargs.get("lc_source") != "summarization"
    )


Observer = Callable[[Call, Sequence[Decision]], object]
"""Receives each replayed call with the decisions it led to (for the offline scan)."""


def replay(
    engine: Engine,
    request_id: str | None,
    messages: Sequence[BaseMessage],
    observe: Observer | None = None,
    *,
    before: RequestState | None = None,
    tools: Collection[str] | None = None,
    earlier: Earlier | None = None,
    unmarked_handoffs: bool = False,
) -> RequestState:
    """Rebuild a request's state from its messages, as if the guard had watched it live.

    The engine is deterministic, so checking the recorded calls again reproduces the
    blocks that were made (a call it blocks is not counted, whatever the history says
    it returned; nor is a call answered by the guard). A steer is taken as delivered
    once the model was called after it or it was written into a tool result. `before`
    is the conversation's state before this request: what its turns counted carries over.
    `tools` are the names of the tools that exist, when known (see `result_of`);
    `earlier`, where earlier runs of a call are found, and `unmarked_handoffs`, whether
    handoffs no guard marked are told by who spoke next (see `catch_up`).
    """
    state = engine.start_request(before, request_id, question_of(messages))
    return catch_up(
        engine,
        state,
        messages,
        observe,
        tools=tools,
        earlier=earlier,
        unmarked_handoffs=unmarked_handoffs,
    )


def catch_up(
    engine: Engine,
    state: RequestState,
    messages: Sequence[BaseMessage],
    observe: Observer | None = None,
    *,
    tools: Collection[str] | None = None,
    earlier: Earlier | None = None,
    history: Sequence[BaseMessage] | None = None,
    offset: int = 0,
    unmarked_handoffs: bool = False,
) -> RequestState:
    """`state` after the batches of `messages`, as if the guard had watched them live.

    Batches the state holds already change nothing (every transition is idempotent),
    so a state may catch up on a history that overlaps what it saw. `earlier` finds
    what earlier runs of a call returned (`Engine.record_result`): by default, in
    `messages`; a caller holding more of the history passes it. `messages` may be the
    part of `history` from `offset` on: a handoff's words are read back into what came
    before (`said_since_handed`), as a live face reads them. With `unmarked_handoffs`
    (the offline scan of histories no guard watched), a named agent's last call before
    another agent's reply is a handoff (`handed_over`).
    """
    if history is None:
        history, offset = messages, 0
    if earlier is None:
        earlier = earlier_runs(messages, engine.config.normalizers)
    responses = [
        index
        for index, message in enumerate(messages)
        if isinstance(message, AIMessage) and message.tool_calls
    ]
    replies = 0  # where the replies not yet read for repeated text begin
    for number, index in enumerate(responses):
        state = _cut_replies(engine, state, messages[replies : index + 1], replies, observe)
        replies = index + 1
        message = cast("AIMessage", messages[index])
        end = responses[number + 1] if number + 1 < len(responses) else len(messages)
        later = messages[index + 1 : end]
        calls = calls_of(message)
        answers = answers_to(calls, later)
        reports = [m for m in later if is_report(m, message.name)]
        state, decisions = engine.open_batch(state, calls, tokens_of(message))
        last = len(calls) - 1
        for position, (call, answer) in enumerate(zip(calls, answers, strict=True)):
            if answer is None:
                continue  # still running: the live adapter checks it
            state, verdict, checked = engine.check_call(state, call)
            decisions = (*decisions, *checked)
            if isinstance(verdict, Proceed) and not is_marked(answer, BLOCK_MARK):
                handed = handed_over(
                    messages, index, answer, last=position == last, guess=unmarked_handoffs
                )
                result = result_of(
                    answer, engine.config.normalizers(call.tool), tools, args=call.args
                ).carrying(news_of(history, offset + index, reports, handed=handed))
                state, recorded = engine.record_result(state, call, result, earlier)
                decisions = (*decisions, *recorded)
            if observe is not None and decisions:
                observe(call, decisions)
            decisions = ()
        if end < len(messages) or any(
            _delivers_steer(m) for m in later if not is_report(m, message.name)
        ):
            state, _ = engine.take_steer(state)
    return _cut_replies(engine, state, messages[replies:], replies, observe)


def is_report(message: BaseMessage, agent: str | None) -> bool:
    """Whether a message is another agent's report on work handed to it: a reply with no
    tool calls by a named agent other than `agent` (whose response it follows).

    Examples:
        >>> from langchain_core.messages import AIMessage
        >>> is_report(AIMessage("Found A", name="worker"), "supervisor")
        True
        >>> is_report(AIMessage("Done", name="supervisor"), "supervisor")
        False
    """
    return (
        isinstance(message, AIMessage)
        and not message.tool_calls
        and message.name not in (None, agent, GUARD_NAME)
    )


def news_of(
    messages: Sequence[BaseMessage],
    index: int,
    reports: Sequence[BaseMessage] = (),
    *,
    handed: bool,
) -> list[str]:
    """The new work a call of the response `messages[index]` came with from other
    agents: when the call handed the task over (`handed`), what its agent said since
    the task was handed to it (`said_since_handed`); and the reports of the agents that
    worked after it (`reports`).

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> call = {"name": "to_b", "args": {}, "id": "1"}
        >>> history = [HumanMessage("Guess"), AIMessage("Is it  50?", name="a", tool_calls=[call])]
        >>> news_of(history, 1, [AIMessage("Too high", name="b")], handed=True)
        ['is it 50?', 'Too high']
        >>> news_of(history, 1, handed=False)
        []
    """
    news = [str(report.text) for report in reports]
    if handed:
        news[:0] = said_since_handed(messages, index)
    return news


def handoff_news(
    messages: Sequence[BaseMessage], response: AIMessage, answer: ToolMessage
) -> list[str]:
    """What the answer of a call of `response` (a message of `messages`) brings, read as
    a face that records it live reads it: a handoff's (an answer naming where it went,
    `HANDOFF_KEY`) brings what its agent said since it was handed the task; any other
    answer, nothing.

    Examples:
        >>> from langchain_core.messages import AIMessage, ToolMessage
        >>> call = {"name": "to_b", "args": {}, "id": "1"}
        >>> asked = AIMessage("Is it 50?", name="a", tool_calls=[call])
        >>> moved = ToolMessage("ok", tool_call_id="1", response_metadata={HANDOFF_KEY: "b"})
        >>> handoff_news([asked, moved], asked, moved)
        ['is it 50?']
        >>> handoff_news([asked, moved], asked, ToolMessage("ok", tool_call_id="1"))
        []
    """
    handed = HANDOFF_KEY in answer.response_metadata
    for index in range(len(messages) - 1, -1, -1) if handed else ():
        if messages[index] is response:
            return news_of(messages, index, handed=True)
    return news_of([response], 0, handed=handed)


def said_since_handed(messages: Sequence[BaseMessage], index: int) -> list[str]:
    """What the agent of the response `messages[index]` said since it was handed the
    task: the text of its messages back to the last message of another agent (or the
    user's), in order, as `words_of` reads them. Tool results and the guard's steers in
    between are not its words.

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> history = [AIMessage("Too high.", name="b"), AIMessage("Hmm.", name="a")]
        >>> said_since_handed([*history, AIMessage("Is it 25?", name="a")], 2)
        ['hmm.', 'is it 25?']
    """
    agent = messages[index].name
    said: list[str] = []
    for at in range(index, -1, -1):
        message = messages[at]
        if isinstance(message, ToolMessage) or (
            isinstance(message, HumanMessage) and message.name == GUARD_NAME
        ):
            continue
        if not isinstance(message, AIMessage) or message.name != agent:
            break
        words = words_of(message.text)
        if words:
            said.append(words)
    return said[::-1]


def words_of(text: str) -> str:
    """Words an agent said, as the guard compares them: case and whitespace do not make
    words new, nor do the fresh values a result is compared without (times, ids:
    `normalize_fresh`); any other change does, a number above all (the guess of a
    guessing game, a draft's number).

    Examples:
        >>> words_of("  Is it  50? ") == words_of("is it 50?"), words_of("Is it 25?")
        (True, 'is it 25?')
    """
    return normalize_fresh(" ".join(text.split())).casefold()


def handed_over(
    messages: Sequence[BaseMessage],
    index: int,
    answer: ToolMessage,
    *,
    last: bool,
    guess: bool = False,
) -> bool:
    """Whether a call of the response `messages[index]`, answered by `answer`, handed
    the task to another agent: its answer names where to (`HANDOFF_KEY`, which the
    guard's tool hooks write on every handoff they run); or, with `guess`, in a history
    no guard recorded (the offline scan; the answer holds no `STATE_KEY`), it is the
    named agent's last call and the next reply in the history is another agent's.

    Examples:
        >>> from langchain_core.messages import AIMessage, ToolMessage
        >>> call = {"name": "to_b", "args": {}, "id": "1"}
        >>> asked = AIMessage("Is it 50?", name="a", tool_calls=[call])
        >>> moved = ToolMessage("ok", tool_call_id="1")
        >>> after = [asked, moved, AIMessage("Too high.", name="b")]
        >>> handed_over(after, 0, moved, last=True, guess=True)
        True
        >>> handed_over(after, 0, moved, last=True)  # not marked, and no guessing
        False
        >>> again = [asked, moved, AIMessage("More.", name="a")]
        >>> handed_over(again, 0, moved, last=True, guess=True)
        False
    """
    metadata = answer.response_metadata
    if HANDOFF_KEY in metadata:
        return True
    agent = messages[index].name
    if not guess or not last or agent is None or STATE_KEY in metadata:
        return False
    for reply in messages[index + 1 :]:
        if isinstance(reply, AIMessage):
            return reply.name not in (None, agent, GUARD_NAME)
        if not isinstance(reply, ToolMessage):
            return False  # a new request
    return False


def _cut_replies(
    engine: Engine,
    state: RequestState,
    messages: Sequence[BaseMessage],
    offset: int,
    observe: Observer | None,
) -> RequestState:
    """`state` after the replies among `messages` that repeated their own text (cut by
    the guard, or recorded whole); `offset`: where `messages` begin in the history, which
    names a reply that has no id."""
    config = engine.config
    if not config.enabled or not config.detect_repeated_text:
        return state
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        repeats = repeats_in(message, config.repeated_text_chars)
        if repeats is None:
            continue
        reply_id = message.id or f"reply-{offset + index}"
        state, decisions = engine.repeated_text(state, reply_id, repeats, tokens_of(message))
        if decisions and engine.stop_of(state) is None and index + 1 < len(messages):
            state, _ = engine.take_steer(state)  # the model was asked again after it
        if observe is not None and decisions:
            observe(decisions[0].call, decisions)
    return state


def up_to_date(
    engine: Engine,
    state: RequestState | None,
    messages: Sequence[BaseMessage],
    end: int | None = None,
    *,
    tools: Collection[str] | None = None,
    observe: Observer | None = None,
) -> RequestState | None:
    """The state a conversation's history shows, when `state` is not it; else `None`.

    The history is the truth; a state held in memory is a cache that must prove it is
    current. It is, when it has seen the newest model response in the history and
    nothing after that response is news to it. Another process that moved the thread
    on leaves responses, answers or a delivered steer the state has not seen: it
    catches up on them. A new user message starts a new request, rebuilt from the
    history. Only the messages since the newest response the state knows are read, so
    the check costs the same however long the thread is. `end` bounds the history
    (the messages before it), without a copy of it. `observe` gets each call read with
    the decisions it led to (see `replay`).
    """
    end = len(messages) if end is None else end
    earlier = earlier_runs(messages, engine.config.normalizers)
    for index in range(end - 1, -1, -1):
        message = messages[index]
        if message.id is not None and begins_request(messages, index, end):
            if state is None or state.request_id != message.id or state.batch or state.settled:
                # A new request; or a state that has seen responses none of which is in
                # this history (a fork from an earlier checkpoint): not a prefix of it.
                return rebuild(
                    engine, messages[:end], tools=tools, observe=observe, earlier=earlier
                )
            return _caught_up(engine, state, messages, index + 1, end, observe, tools, earlier)
        if message.id is None and is_user_message(message):
            # Not the thread's history, where every message has an id: a model call of
            # another kind on the thread (a middleware's summarizer, say).
            return None
        if (
            state is not None
            and isinstance(message, AIMessage)
            and message.tool_calls
            and engine.declared(state, first_key(message))
        ):
            # From the newest response the state knows (its batch is news only in part).
            return _caught_up(
                engine, state, messages, index, end, observe, tools, earlier, known=True
            )
    # No request start in sight (a summary replaced it): what the state knows stands.
    return (
        None
        if state is not None
        else rebuild(engine, messages[:end], tools=tools, observe=observe, earlier=earlier)
    )


def _caught_up(
    engine: Engine,
    state: RequestState,
    messages: Sequence[BaseMessage],
    start: int,
    end: int,
    observe: Observer | None,
    tools: Collection[str] | None,
    earlier: Earlier,
    *,
    known: bool = False,
) -> RequestState | None:
    """`state` caught up on `messages[start:end]` when they hold news for it (`_news`;
    read past `messages[start]` when it is a response the state knows, `known`); else
    `None`. A handoff's words are read back from all of `messages` (`catch_up`'s
    `history`)."""
    if not _news(state, messages[start + 1 if known else start : end]):
        return None
    return catch_up(
        engine,
        state,
        messages[start:end],
        observe,
        tools=tools,
        earlier=earlier,
        history=messages,
        offset=start,
    )


def _is_response(message: BaseMessage) -> bool:
    """Whether a message is a model response with tool calls: a batch."""
    return isinstance(message, AIMessage) and bool(message.tool_calls)


def _news(state: RequestState, since: Sequence[BaseMessage]) -> bool:
    """Whether messages after what `state` has seen hold news for it: a response it has
    not seen (but the live one, the last message, which the adapters decide), an answer
    it waits for, or the delivery of its pending steer."""
    awaiting: set[str] | None = None  # read only when an answer comes up
    steer_pending = state.steer is not None
    last = len(since) - 1
    for index, message in enumerate(since):
        if steer_pending and _delivers_steer(message):
            return True
        if isinstance(message, AIMessage) and message.tool_calls and index < last:
            return True
        if isinstance(message, ToolMessage):
            if awaiting is None:
                awaiting = {call.id for call in state.awaiting}
            if message.tool_call_id in awaiting:
                return True
    return False


def _delivers_steer(message: BaseMessage) -> bool:
    """Whether a message shows a due steer delivered: the model called again after it,
    a node wrote it as a message, or a tool wrote it into its result."""
    if isinstance(message, AIMessage):
        return True
    if isinstance(message, HumanMessage):
        return message.name == GUARD_NAME
    return is_marked(message, STEER_MARK)


def rebuild(
    engine: Engine,
    messages: Sequence[BaseMessage],
    *,
    tools: Collection[str] | None = None,
    observe: Observer | None = None,
    earlier: Earlier | None = None,
) -> RequestState:
    """The state of the request a conversation's messages end in, rebuilt from them.

    Only the request is replayed, and the last responses of the requests just before it
    give what outlives a request (`_earlier_turns`), so the cost stays flat however long
    the thread is.
    """
    request_id, request = current_request(messages)
    recorded = _newest_record(request, request_id)
    if earlier is None:
        earlier = earlier_runs(messages, engine.config.normalizers)
    start = len(messages) - len(request)
    if recorded is not None:
        response, state = recorded
        return catch_up(
            engine,
            state,
            request[response:],
            observe,
            tools=tools,
            earlier=earlier,
            history=messages,
            offset=start + response,
        )
    before = _earlier_turns(engine, messages[:start], tools, earlier)
    return replay(engine, request_id, request, observe, before=before, tools=tools, earlier=earlier)


def _newest_record(
    request: Sequence[BaseMessage], request_id: str | None
) -> tuple[int, RequestState] | None:
    """The newest state a guarded tool recorded in the request's messages (`STATE_KEY`),
    with the index of the response its result answers; `None` when there is none.

    It is what a live guard knew at that point, so catching up from it decides exactly
    as replaying the whole request, and it still knows what a trimmed history lost (the
    request's start, its early steps). Without a request start in sight, any record
    counts; a record that does not parse is passed over.
    """
    for index in range(len(request) - 1, -1, -1):
        message = request[index]
        record = message.response_metadata.get(STATE_KEY)
        if not isinstance(message, ToolMessage) or not isinstance(record, Mapping):
            continue
        if request_id is not None and record.get("request_id") != request_id:
            continue
        response = index
        while response > 0 and not _is_response(request[response]):
            response -= 1
        try:
            return response, RequestState.from_dict(record)
        except (TypeError, ValueError, KeyError, AttributeError):
            continue  # written by hand, or by another version: the replay stands
    return None


def _earlier_turns(
    engine: Engine,
    earlier: Sequence[BaseMessage],
    tools: Collection[str] | None,
    runs: Earlier,
) -> RequestState | None:
    """A state as the `earlier` requests left the conversation: what each of the last
    `TURNS_KEPT` that ran tools counted (repeats across user turns, `RequestState.turns`)
    and the changes made.

    Each request is replayed from its last `engine.memory` responses, as the request it
    was: the steps a turn remembers are among its last counted ones, so the cost stays
    flat however long the thread is.
    """
    if not engine.config.detect_interleaved:
        return None
    requests: list[Sequence[BaseMessage]] = []
    end = index = len(earlier)
    while index > 0 and len(requests) < TURNS_KEPT:
        index -= 1
        if index == 0 or begins_request(earlier, index, end):
            if any(isinstance(m, AIMessage) and m.tool_calls for m in earlier[index:end]):
                requests.append(earlier[index:end])
            end = index
    state = None
    for request in reversed(requests):
        state = _replay_tail(engine, request, state, tools, runs)
    return state


def _replay_tail(
    engine: Engine,
    request: Sequence[BaseMessage],
    before: RequestState | None,
    tools: Collection[str] | None,
    earlier: Earlier,
) -> RequestState:
    """A finished request replayed from enough of its last responses to count its last
    `engine.memory` steps: some responses count none (blocked, ignored), so the look
    back widens until they are found or the request starts."""
    wanted = engine.memory
    while True:
        start, found = len(request), 0
        while start > 0 and found < wanted:
            start -= 1
            message = request[start]
            found += isinstance(message, AIMessage) and bool(message.tool_calls)
        state = engine.start_request(before, None, question_of(request))
        state = catch_up(
            engine,
            state,
            request[start:],
            tools=tools,
            earlier=earlier,
            history=request,
            offset=start,
        )
        if start == 0 or state.counted >= engine.memory:
            return state
        wanted *= 2
