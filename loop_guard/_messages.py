"""Every text the guard writes, in one place.

Two audiences: steer and block texts go to the model (imperative: the tool, the count,
what to do instead); stop texts go to the user (why the request ended).
"""

from __future__ import annotations

GUARD_NAME = "loop_guard"
"""The `name` of every message the guard inserts, so it is recognisable in a history."""


def steer_text(tool: str, streak: int) -> str:
    """The steer message the model sees once per streak, before its next call."""
    return (
        f"LOOP GUARD: you have called `{tool}` {streak} times in a row with the same "
        "arguments and got the same result every time. Repeating it will not change the "
        "result. Stop repeating this call: change your approach (different arguments or a "
        "different tool), or give your final answer with what you already have."
    )


def block_text(tool: str, streak: int) -> str:
    """The error result the model gets instead of running a blocked call."""
    return (
        f"LOOP GUARD: this call was blocked and `{tool}` was not run. You already called "
        f"it {streak} times in a row with these exact arguments and got the same result "
        "each time. Do not call it again with the same arguments; use the result you "
        "already have, try a different approach, or give your final answer."
    )


def withheld_text(tool: str, block_threshold: int) -> str:
    """The result of a repeated call the guard could only judge after it ran.

    A tool outside the guard's wrappers (or one that does not exist) has already run,
    so the model is told its result is withheld, not that it was not run.
    """
    return (
        f"LOOP GUARD: the result of this `{tool}` call is withheld. You made this exact "
        f"call at least {block_threshold - 1} times in a row and got the same result each "
        "time, or the request was stopped. Do not call it again with the same arguments; "
        "use the result you already have, try a different approach, or give your final "
        "answer."
    )


def not_run_text() -> str:
    """The result of a pending call that the guard's stop left unexecuted."""
    return "LOOP GUARD: not run, because the request was stopped by the loop guard."


def abort_text(tool: str, blocks: int) -> str:
    """The final message to the user when the request is aborted."""
    return (
        f"Stopped by loop_guard: the agent kept calling `{tool}` with the same arguments "
        f"and getting the same result, and ignored {blocks} blocked attempts. The request "
        "was ended to avoid wasting further calls; try rephrasing it or check the tool."
    )


def terminate_text(tool: str) -> str:
    """The final message to the user when a fully blocked batch ends the request."""
    return (
        f"Stopped by loop_guard: the agent repeated `{tool}` with the same arguments and "
        "the same result, so the repeated call was blocked and the request ended."
    )
