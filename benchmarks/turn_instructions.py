"""Machine instructions of one guarded model turn, phase by phase, counted by valgrind.

    .venv/bin/python benchmarks/turn_instructions.py               # every phase
    .venv/bin/python benchmarks/turn_instructions.py record decide # some of them
    .venv/bin/python benchmarks/turn_instructions.py --size 4096   # reads of ~4 KB

Where `instructions.py` counts a whole healthy step of the agent, this counts the guard's
own work in its model turn, with no graph and no model around it: a healthy scripted agent
with `LoopGuardMiddleware` runs 52 steps, and its model turn at step 50 is kept (the
request and the model's response). A child process under `valgrind --tool=callgrind`
then runs one phase of that turn 200 times on it; a child that runs it 0 times is taken
off, so what is left is 200 runs of the phase. The request's snapshot stays in the
guard's read cache (it keeps the last 256 written), so every run reads the same state.

The phases nest, each doing what the ones before it do:

- `setup`: the turn is made (the session read from the state, the tools offered);
- `record`: the last batch's results are recorded (their fingerprints, one transition);
- `decide`: the model's reply is decided (its calls' fingerprints, one transition);
- `outcome`: the snapshot is written and the model node's result built;
- `turn`: `wrap_model_call` as the agent calls it, the model call a function returning
  the kept response.

A few seconds a phase at the default size; minutes at 64 KB. Not part of `run.py`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from _agents import Toolbox, agent_with, ask, config_for, healthy, run_invoke
from instructions import instructions_of

from loop_guard import LoopGuardMiddleware

PHASES = ("setup", "record", "decide", "outcome", "turn")
RUNS = 200  # fewer than the snapshots the guard keeps: the kept one is never evicted
KEPT_STEP = 50


class _Keeper(LoopGuardMiddleware):
    """`LoopGuardMiddleware` that keeps the request and response of one model turn."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0
        self.kept: tuple[Any, Any] | None = None

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        self.turns += 1
        if self.turns != KEPT_STEP:
            return super().wrap_model_call(request, handler)
        response = handler(request)
        self.kept = (request, response)
        return super().wrap_model_call(request, lambda _: response)


def phase(name: str, middleware: _Keeper) -> Callable[[], object]:
    """One run of the phase `name` on the kept turn."""
    assert middleware.kept is not None
    request, response = middleware.kept

    def until(last: str) -> object:
        turn = middleware._turn(request)
        if last == "setup":
            return turn
        turn.next_request()
        if last == "record":
            return turn
        turn.take(response)
        if last == "decide":
            return turn
        turn.next_request()
        return turn.outcome()

    if name == "turn":
        return lambda: LoopGuardMiddleware.wrap_model_call(middleware, request, lambda _: response)
    return lambda: until(name)


def child(name: str, size: int, runs: int) -> None:
    """Keep the turn, then run the phase `runs` times (the counted process's work)."""
    middleware = _Keeper()
    agent = agent_with(healthy(KEPT_STEP + 2), Toolbox(size), [middleware])
    run_invoke(agent, ask(), config_for("turn-instructions", limit=10_000))
    run_phase = phase(name, middleware)
    for _ in range(runs):
        run_phase()


def count(name: str, size: int, runs: int) -> int:
    """Instructions of a whole child process."""
    return instructions_of([__file__, "--child", name, str(size), str(runs)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phases", nargs="*", help=f"some of: {', '.join(PHASES)}")
    parser.add_argument("--size", type=int, default=0, help="result size (0: short reads)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    base = count("setup", args.size, 0)
    print("| phase (each includes those above it) | instructions per turn |\n|---|---|")
    for name in args.phases or PHASES:
        per_turn = (count(name, args.size, RUNS) - base) / RUNS
        print(f"| {name} | {per_turn / 1e3:.1f} k |", flush=True)


if __name__ == "__main__":
    main()
