"""5. Peers: the same scripted agents through each published loop guard, and ours.

Run in-process by `bench_peers` (ours only, for `--quick`), or as a script inside the
throwaway venv where the peers are installed (`run.py --peers`), printing JSON:

    python benchmarks/peers_worker.py --healthy-steps 300 --stubborn-limit 100 --rounds 5

Each guard is attached the way its README documents, with its default settings, and a
fresh instance per run (several peers keep state on the instance).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from _agents import (
    Toolbox,
    agent_with,
    ask,
    config_for,
    healthy,
    interventions,
    mixed_healthy,
    mixed_healthy_turns,
    run_invoke,
    stubborn,
    stubborn_ok,
)

from loop_guard import GUARD_NAME, LoopGuardMiddleware

Attach = Callable[[], tuple[list[Any], list[Any]]]
"""A fresh guard: (middleware for create_agent, callbacks for the run's config)."""


def _ours() -> tuple[list[Any], list[Any]]:
    return [LoopGuardMiddleware()], []


def _none() -> tuple[list[Any], list[Any]]:
    return [], []


def peer_guards() -> dict[str, tuple[str, str, Attach | None, str]]:
    """name -> (PyPI package, how it is attached, factory or None, import error)."""
    guards: dict[str, tuple[str, str, Attach | None, str]] = {}
    try:
        import able_harness_kit as ahk

        guards["able-harness-kit LoopGuardMiddleware"] = (
            "able-harness-kit",
            "middleware (wrap_tool_call)",
            lambda: ([ahk.LoopGuardMiddleware()], []),
            "",
        )
        guards["able-harness-kit ProgressAwareLoopGuardMiddleware"] = (
            "able-harness-kit",
            "middleware (wrap_tool_call)",
            lambda: ([ahk.ProgressAwareLoopGuardMiddleware()], []),
            "",
        )
    except ImportError as error:
        guards["able-harness-kit"] = ("able-harness-kit", "", None, str(error))
    try:
        import langchain_tool_recover as ltr

        guards["langchain-tool-recover ToolRecoverMiddleware"] = (
            "langchain-tool-recover",
            "middleware (wrap_tool_call, after_agent)",
            lambda: ([ltr.ToolRecoverMiddleware()], []),
            "",
        )
    except ImportError as error:
        guards["langchain-tool-recover"] = ("langchain-tool-recover", "", None, str(error))
    try:
        from loopguard import LoopGuardCallbackHandler as LGRHandler

        def documented() -> tuple[list[Any], list[Any]]:
            return [], [LGRHandler()]

        def raising() -> tuple[list[Any], list[Any]]:
            handler = LGRHandler()
            handler.raise_error = True  # not in its README: without it the stop is swallowed
            return [], [handler]

        guards["loopguard-runtime LoopGuardCallbackHandler"] = (
            "loopguard-runtime",
            "callback handler, as documented",
            documented,
            "",
        )
        guards["loopguard-runtime handler, raise_error=True"] = (
            "loopguard-runtime",
            "callback handler, raise_error set by hand",
            raising,
            "",
        )
    except ImportError as error:
        guards["loopguard-runtime"] = ("loopguard-runtime", "", None, str(error))
    return guards


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def stubborn_run(attach: Attach, limit: int, *, error: bool) -> dict[str, Any]:
    """A model that repeats one call forever: when does the run end, and how?

    `error`: it reads a missing file (an error result); else it looks up the same
    record (the same successful result).
    """
    box = Toolbox()
    script = stubborn() if error else stubborn_ok()
    middleware, callbacks = attach()
    agent = agent_with(script, box, middleware)
    messages, ended = run_invoke(agent, ask(), config_for(None, limit=limit, callbacks=callbacks))
    if ended == "completed":
        last = messages[-1] if messages else None
        by_guard = getattr(last, "name", None) == GUARD_NAME
        how = "ended cleanly, with a final message" if by_guard else "completed"
    elif ended == "GraphRecursionError":
        how = "not stopped: recursion limit"
    else:
        how = f"stopped by raising {ended}"
    return {"model_calls": script.calls, "tool_runs": sum(box.runs.values()), "how": how}


def healthy_run(attach: Attach) -> dict[str, Any]:
    """Legitimate repetition (polling, pagination, re-reads): how often did the guard interfere?"""
    box = Toolbox()
    script = mixed_healthy()
    middleware, callbacks = attach()
    agent = agent_with(script, box, middleware)
    messages, ended = run_invoke(agent, ask(), config_for(None, limit=1000, callbacks=callbacks))
    count = interventions(messages, box, script) if messages else 1
    return {"interventions": count, "ended": ended, "turns": len(mixed_healthy_turns())}


def overhead(attaches: dict[str, Attach], steps: int, rounds: int) -> dict[str, list[float]]:
    """Wall time of a healthy run of `steps` distinct calls, per guard, interleaved."""
    names = list(attaches)
    samples: dict[str, list[float]] = {name: [] for name in names}

    def once(name: str) -> float:
        middleware, callbacks = attaches[name]()
        agent = agent_with(healthy(steps), Toolbox(), middleware)
        config = config_for(None, limit=100_000, callbacks=callbacks)
        start = time.perf_counter()
        run_invoke(agent, ask(), config)
        return time.perf_counter() - start

    for name in names:  # warm-up round
        once(name)
    for index in range(rounds):
        for name in names if index % 2 == 0 else reversed(names):
            samples[name].append(once(name))
    return samples


def measure(steps: int, limit: int, rounds: int, *, peers: bool) -> dict[str, Any]:
    attaches: dict[str, Attach] = {"no guard": _none, "loop_guard (ours)": _ours}
    info: dict[str, dict[str, Any]] = {
        "no guard": {"package": "", "attached": "", "version": ""},
        "loop_guard (ours)": {
            "package": "langchain-loop-guard",
            "attached": "LoopGuardMiddleware",
            "version": _version("langchain-loop-guard"),
        },
    }
    if peers:
        for name, (package, how, factory, error) in peer_guards().items():
            info[name] = {"package": package, "attached": how, "version": _version(package)}
            if factory is None:
                info[name]["error"] = f"not importable: {error}"
            else:
                attaches[name] = factory
    for name, attach in attaches.items():
        info[name]["stubborn"] = stubborn_run(attach, limit, error=True)
        info[name]["stubborn_ok"] = stubborn_run(attach, limit, error=False)
        info[name]["healthy"] = healthy_run(attach)
    samples = overhead(attaches, steps, rounds)
    base = samples["no guard"]
    for name in attaches:
        diffs = [(v - b) / steps for v, b in zip(samples[name], base, strict=True)]
        info[name]["run_s"] = statistics.median(samples[name])
        info[name]["added_per_step_s"] = statistics.median(diffs)
    return {"guards": info, "steps": steps, "limit": limit, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--healthy-steps", type=int, default=300)
    parser.add_argument("--stubborn-limit", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger().addHandler(logging.NullHandler())  # the guards' logs stay quiet
    result = measure(args.healthy_steps, args.stubborn_limit, args.rounds, peers=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
