"""Guard a Deep Agent (`deepagents`): the main agent and every subagent, in one line.

`deepagents.create_deep_agent(..., middleware=[LoopGuardMiddleware()])` guards the main
agent only: deepagents gives its subagents their own middleware, and the main agent's
never reaches them, so a subagent stuck on one call loops unguarded inside a single
`task` call. `create_guarded_deep_agent` takes the same arguments and also puts the
guard on the general-purpose subagent and on every subagent you declare.

Each subagent run is its own conversation with its own streaks: a subagent that is
stopped ends its `task` with the guard's stop message, which the main agent reads as
the task's result and goes on from; the main agent's own repeats (the same `task`
again and again) are steered, blocked and stopped like any other call.

Needs the `deepagents` extra: `pip install 'langchain-loop-guard[deepagents]'`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from loop_guard._exits import raises
from loop_guard.middleware import LoopGuardMiddleware

__all__ = ["create_guarded_deep_agent"]

_GENERAL_PURPOSE = "general-purpose"  # the name deepagents gives it, and lets you reuse


def create_guarded_deep_agent(
    model: str | BaseChatModel | None = None,
    tools: Sequence[BaseTool | Callable[..., Any] | dict[str, Any]] | None = None,
    *,
    middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    subagents: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> Any:
    """`deepagents.create_deep_agent`, with the loop guard on the main agent and on
    every subagent.

    Takes exactly the arguments of `create_deep_agent`. The guard is the
    `LoopGuardMiddleware` in `middleware` if there is one (configure it there), else a
    default one is added. It is put on:

    - the main agent;
    - the general-purpose subagent: unless you declare one yourself, it is declared
        for you as deepagents declares it (its spec, prompt and description, the main
        agent's model, tools, skills and `interrupt_on`), through the documented way
        of changing it: a subagent named `general-purpose`. A harness profile that
        turns it off is obeyed;
    - every subagent you declare as a `SubAgent` spec, unless its `middleware`
        already has a `LoopGuardMiddleware` (yours is kept).

    A `CompiledSubAgent` is a graph you built: guard it where you build it
    (`create_agent(..., middleware=[LoopGuardMiddleware()])`). An `AsyncSubAgent` runs
    on a remote server: guard it there.

    In subagents the guard always ends a stopped run cleanly, so the main agent reads
    the stop as the task's result: with `exit_behavior="error"`, only the main agent
    raises `LoopGuardStop`; with `exit_behavior="answer"`, a stopped subagent's own
    answer is the task's result; with `exit_behavior="ask"`, a subagent's question
    pauses the whole deep agent, and the person's answer resumes the subagent.

    Args:
        model: As for `create_deep_agent`.
        tools: As for `create_deep_agent`.
        middleware: As for `create_deep_agent`; may hold the `LoopGuardMiddleware`.
        subagents: As for `create_deep_agent`.
        **kwargs: Any other argument of `create_deep_agent`.

    Returns:
        The compiled deep agent, as `create_deep_agent` returns it.

    Examples:
        ```python
        from loop_guard.deepagents import create_guarded_deep_agent

        agent = create_guarded_deep_agent("openai:gpt-5.5", tools, subagents=[researcher])
        ```
    """
    try:  # imported here: this module imports without deepagents (it needs Python 3.11)
        from deepagents import create_deep_agent
        from deepagents.middleware.subagents import GENERAL_PURPOSE_SUBAGENT
    except ImportError as error:
        msg = (
            "create_guarded_deep_agent needs deepagents>=0.3.11, the `deepagents` extra: "
            "pip install 'langchain-loop-guard[deepagents]'"
        )
        raise ImportError(msg) from error
    stack = list(middleware)
    guard = next((m for m in stack if isinstance(m, LoopGuardMiddleware)), None)
    if guard is None:
        guard = LoopGuardMiddleware()
        stack.append(guard)
    sub_guard = _for_subagents(guard)
    specs = [_guarded(spec, sub_guard) for spec in subagents or ()]
    if not any(spec.get("name") == _GENERAL_PURPOSE for spec in specs):
        general = _general_purpose(model, GENERAL_PURPOSE_SUBAGENT)
        if general is not None:
            for inherited in ("skills", "interrupt_on"):  # what deepagents gives its own
                if kwargs.get(inherited) is not None:
                    general[inherited] = kwargs[inherited]
            specs.insert(0, {**general, "middleware": [sub_guard]})
    return create_deep_agent(model, tools, middleware=stack, subagents=cast("Any", specs), **kwargs)


def _for_subagents(guard: LoopGuardMiddleware[Any, Any]) -> LoopGuardMiddleware[Any, Any]:
    """The guard for subagents: this one, ending stopped runs cleanly.

    One instance serves any number of agents (its state lives in each agent's state);
    a second is made only when the main agent's raises on a stop.
    """
    if not raises(guard.exit_behavior):
        return guard
    return LoopGuardMiddleware(guard.guard.config, on_event=guard.guard.on_event)


def _guarded(spec: Mapping[str, Any], guard: LoopGuardMiddleware[Any, Any]) -> dict[str, Any]:
    """A declared subagent with the guard in its middleware; other kinds as they are."""
    if "runnable" in spec or "graph_id" in spec:  # compiled or remote: not ours to change
        return dict(spec)
    own = list(spec.get("middleware", ()))
    if any(isinstance(m, LoopGuardMiddleware) for m in own):
        return dict(spec)
    return {**spec, "middleware": [*own, guard]}


def _general_purpose(
    model: str | BaseChatModel | None, default: Mapping[str, Any]
) -> dict[str, Any] | None:
    """deepagents' general-purpose subagent spec for this model; `None` if turned off.

    A harness profile registered for the model may turn it off or give it another
    description or prompt; deepagents reads that profile when it adds the subagent
    itself, so it is read here too (best effort: deepagents' defaults otherwise).
    """
    spec = dict(default)
    if model is None:
        return spec
    try:  # deepagents' own lookup: by the spec string, or by what the model reports
        from deepagents.profiles.harness import harness_profiles as profiles

        if isinstance(model, str):
            profile = profiles._get_harness_profile(model)
        else:
            profile = profiles._harness_profile_for_model(model, None)
        general = profile.general_purpose_subagent if profile is not None else None
    except Exception:  # a deepagents without profiles, or a model it cannot resolve
        return spec
    if general is None:
        return spec
    if general.enabled is False:
        return None
    if general.description is not None:
        spec["description"] = general.description
    if general.system_prompt is not None:
        spec["system_prompt"] = general.system_prompt
    return spec
