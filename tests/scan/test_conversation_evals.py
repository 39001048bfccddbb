"""The evaluation on conversations between agents (`evals/conversations.py`): its targets
hold, and the page written from it is current."""

from __future__ import annotations

from pathlib import Path

from evals.conversations import THREADS, Outcome, scan, table, targets

PAGE = Path(__file__).resolve().parents[2] / "evals" / "CONVERSATIONS.md"


def test_the_threads_cover_the_shapes_people_record_about_half_of_them_loops() -> None:
    shapes = {thread.shape for thread in THREADS}
    assert shapes >= {
        "swarm",
        "supervisor",
        "group chat",
        "two-agent chat",
        "debate",
        "tutor and student",
        "planner and executor",
    }
    loops = [thread for thread in THREADS if thread.label == "loop"]
    assert len(THREADS) >= 30
    assert abs(2 * len(loops) - len(THREADS)) <= 2
    for thread in loops:  # a label names a call the thread makes
        assert thread.first_loop_call is not None
        assert 1 <= thread.first_loop_call <= thread.calls


def test_every_clear_loop_is_caught_in_time_and_no_healthy_thread_is_touched() -> None:
    """Every clear loop steered no later than two calls after its labelled first loop
    call; no healthy thread blocked; at most one in ten steered (none is)."""
    outcomes = scan()
    for name, (met, of, held) in targets(outcomes).items():
        assert held, f"{name}: {met}/{of}"
    healthy: list[Outcome] = [o for o in outcomes if o.thread.label == "healthy"]
    assert [o.thread.name for o in healthy if o.steer is not None] == []


def test_the_published_page_is_the_evaluation_of_these_threads() -> None:
    """evals/CONVERSATIONS.md holds this table: regenerate it with `python -m
    evals.conversations --write evals/CONVERSATIONS.md` after changing a detector."""
    assert table(scan()) in PAGE.read_text(encoding="utf-8")
