"""Reading LangChain messages and tool outputs into the engine's terms, and writing the
guard's own messages back (its events: `_langchain_sink.py`). A pure codec: it knows
no guard.

Shared by every adapter, so each one reads a response's calls and a tool's result the
same way (conversations: `_conversation.py`; requests and replays: `_history.py`; what
the adapters do with the guard around a batch's results and runs: `_faces.py`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, NamedTuple, cast, get_args

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE
from langgraph.types import Command

from loop_guard import _messages
from loop_guard._config import Normalizer
from loop_guard._fingerprint import result_fingerprint
from loop_guard._messages import GUARD_NAME
from loop_guard._values import REPORTED_HEAD, Call, Result, Stop, reports_error
from loop_guard._volatile import mask_named_ids, normalize_fresh, normalize_made

STEER_MARK = "steer"
"""`response_metadata["loop_guard"]` of a tool result that carries the steer in-band."""

BLOCK_MARK = "blocked"
"""`response_metadata["loop_guard"]` of a tool result written by the guard instead of a run."""

DUPLICATE_MARK = "duplicate"
"""`response_metadata["loop_guard"]` of the shared result of an identical sibling."""

FINAL_ANSWER_MARK = "final_answer"
"""`response_metadata["loop_guard"]` of a stopped request's last words with
`exit_behavior="answer"`: the guard's request for the model's answer, and the answer."""

RESULT_KEY = "loop_guard_result"
"""`response_metadata` key of a steered tool result: the fingerprint of what the tool returned."""
_VARIANT = "~"  # in a `RESULT_KEY` record, between the fingerprint and the variant
_REPORTED = "!"  # opens a `RESULT_KEY` record of an error read off the result's text
_UNMASKED = "="  # closes a `RESULT_KEY` record with the fingerprint of the result as returned


def result_record(result: Result) -> str:
    """A result as a steered or shared message keeps it (`RESULT_KEY`), for `result_of`
    to read back as the same result: its fingerprint, its variant, whether it is an
    error the text reported (the message's status does not say so), and, for a result
    read unmasked (`Result.masked`), the fingerprint it had as returned."""
    unmasked = ""
    if result.masked is not None:
        exact, result = result.fingerprint, result.masked()
        unmasked = f"{_UNMASKED}{exact}" if exact != result.fingerprint else ""
    record = f"{_REPORTED}{result.fingerprint}" if result.error_reported else result.fingerprint
    return f"{record}{_VARIANT}{result.variant}{unmasked}" if result.variant else record + unmasked


STATE_KEY = "loop_guard_state"
"""`response_metadata` key of a guarded tool's result: the conversation's state once the
result was recorded (`RequestState.to_dict`), which outlives a history cut short."""


def calls_of(message: AIMessage) -> tuple[Call, ...]:
    """The engine's calls for a model response, in the model's order (see `call_at`).

    Each response is read once: the faces that look at the same response object (the
    handler, the wrapped tools, the node, in one process) share its calls, so every
    call's args are fingerprinted once.
    """
    tool_calls = message.tool_calls
    # Read without the lock: a dict lookup is atomic, and an entry is never changed.
    found = _read.get(id(message))
    # The same message, its calls not replaced since (human approval edits them).
    if found is not None and found[0] is message and found[1] is tool_calls:
        return found[2]
    calls = tuple(call_at(message, position) for position in range(len(tool_calls)))
    with _read_lock:
        _read[id(message)] = (message, tool_calls, calls)  # held: its id stays its own
        if len(_read) > _READ_KEPT:
            _read.popitem(last=False)
    return calls


def tokens_of(
    message: AIMessage, count: Literal["total_tokens", "input_tokens"] = "total_tokens"
) -> int:
    """The tokens a model response cost, by its `usage_metadata` (0 when it has none);
    `count` names which (`"input_tokens"`: those of what the model was sent).

    Examples:
        >>> usage = {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}
        >>> tokens_of(AIMessage("", usage_metadata=usage)), tokens_of(AIMessage(""))
        (150, 0)
        >>> tokens_of(AIMessage("", usage_metadata=usage), "input_tokens")
        120
    """
    usage = message.usage_metadata
    try:
        return max(int(usage.get(count) or 0), 0) if usage else 0
    except (TypeError, ValueError):  # a provider's malformed usage: not counted
        return 0


_READ_KEPT = 256  # responses whose calls are kept: the live ones of many conversations
_read: OrderedDict[int, tuple[AIMessage, list[ToolCall], tuple[Call, ...]]] = OrderedDict()
_read_lock = threading.Lock()


def call_at(message: AIMessage, position: int) -> Call:
    """The engine's call for the tool call at `position` in a model response.

    It is keyed by the response's id and its position in it, never by its tool-call id
    alone: some providers give every turn's call the same id (`call_0`, or none). A
    response without an id (outside any graph) keys its calls by their ids.
    """
    tool_call = message.tool_calls[position]
    return Call.of(
        tool_call["name"],
        tool_call.get("args", {}),
        id=tool_call.get("id") or "",
        key=f"{message.id}#{position}" if message.id else None,
    )


def first_key(message: AIMessage) -> str:
    """The `Call.key` of a model response's first call: enough to tell the response."""
    return f"{message.id}#0" if message.id else call_at(message, 0).key


def keys_of(message: AIMessage) -> list[str]:
    """The `Call.key`s of a model response's calls, without fingerprinting their args."""
    if message.id:
        return [f"{message.id}#{position}" for position in range(len(message.tool_calls))]
    return [call.key for call in calls_of(message)]


def call_keys(messages: Sequence[BaseMessage]) -> dict[str, str]:
    """The key of each call of the last two model responses with calls, by its tool-call
    id: the responses of a snapshot's open and settled batches, which snapshots older
    than keys by response and position name by tool-call id (`_state.migrate`)."""
    keys: dict[str, str] = {}
    responses = 0
    for message in reversed(messages):
        if responses == 2:
            break
        if isinstance(message, AIMessage) and message.tool_calls:
            responses += 1
            for tool_call, key in zip(message.tool_calls, keys_of(message), strict=True):
                keys.setdefault(tool_call.get("id") or key, key)  # the later response wins
    return keys


def position_of(
    message: AIMessage, tool_call_id: str | None, name: str, args: Any = None
) -> int | None:
    """Where the tool call with this id and tool name sits in a model response.

    A provider may give several calls of one response the same id (or none): then the
    one with these `args` is it (identical calls are alike, whichever is taken).
    """
    found = [
        position
        for position, tool_call in enumerate(message.tool_calls)
        if (tool_call.get("id") or "") == (tool_call_id or "") and tool_call["name"] == name
    ]
    if len(found) > 1 and args is not None:
        return next((p for p in found if message.tool_calls[p].get("args") == args), found[0])
    return found[0] if found else None


def answers_to(calls: Sequence[Call], answers: Sequence[BaseMessage]) -> list[ToolMessage | None]:
    """Each call's answer among the tool messages that follow its response, or `None`.

    Paired by tool-call id, in order: a provider may repeat one id within a response,
    and the tool node answers its calls in their order.
    """
    waiting: dict[str, list[ToolMessage]] = {}
    for answer in answers:
        if isinstance(answer, ToolMessage):
            waiting.setdefault(answer.tool_call_id, []).append(answer)
    found: list[ToolMessage | None] = []
    for call in calls:
        queue = waiting.get(call.id)
        found.append(queue.pop(0) if queue else None)
    return found


def result_of(
    output: Any,
    normalizers: Sequence[Normalizer] = (),
    tools: Collection[str] | None = None,
    *,
    args: Any = None,
) -> Result:
    """The engine's `Result` for what a tool produced.

    A `ToolMessage` (what agents see), a `Command` (its tool message), or a raw return
    value (a tool invoked without a tool call). `normalizers` rewrite the result's
    text before it is fingerprinted (`LoopGuardConfig.normalizers`). `tools` are the
    names of the tools that exist, when the caller knows them: only then can a result
    be the tool node's answer to a call naming none of them (see `_available_tools`).
    An error is compared with the call's `args` masked where it quotes them, so a tool
    failing the same way for every input is one error ("Plan P1006 not found").
    """
    if isinstance(output, ToolMessage):
        is_error = output.status == "error"
        recorded = output.response_metadata.get(RESULT_KEY)
        if isinstance(recorded, str):  # a steered result: what the tool itself returned
            recorded, _, exact = recorded.partition(_UNMASKED)
            fingerprint, _, variant = recorded.partition(_VARIANT)
            reported = fingerprint.startswith(_REPORTED)
            masked = Result(
                fingerprint=fingerprint.removeprefix(_REPORTED),
                is_error=is_error or reported,
                variant=variant,
                error_reported=reported and not is_error,
            )
            return (
                replace(masked, fingerprint=exact, variant="", masked=lambda: masked)
                if exact
                else masked
            )
        content = output.content
        fresh, normalizers = _fresh_last(normalizers)
        # The id the model gave the call is no part of what happened: an answer that quotes
        # it (a human's rejection does) is the same answer for every call. A successful
        # result is searched for it whole only when its call recurs (`_unmasked`), unless
        # it is compared at once, rewritten first, or quotes it where an error would show.
        call_id = output.tool_call_id if isinstance(content, str) else ""
        if call_id and (
            is_error or fresh is None or normalizers or call_id in content[: _id_head(call_id)]
        ):
            content, call_id = _without_id(content, call_id), ""
        content = _normalized(content, normalizers)
        if is_error or reports_error(content):
            # An error is compared with other calls' errors (the same error, whatever
            # the args): masked at once.
            content = _without_id(content, call_id)
            content, variant = _masked(content, fresh)
            content, variant = _without_args(content, args, variant)
            available = _available_tools(output, tools) if is_error else None
            return Result.of(content, is_error=is_error, available_tools=available, variant=variant)
        return _unmasked(content, fresh, call_id, args)
    if isinstance(output, Command):
        message = tool_message_of(output)
        if message is not None:
            return result_of(message, normalizers, tools, args=args)
        return Result.of({"command": repr(output.update), "goto": repr(output.goto)})
    fresh, normalizers = _fresh_last(normalizers)
    return _unmasked(_normalized(output, normalizers), fresh)


_FRESH = (normalize_fresh, normalize_made)  # the normalizers whose masking marks a near-repeat


def _fresh_last(
    normalizers: Sequence[Normalizer],
) -> tuple[Normalizer | None, Sequence[Normalizer]]:
    """The last of `normalizers` when it masks fresh values (`normalize_fresh`,
    `normalize_made`: what it masks marks a near-repeat), and the others."""
    if normalizers and normalizers[-1] in _FRESH:
        return normalizers[-1], normalizers[:-1]
    return None, normalizers


def _unmasked(
    content: Any, fresh: Normalizer | None, call_id: str = "", args: Any = None
) -> Result:
    """The result of `content`, its fresh values (and the call's id, `call_id`, where it
    quotes it) left for `Result.masked` to mask with `fresh`: passes over the text that the
    engine asks for only when the call recurs. Then the ids a JSON answer names that the
    call (`args`) did not ask for are fresh too (`mask_named_ids`): two receipts of the
    same send differ only in what each send made."""
    if fresh is None:
        return Result.of(content)

    def masked() -> Result:
        found, variant = _masked(_without_id(content, call_id), fresh)
        if isinstance(found, str):
            named = mask_named_ids(found, _asked(args))
            if named != found:
                found, variant = named, variant or result_fingerprint(content)[:16]
        return Result.of(found, variant=variant)

    return Result.of(content, masked=masked)


def _asked(args: Any) -> frozenset[str]:
    """Every scalar value of a call's arguments, as text."""
    return frozenset(map(str, _arg_values(args)))


def _without_id(content: Any, call_id: str) -> Any:
    """The content with the call's id, where it quotes it, written `<tool_call_id>` (one
    search: `str.replace` hands back the text itself when it quotes none)."""
    return content.replace(call_id, "<tool_call_id>") if call_id else content


def _id_head(call_id: str) -> int:
    """How much of a result's text holds every quote of `call_id` that moves its first
    64 characters (what `reports_error` reads) once replaced: a replacement shortens the
    text by less than the id's length, so a quote past this point stays past them."""
    return REPORTED_HEAD * (len(call_id) + 1)


def _masked(content: Any, fresh: Normalizer | None) -> tuple[Any, str]:
    """The content with its fresh values masked by `fresh`, and its variant
    (`Result.variant`) when anything was masked."""
    if fresh is None:
        return content, ""
    masked = _normalized(content, (fresh,))
    if masked == content:
        return content, ""
    return masked, result_fingerprint(content)[:16]


_ARGS_MASKED = 20  # quoted argument values masked in an error, at most
_ARG_LENGTH = 200  # longest argument value looked for


def _without_args(content: Any, args: Any, variant: str) -> tuple[Any, str]:
    """An error's content with the call's argument values it quotes masked, and its
    variant (`Result.variant`): the error as returned, when anything was masked."""
    quoted = _arg_texts(args)
    if not quoted:
        return content, variant
    masked = _normalized(content, (lambda text: _masking(text, quoted),))
    if masked == content:
        return content, variant
    return masked, variant or result_fingerprint(content, is_error=True)[:16]


def _masking(text: str, quoted: Sequence[str]) -> str:
    for value in quoted:
        text = text.replace(value, "<arg>")
    return text


def _arg_texts(args: Any) -> list[str]:
    """The argument values an error may quote: strings of 3 characters or more and
    numbers of 3 digits or more, longest first (a value inside another goes after it)."""
    found: set[str] = set()
    for value in _arg_values(args):
        if len(found) >= _ARGS_MASKED:
            break
        if isinstance(value, bool) or not isinstance(value, int | str):
            continue
        text = str(value) if isinstance(value, str) or abs(value) < 10**_ARG_LENGTH else ""
        if 3 <= len(text.strip()) <= _ARG_LENGTH:
            found.add(text)
    return sorted(found, key=len, reverse=True)


def _arg_values(args: Any) -> Iterator[object]:
    """The scalar values of a call's arguments, at every depth (`None` left out)."""
    stack = [args]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif value is not None:
            yield value


def earlier_runs(
    messages: Sequence[BaseMessage], normalizers: Callable[[str], Sequence[Normalizer]]
) -> Callable[[Call], Iterator[Result]]:
    """What earlier runs of a call returned, as a history shows them (`Engine.Earlier`):
    the results of the calls in `messages` with its tool and args, newest first, each
    read with its tool's `normalizers` as `result_of` reads a live one (a block is none).

    Only the responses that call the same tool have their args fingerprinted.
    """

    def runs(call: Call) -> Iterator[Result]:
        answers: list[BaseMessage] = []  # the tool messages after the response reached
        for message in reversed(messages):
            if isinstance(message, ToolMessage):
                answers.append(message)
                continue
            if not isinstance(message, AIMessage) or not message.tool_calls:
                continue
            if any(tool_call["name"] == call.tool for tool_call in message.tool_calls):
                calls = calls_of(message)
                for run, answer in zip(calls, answers_to(calls, answers[::-1]), strict=True):
                    if run == call and answer is not None and not is_marked(answer, BLOCK_MARK):
                        yield result_of(answer, normalizers(call.tool), args=run.args)
            answers = []

    return runs


def tool_message_of(output: Any) -> ToolMessage | None:
    """The tool message of a tool's output: itself, or the last one a `Command` adds."""
    if isinstance(output, ToolMessage):
        return output
    if isinstance(output, Command) and isinstance(output.update, dict):
        found = [m for m in output.update.get("messages", ()) if isinstance(m, ToolMessage)]
        return found[-1] if found else None
    return None


HANDOFF_KEY = "__handoff_destination"
"""Where a handoff names the agent it goes to: in its tool's `metadata`
(`langgraph-swarm`, `langgraph-supervisor`) and in its answer's `response_metadata`
(`langgraph-supervisor`; the guard's tool hooks write it on every handoff they run,
`as_handoff`)."""


def hands_over(output: Any) -> bool:
    """Whether a tool's output hands the run to another agent: a `Command` that goes to
    another node (a swarm's or a supervisor's handoff), or an answer that names where it
    went (`HANDOFF_KEY`). Its result is what the history shows (what the agent said
    beside it, the reports of the agent it went to: `_history.news_of`), so the live
    faces leave it to be read from there.

    Examples:
        >>> from langgraph.types import Command
        >>> hands_over(Command(goto="bob", graph=Command.PARENT)), hands_over("ok")
        (True, False)
    """
    if isinstance(output, Command) and output.goto:
        return True
    message = tool_message_of(output)
    return message is not None and HANDOFF_KEY in message.response_metadata


def as_handoff(output: Any, tool_metadata: Mapping[str, Any] | None) -> Any:
    """A tool's output with its answer naming the agent it hands over to (`HANDOFF_KEY`),
    when the tool is a handoff: its metadata names the agent, or its `Command` goes to
    another node. The history then tells a handoff from any other call, in a process
    that never saw the tool (`_history.news_of`). Any other output is returned as is.

    Examples:
        >>> from langchain_core.messages import ToolMessage
        >>> moved = as_handoff(ToolMessage("ok", tool_call_id="1"), {HANDOFF_KEY: "bob"})
        >>> moved.response_metadata[HANDOFF_KEY]
        'bob'
        >>> as_handoff("ok", None)
        'ok'
    """
    destination = (tool_metadata or {}).get(HANDOFF_KEY)
    if destination is None and isinstance(output, Command) and output.goto:
        goto = output.goto
        destination = goto if isinstance(goto, str) else str(getattr(goto, "node", goto))
    if destination is None:
        return output

    def marked(message: ToolMessage) -> ToolMessage:
        if HANDOFF_KEY in message.response_metadata:
            return message
        metadata = {**message.response_metadata, HANDOFF_KEY: str(destination)}
        return message.model_copy(update={"response_metadata": metadata})

    if isinstance(output, ToolMessage):
        return marked(output)
    return with_tool_message(output, marked) if isinstance(output, Command) else output


def with_tool_message(
    output: Command[Any], rewrite: Callable[[ToolMessage], ToolMessage]
) -> Command[Any]:
    """A tool's `Command` with its tool message (`tool_message_of`) rewritten."""
    found = tool_message_of(output)
    if found is None or not isinstance(output.update, dict):
        return output
    messages = [rewrite(m) if m is found else m for m in output.update["messages"]]
    return Command(
        graph=output.graph,
        update={**output.update, "messages": messages},
        resume=output.resume,
        goto=output.goto,
    )


def duplicate_of(
    output: Any, original: Call, call_id: str, normalizers: Sequence[Normalizer] = ()
) -> ToolMessage | None:
    """The answer of an identical sibling that did not run: its original's tool message,
    marked as a duplicate; `None` when the original's output has no tool message.

    It keeps the fingerprint of the original's result, so it counts as the same result.
    """
    message = tool_message_of(output)
    if message is None:
        return None
    note = _messages.duplicate_text(original.id)
    content = message.content
    shared = f"{note}\n\n{content}" if isinstance(content, str) else [note, *content]
    metadata = {
        **message.response_metadata,
        "loop_guard": DUPLICATE_MARK,
        RESULT_KEY: result_record(result_of(message, normalizers, args=original.args)),
    }
    return message.model_copy(
        update={
            "content": shared,
            "tool_call_id": call_id,
            "id": None,
            "response_metadata": metadata,
        }
    )


# How the tool node's answer to a call naming a tool it does not have begins.
_UNKNOWN_TOOL_OPENING = INVALID_TOOL_NAME_ERROR_TEMPLATE.partition("{available_tools}")[0]


def _available_tools(message: ToolMessage, tools: Collection[str] | None) -> tuple[str, ...] | None:
    """The tools that exist, when this error answers a call naming none of them.

    Told by the call's name (the tool node names its answer after the call): it is none
    of `tools`. The text only confirms that the tool node wrote the answer; it never
    says which tools exist, since a tool's error can say anything (a fetched page
    quoting the tool node's words, say). Without `tools` no call counts as one to a
    missing tool: it is an erroring call like any other.
    """
    name = message.name
    if tools is None or not name or name in tools or not isinstance(message.content, str):
        return None
    if not message.content.startswith(_UNKNOWN_TOOL_OPENING.format(requested_tool=name)):
        return None
    return tuple(sorted(tools))  # one order, whatever order the names came in


def _normalized(content: Any, normalizers: Sequence[Normalizer]) -> Any:
    """The content with every text part rewritten by each normalizer in turn."""
    if not normalizers:
        return content
    if isinstance(content, str):
        for normalize in normalizers:
            content = normalize(content)
        return content
    if isinstance(content, list):
        return [
            {**block, "text": _normalized(block["text"], normalizers)}
            if isinstance(block, dict) and isinstance(block.get("text"), str)
            else _normalized(block, normalizers)
            if isinstance(block, str)
            else block
            for block in content
        ]
    return content


def error_result(error: BaseException, args: Any = None) -> Result | None:
    """The `Result` of a tool that raised: an error with the exception's type and text.

    `None` when the exception is control flow, not a failure of the tool: LangGraph's
    bubble-ups (`interrupt()`, `Command(graph=Command.PARENT)`), cancellation, an exit.
    The call has no result yet: run again (a resume, a re-run), it is counted then, with
    what it returns. A tool's own `TimeoutError` is an `Exception`, so a failure.
    """
    if isinstance(error, GraphBubbleUp) or not isinstance(error, Exception):
        return None
    content, variant = _without_args(f"{type(error).__name__}: {error}", args, "")
    return Result.of(content, is_error=True, variant=variant)


def last_batch(messages: Sequence[BaseMessage]) -> tuple[AIMessage | None, list[ToolMessage]]:
    """The last AI message and the tool messages after it."""
    answers: list[ToolMessage] = []
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message, answers[::-1]
        if isinstance(message, ToolMessage):
            answers.append(message)
    return None, answers[::-1]


def block_message(tool_call_id: str, tool: str, text: str) -> ToolMessage:
    """The error tool result the guard writes for a call it did not let run."""
    return ToolMessage(
        content=text,
        tool_call_id=tool_call_id,
        name=tool,
        status="error",
        response_metadata={"loop_guard": BLOCK_MARK},
    )


def stop_messages(
    ai_message: AIMessage | None, answered: Sequence[bool], stop: Stop
) -> list[ToolMessage | AIMessage]:
    """How a stopped request ends: every unanswered call of the last response (`answered`
    says which are, by position) gets a "not run" result, then a final message tells the
    user why (the history stays valid).
    """
    pending = [
        block_message(tool_call["id"] or "", tool_call["name"], _messages.not_run_text())
        for tool_call, done in zip(
            ai_message.tool_calls if ai_message is not None else (), answered, strict=True
        )
        if not done
    ]
    return [*pending, AIMessage(content=stop.message, name=GUARD_NAME)]


Choice = Literal["allow", "raise", "stop", "answer"]
"""What a person decided when asked about a loop (`ask_request`)."""

_RESULT_SHOWN = 500  # characters of the repeated result shown to the person
_CHOICE_OF_DECISION: dict[str, Choice] = {
    "approve": "allow",
    "edit": "raise",
    "respond": "raise",
    "reject": "stop",
}


class PersonDecision(NamedTuple):
    """A person's answer to `ask_request`, read as `HumanInTheLoopMiddleware` reads its own
    decisions: `edited`, the call an `edit` runs instead (its tool and arguments); `message`,
    a `reject`'s reason or a `respond`'s answer in the tool's place."""

    choice: Choice
    edited: tuple[str, dict[str, Any]] | None = None
    message: str | None = None
    responded: bool = False


def ask_request(stop: Stop, call: Call, result: str | None) -> dict[str, Any]:
    """The interrupt's value when a person is asked about a loop: a `HumanInTheLoopMiddleware`
    request (one action: the blocked call; approve, edit or reject), so the UIs that show
    those show it, and the loop's facts under `"loop_guard"` for programs."""
    shown = None if result is None else result[:_RESULT_SHOWN]
    args = call.args if isinstance(call.args, dict) else {"input": call.args}
    return {
        "action_requests": [
            {
                "name": call.tool,
                "args": args,
                "description": _messages.ask_text(call.tool, stop.streak, stop.blocks, shown),
            }
        ],
        "review_configs": [
            {"action_name": call.tool, "allowed_decisions": ["approve", "edit", "reject"]}
        ],
        "loop_guard": {
            "reason": stop.reason,
            "tool": call.tool,
            "args": args,
            "tool_call_id": call.id,
            "streak": stop.streak,
            "blocks": stop.blocks,
            "result": shown,
            "choices": ["allow", "raise", "stop", "answer"],
        },
    }


def decision_of(answer: object) -> PersonDecision | None:
    """A person's answer to `ask_request`: a `HumanInTheLoopMiddleware` response
    (`{"decisions": [{"type": "approve"}]}`: approve allows the call once more, edit runs
    the edited call with the limits raised, respond answers in the tool's place with the
    limits raised, reject stops), one decision, or a choice by name; `None` when it is
    none of these.

    Examples:
        >>> edit = {"type": "edit", "edited_action": {"name": "ls", "args": {"path": "b"}}}
        >>> decision_of({"decisions": [edit]}).edited, decision_of("stop").choice
        (('ls', {'path': 'b'}), 'stop')
    """
    if isinstance(answer, str):
        return PersonDecision(cast("Choice", answer)) if answer in get_args(Choice) else None
    if not isinstance(answer, Mapping):
        return None
    decisions = answer.get("decisions")
    if isinstance(decisions, Sequence) and decisions and isinstance(decisions[0], Mapping):
        answer = decisions[0]
    kind = answer.get("type")
    choice = _CHOICE_OF_DECISION.get(kind) if isinstance(kind, str) else None
    if choice is None:
        return None
    message = answer.get("message")
    message = message if isinstance(message, str) and message else None
    action = answer.get("edited_action")
    edited = None
    if kind == "edit" and isinstance(action, Mapping):
        name, args = action.get("name"), action.get("args")
        if isinstance(name, str) and isinstance(args, Mapping):
            edited = (name, dict(args))
    return PersonDecision(choice, edited, message, responded=kind == "respond")


def repeated_result(messages: Sequence[BaseMessage], tool: str) -> str | None:
    """The text of the last result `tool` returned in `messages` (a block is none)."""
    for message in reversed(messages):
        if (
            isinstance(message, ToolMessage)
            and message.name == tool
            and not is_marked(message, BLOCK_MARK)
        ):
            return message.text
    return None


def answer_request(stop: Stop) -> HumanMessage:
    """What the model is sent when a stopped request is to end with its own answer."""
    return HumanMessage(
        content=_messages.final_answer_request_text(stop.call.tool),
        name=GUARD_NAME,
        response_metadata={"loop_guard": FINAL_ANSWER_MARK},
    )


def final_answer(reply: object) -> AIMessage | None:
    """The model's reply to `answer_request` as the request's last message (named and
    marked as the guard's), or `None` when it cannot end the request: it calls a tool,
    says nothing, or is no AI message."""
    if (
        not isinstance(reply, AIMessage)
        or reply.tool_calls
        or reply.invalid_tool_calls
        or not reply.text.strip()
    ):
        return None
    metadata = {**reply.response_metadata, "loop_guard": FINAL_ANSWER_MARK}
    return reply.model_copy(update={"name": GUARD_NAME, "response_metadata": metadata})


def text_of(content: Any) -> str:
    """The text of a message's (or a chunk's) content: a string, or its text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        text = block if isinstance(block, str) else block_text(block)
        if text is not None:
            parts.append(text)
    return "".join(parts)


def block_text(block: object) -> str | None:
    """The text of a content block that is text (`{"type": "text", "text": ...}`), else
    `None` (reasoning, thinking, tool use, images)."""
    if not isinstance(block, dict) or block.get("type") != "text":
        return None
    text = block.get("text")
    return text if isinstance(text, str) else None


def messages_of(state: Any, key: str = "messages") -> Sequence[BaseMessage]:
    """The messages of a graph state: a `MessagesState`-like mapping, object or list."""
    messages = state.get(key, ()) if isinstance(state, Mapping) else getattr(state, key, state)
    return messages if isinstance(messages, Sequence) else ()


def is_marked(message: BaseMessage, mark: str) -> bool:
    """Whether the guard marked this message (`BLOCK_MARK` or `STEER_MARK`)."""
    return message.response_metadata.get("loop_guard") == mark


def tool_names(tools: Iterable[Any]) -> frozenset[str]:
    """The names of the tools a model request offers: tools, and tools as provider dicts
    (`{"name": ...}` or OpenAI's `{"function": {"name": ...}}`)."""
    names = set()
    for given in tools:
        if isinstance(given, Mapping):
            function = given.get("function")
            name = given.get("name") or (
                function.get("name") if isinstance(function, Mapping) else None
            )
        else:
            name = getattr(given, "name", None)
        if isinstance(name, str) and name:
            names.add(name)
    return frozenset(names)
