"""Every text the guard writes, in one place.

Two audiences: steer and block texts go to the model (imperative: the tool, the count,
what to do instead); stop texts go to the user (why the request ended).
"""

from __future__ import annotations

import json
import re

GUARD_NAME = "loop_guard"
"""The `name` of every message the guard inserts, so it is recognisable in a history."""

REPLY = "(reply)"
"""The `tool` of a decision about the model's reply itself, not about a tool call: a
reply cut for repeating its own text (reason `'repeated_text'`; see Repeated text).

Examples:
    >>> from loop_guard import LoopGuard
    >>> events = []
    >>> session = LoopGuard(on_event=events.append).session("thread-1")
    >>> _ = session.repeated_text("reply-1", repeats=40)
    >>> events[0].tool == REPLY, events[0].reason
    (True, 'repeated_text')
"""


_NEAR = " (only ids, times or counters in it changed)"


def repeat_steer_text(tool: str, streak: int, *, near: bool = False) -> str:
    """The steer message the model sees once per streak, before its next call; `near`
    for a streak of results equal only once their fresh values are masked."""
    return (
        f"LOOP GUARD: you have called {_code(tool)} {streak} times in a row with the same "
        f"arguments and got the same result every time{_NEAR if near else ''}. Repeating "
        "it will not change the "
        "result. Stop repeating this call: change your approach (different arguments or a "
        "different tool), or give your final answer with what you already have."
    )


def repeat_block_text(tool: str, streak: int, *, near: bool = False) -> str:
    """The error result the model gets instead of running a blocked call."""
    return (
        f"{_blocked(tool)} You already called it {streak} times in a row with these exact "
        f"arguments and got the same result each time{_NEAR if near else ''}. Do not call "
        "it again with the same "
        "arguments; use the result you already have, try a different approach, or give "
        "your final answer."
    )


def withheld_text(tool: str, block_message: str) -> str:
    """The result of a call the guard blocked only after it ran, with the block's reason.

    A tool outside the guard's wrappers has already run, so the model is told its result
    is withheld, not that it was not run.
    """
    opening = _blocked(tool)
    reason = block_message.removeprefix(opening) if block_message.startswith(opening) else ""
    return f"LOOP GUARD: the result of this {_code(tool)} call is withheld.{reason}"


def withheld_after_stop_text(tool: str) -> str:
    """The result of a call that ran after the request had been stopped."""
    return (
        f"LOOP GUARD: the result of this {_code(tool)} call is withheld, because the request was "
        "stopped by the loop guard."
    )


def not_run_text() -> str:
    """The result of a pending call that the guard's stop left unexecuted."""
    return "LOOP GUARD: not run, because the request was stopped by the loop guard."


def stop_text(tool: str, blocks: int) -> str:
    """The final message to the user when `abort_threshold` calls were blocked."""
    return (
        f"Stopped by loop_guard: the agent kept calling {_code(tool)} with the same arguments "
        f"and getting the same result, and ignored {blocks} blocked attempts. The request "
        "was ended to avoid wasting further calls; try rephrasing it or check the tool."
    )


def batch_stop_text(tool: str) -> str:
    """The final message to the user when a fully blocked batch ends the request
    (`use_terminate`)."""
    return (
        f"Stopped by loop_guard: the agent repeated {_code(tool)} with the same arguments and "
        "the same result, so the repeated call was blocked and the request ended."
    )


def ask_text(tool: str, streak: int, blocks: int, result: str | None) -> str:
    """What a person is asked when the guard would stop the request (`exit_behavior="ask"`)."""
    seen = "" if result is None else f" It returned: {result}"
    return (
        f"loop_guard would stop this request: the agent called {_code(tool)} {streak} times "
        f"in a row with the same arguments and got the same result, and {blocks} of its "
        f"calls were blocked.{seen}\n"
        "Approve: let this call run once more. Edit: run the edited call and keep going, "
        "with the guard's limits raised for this request. Reject: stop now (a message goes "
        "to the agent, which answers from what it has)."
    )


def rejected_text(tool: str, reason: str) -> str:
    """A call a person rejected with a reason, in `HumanInTheLoopMiddleware`'s words."""
    return f"User rejected the tool call for {_code(tool)} with reason: {reason}"


def edited_text(tool: str, args: str) -> str:
    """What the model is told when a person edited the call it made: what ran instead."""
    return f"A reviewer edited this call. Executed instead: {_code(tool)} with arguments {args}."


def edited_missing_text(tool: str) -> str:
    """A call a person edited to name a tool the agent does not have."""
    return f"A reviewer edited this call to {_code(tool)}, which is not a tool of this agent."


def final_answer_request_text(tool: str) -> str:
    """What the model is told when the request is stopped and it is asked to answer."""
    if tool == REPLY:
        return (
            "LOOP GUARD: this request was stopped, because your replies kept repeating the "
            "same text. No tool can be called any more. Answer the user now, briefly and "
            "without repeating yourself: what you found, what you could not finish, and why."
        )
    return (
        f"LOOP GUARD: this request was stopped, because you kept calling {_code(tool)} with "
        "the same arguments and getting the same result. No tool can be called any more. "
        "Answer the user now, from what you already have: what you found, what you could "
        "not finish, and why."
    )


def side_by_side_steer_text(tools: tuple[str, ...], batches: int) -> str:
    """The steer message for calls the model makes side by side in every reply, each with
    the same arguments and the same result."""
    return (
        f"LOOP GUARD: in each of your last {batches} replies you called {_names(tools)} "
        "with the same arguments and got the same results every time. Repeating them will "
        "not change the results. Stop repeating these calls: change your approach "
        "(different arguments or a different tool), or give your final answer with what "
        "you already have."
    )


def cycle_steer_text(tools: list[str], laps: int) -> str:
    """The steer message for a cycle: the same few calls, round and round."""
    return (
        f"LOOP GUARD: you are going round in a cycle: {_sequence(tools)}, {laps} times over "
        "with the same arguments and the same results every lap. Another lap will not "
        "change anything. Break the cycle: act on what these calls already told you, try a "
        "different approach, or give your final answer."
    )


def cycle_block_text(tool: str, tools: list[str], laps: int) -> str:
    """The error result of a call that would continue a cycle past the block threshold."""
    return (
        f"{_blocked(tool)} It would go on with a cycle ({_sequence(tools)}) that returned "
        f"the same results {laps} times over. Use the results you already have, try a "
        "different approach, or give your final answer."
    )


def interleaved_steer_text(tool: str, count: int, window: int) -> str:
    """The steer message for a call that keeps coming back between other calls."""
    return (
        f"LOOP GUARD: you have made this exact {_code(tool)} call {count} times within your last "
        f"{window} tool calls and got the same result every time. Calling it again will "
        "not change the result. Use the result you already have, fix what makes it fail, "
        "or try a different approach."
    )


def across_turns_steer_text(tool: str, turns: int) -> str:
    """The steer message for a call that comes back in one user turn after another."""
    return (
        f"LOOP GUARD: you have made this exact {_code(tool)} call in {turns} of your last "
        "turns and got the same result every time. Calling it again will not "
        "change the result. Use the result you already have, fix what makes it fail, or "
        "try a different approach."
    )


def returned_steer_text(tool: str, streak: int) -> str:
    """The second steer, when the model goes back to a call it was steered away from."""
    return (
        f"LOOP GUARD: you were already told to stop calling {_code(tool)} with these arguments, "
        f"and you came back to it ({streak} times now, same result every time). If you "
        "call it again right away with the same arguments, the call will be blocked. "
        "Change your approach, or give your final answer."
    )


def unknown_tool_steer_text(tool: str, available: tuple[str, ...], count: int) -> str:
    """The steer message for repeated calls to a tool that does not exist."""
    return (
        f"LOOP GUARD: there is no tool named {_code(tool)}; you have called it {count} times. "
        f"The tools you can call are: {_names(available)}. Use one of them, or give your "
        "final answer."
    )


def unknown_tool_block_text(tool: str, available: tuple[str, ...], count: int) -> str:
    """The error result of another call to a tool that does not exist."""
    return (
        f"LOOP GUARD: this call was blocked: there is no tool named {_code(tool)} and you have "
        f"called it {count} times. The tools you can call are: {_names(available)}."
    )


def backstop_block_text(tool: str, count: int) -> str:
    """The error result of a call the model kept returning to after being steered away."""
    return (
        f"{_blocked(tool)} This would be the {_ordinal(count)} time in this request that "
        "you make this exact call, and it returned the same result every time, although you "
        "were told to stop. It will not be run again in this request; use the result you "
        "already have, try a different approach, or give your final answer."
    )


def same_error_steer_text(tool: str, weak: bool = False) -> str:
    """The steer message for a tool that fails the same way whatever its args; `weak`
    when that may be the answer to each input (a shell's exit status, an error that
    names what it was given), not a broken tool."""
    if weak:
        return (
            f"LOOP GUARD: {_code(tool)} has failed the same way for several different "
            "inputs in a row. If each failure is the answer you were looking for, go on; "
            "otherwise step back: check what the error says is missing before you try "
            "more variations."
        )
    return (
        f"LOOP GUARD: {_code(tool)} keeps returning the identical error although you changed "
        "its arguments: it is failing whatever you pass it, so other arguments will not "
        f"help. Stop calling {_code(tool)}: fix what the error names, use another tool or "
        "approach, or give your final answer and say that the tool is failing."
    )


def same_error_returned_steer_text(tool: str) -> str:
    """The second steer, when the model goes back to a tool it was told is broken."""
    return (
        f"LOOP GUARD: you were already told that {_code(tool)} is failing whatever its "
        "arguments, and it returned the identical error again. If you call it again right "
        "away, with any arguments, the call will be blocked. Use another tool or approach, "
        "or give your final answer and say that the tool is failing."
    )


def same_error_block_text(tool: str) -> str:
    """The error result of another call to a tool that fails whatever its args."""
    return (
        f"{_blocked(tool)} It kept returning the identical error whatever the arguments, "
        f"also after you were told so. Do not call {_code(tool)} again with other arguments; use "
        "another tool or approach, or give your final answer and say that the tool is "
        "failing."
    )


JUDGE = "(judge)"
"""The `tool` of the judge's decisions (`LoopGuardMiddleware(judge=...)`)."""

CONTEXT = "(context)"
"""The `tool` under which `GuardStats.by_tool` counts what compaction kept out of the
model's context (`LoopGuardMiddleware(compact_repeats=True)`)."""


def judge_steer_text(calls: int) -> str:
    """The steer message when the judge found the agent making no progress."""
    return (
        f"LOOP GUARD: a reviewer read your last {calls} tool calls and found that they are "
        "not making progress: they keep bringing back little that is new. Step back: say "
        "what you have learned so far, then change your approach or give your final answer."
    )


def repeated_text_note(repeats: int) -> str:
    """Appended to a reply cut where it began repeating its own text."""
    return (
        f"\n\n[loop_guard: cut here; the rest of this reply repeated the text above, "
        f"{repeats} times when it was cut]"
    )


def repeated_text_steer_text(repeats: int) -> str:
    """The steer message after a reply was cut for repeating its own text."""
    return (
        f"LOOP GUARD: your last reply kept repeating the same text ({repeats} times in a "
        "row), so it was cut where the repetition began. Do not repeat it: go on from "
        "there with something new, call a tool, or give your final answer."
    )


def repeated_text_block_text(replies: int) -> str:
    """The message after another reply of the same request was cut for repeating itself."""
    return (
        f"LOOP GUARD: your reply was cut again for repeating the same text over and over "
        f"({replies} replies in this request). Write something new and short, or give "
        "your final answer now; repeating yourself again will end the request."
    )


def repeated_text_stop_text(replies: int) -> str:
    """The final message to the user when replies kept repeating their own text."""
    return (
        f"Stopped by loop_guard: the model kept repeating the same text in its replies "
        f"({replies} replies were cut). The request was ended to avoid wasting further "
        "tokens; try rephrasing it."
    )


def duplicate_text(original_id: str) -> str:
    """Prefixed to the shared result of an identical sibling that did not run itself."""
    return (
        f"LOOP GUARD: duplicate of call {_code(original_id)} in the same response; it ran once and "
        "this is its result."
    )


def _sequence(tools: list[str]) -> str:
    if len(set(tools)) == 1:
        return f"the same {len(tools)} {_code(tools[0])} calls in turn"
    return " -> ".join(_code(tool) for tool in tools)


def _names(tools: tuple[str, ...]) -> str:
    if not tools:
        return "(none listed)"
    shown = ", ".join(_code(tool) for tool in tools[:_NAMES_SHOWN])
    more = len(tools) - _NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


_NAMES_SHOWN = 20  # names of a list of tools shown
_NAME_LENGTH = 80  # characters of a name shown
_PLAIN_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{_NAME_LENGTH}}}")


def _code(name: str) -> str:
    """A name the model chose or a tool reported, quoted as data: as it is when it is a
    plain identifier, else JSON-escaped and cut to `_NAME_LENGTH` characters, with no
    backtick that could close the quote: never instructions in the guard's voice."""
    if _PLAIN_NAME.fullmatch(name):
        return f"`{name}`"
    cut = name[:_NAME_LENGTH] + ("..." if len(name) > _NAME_LENGTH else "")
    return "`" + json.dumps(cut).replace("`", "\\u0060") + "`"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _blocked(tool: str) -> str:
    """The opening every block text shares (the graph node's withheld text replaces it)."""
    return f"LOOP GUARD: this call was blocked and {_code(tool)} was not run."
