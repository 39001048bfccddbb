"""The engine masks a result's fresh values only when its call recurs (`Result.masked`),
and then masks the earlier run's too, found by the adapter's `earlier`."""

from __future__ import annotations

from collections.abc import Iterable

from loop_guard import LoopGuardConfig
from loop_guard._engine import Engine
from loop_guard._state import RequestState
from loop_guard._values import Call, Result, Steer
from loop_guard._volatile import normalize_fresh


class Masking:
    """Results read unmasked, each masked by `normalize_fresh` when asked; counts the asks."""

    def __init__(self) -> None:
        self.masked: list[str] = []
        self.read: dict[str, list[Result]] = {}  # what `earlier` can find, by tool

    def result(self, tool: str, text: str) -> Result:
        def masked() -> Result:
            self.masked.append(text)
            return Result.of(normalize_fresh(text), variant=text)

        result = Result.of(text, masked=masked)
        self.read.setdefault(tool, []).append(result)
        return result

    def earlier(self, call: Call) -> Iterable[Result]:
        return self.read.get(call.tool, ())


def _steps(masking: Masking, texts: list[tuple[str, str]], *, finds: bool) -> list[int]:
    """The steps whose settling steered, the results recorded one call a batch."""
    engine = Engine(LoopGuardConfig())
    state = RequestState()
    steered = []
    for n, (tool, text) in enumerate(texts, 1):
        call = Call.of(tool, {"to": "boss"})
        state, _, _ = engine.check_call(state, call)
        earlier = masking.earlier if finds else None
        state, decisions = engine.record_result(state, call, masking.result(tool, text), earlier)
        state, settled = engine.settle(state)
        steered += [n for d in (*decisions, *settled) if isinstance(d, Steer)]
    return steered


def test_a_new_call_is_not_masked_a_recurring_one_and_its_earlier_run_are() -> None:
    masking = Masking()
    sends = [("send", f"sent, message id {n:04d}-9f86d081884c7d65") for n in range(5)]
    steered = _steps(masking, [("read", "at 12:00:01"), *sends], finds=True)
    # The read and the first send are new: not masked. The second send masks itself and
    # the first; each later one, itself.
    assert masking.masked == [sends[1][1], sends[0][1], *(text for _, text in sends[2:])]
    assert steered == [6]  # the 5th send: near-repeats are given two more


def test_an_earlier_run_not_found_is_caught_one_step_later() -> None:
    """With no earlier run to mask (a trimmed history, a cache miss), the first run stays
    as returned: the loop counts from the second."""
    sends = [("send", f"sent, message id {n:04d}-9f86d081884c7d65") for n in range(6)]
    assert _steps(Masking(), sends, finds=True) == [5]
    assert _steps(Masking(), sends, finds=False) == [6]


def test_an_identical_earlier_run_needs_no_look_back() -> None:
    masking = Masking()
    steered = _steps(masking, [("ls", "README.md")] * 3, finds=False)
    assert steered == [3]
    assert masking.masked == ["README.md", "README.md"]  # the 2nd and 3rd, never the 1st
