"""Conversations between agents, labelled, for the evaluation of loops between agents.

    python -m evals.conversations [--write evals/CONVERSATIONS.md]

Each thread is written the way a multi-agent framework records it: every turn is an
agent's message, named by the agent, with its words beside a handoff to the next agent
(a call with no arguments, answered "Successfully transferred to ..."), or beside another
tool call, or a reply with no call (a worker's report, the final answer). The shapes are
the ones people record: a swarm, a supervisor with its workers (`langgraph-supervisor`'s
hand-back included), a group chat whose manager picks the next speaker, a two-agent chat,
a debate, a tutor and a student, a planner and an executor.

The labels were written with the threads, before the detector ran on them: `healthy`, or
`loop` with its `first_loop_call`, counted as the traces' labels count it (tool calls
from 1; a repeated call: its 3rd identical run; a cycle of `p` calls first run at call
`s`: call `s + 2p`, the 3rd run of its first call). A `borderline` loop is one whose
words are new every lap though nothing happens: no identity rule tells it from a
conversation (the judge does, `LoopGuardMiddleware(judge=...)`), so it is scored but not
counted in the targets.

The threads are scanned as `loop-guard scan` reads a file of OpenAI chat messages, with
the default settings. Targets: every clear loop steered no later than two calls after its
`first_loop_call`; no healthy thread blocked; at most one in ten healthy threads steered.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loop_guard import LoopGuardConfig
from loop_guard.scan import load, scan_conversation

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """One agent's message: its `words`, and the tool it calls (`None`: a reply with no
    call) with the call's `args` and `result`."""

    agent: str
    words: str
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    result: str = ""


def handoff(agent: str, to: str, words: str = "") -> Turn:
    """`agent` says `words` beside a handoff to `to` (`langgraph-swarm`'s)."""
    return Turn(agent, words, f"transfer_to_{to}", {}, f"Successfully transferred to {to}")


def hand_back(agent: str, to: str = "supervisor") -> Turn:
    """A worker's hand-back to its supervisor, as `langgraph-supervisor` writes it."""
    return Turn(
        agent,
        f"Transferring back to {to}",
        f"transfer_back_to_{to}",
        {},
        f"Successfully transferred back to {to}",
    )


def call(agent: str, tool: str, args: dict[str, Any], result: str, words: str = "") -> Turn:
    """`agent` calls `tool` (not a handoff), its words beside the call."""
    return Turn(agent, words, tool, args, result)


def reply(agent: str, words: str) -> Turn:
    """A reply with no call: a worker's report, or the final answer."""
    return Turn(agent, words)


@dataclass(frozen=True, slots=True)
class Thread:
    """A labelled conversation between agents."""

    name: str
    shape: str
    label: Literal["loop", "healthy"]
    task: str
    turns: tuple[Turn, ...]
    first_loop_call: int | None = None
    borderline: bool = False
    why: str = ""

    def messages(self) -> list[Message]:
        """The thread as OpenAI chat messages, each agent's named."""
        messages: list[Message] = [{"role": "user", "content": self.task}]
        for number, turn in enumerate(self.turns, start=1):
            message: Message = {"role": "assistant", "name": turn.agent, "content": turn.words}
            if turn.tool is None:
                messages.append(message)
                continue
            call_id = f"call_{number}"
            arguments = json.dumps(turn.args)
            function = {"name": turn.tool, "arguments": arguments}
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
            answer = {"role": "tool", "tool_call_id": call_id, "content": turn.result}
            messages += [message, answer]
        return messages

    @property
    def calls(self) -> int:
        return sum(turn.tool is not None for turn in self.turns)


def laps(*turns: Turn, times: int) -> tuple[Turn, ...]:
    return tuple(turns) * times


def each(count: int, make: Any, then: Turn | None = None) -> tuple[Turn, ...]:
    """The turns `make(i)` returns for i in 0..count-1, in order, and `then`."""
    turns = tuple(turn for i in range(count) for turn in make(i))
    return turns if then is None else (*turns, then)


GUESSES = (50, 25, 43, 31, 40, 35)

THREADS: tuple[Thread, ...] = (
    # --- healthy ---------------------------------------------------------------------
    Thread(
        "swarm-guessing-game",
        "swarm",
        "healthy",
        "Guess my number between 1 and 100.",
        (
            *each(
                len(GUESSES),
                lambda i: (
                    handoff("alice", "bob", f"Is it {GUESSES[i]}?"),
                    handoff("bob", "alice", "Too high." if i % 2 == 0 else "Too low."),
                ),
            ),
            reply("alice", "The number is 37."),
        ),
        why="every guess is new; bob's two phrases repeat",
    ),
    Thread(
        "swarm-review-rounds",
        "swarm",
        "healthy",
        "Write the quarterly report.",
        (
            *each(
                8,
                lambda i: (
                    handoff(
                        "writer",
                        "reviewer",
                        f"Draft {i + 1}: section {i + 1} rewritten with the new figures.",
                    ),
                    handoff(
                        "reviewer",
                        "writer",
                        f"Comments on draft {i + 1}: tighten paragraph {i % 5 + 2}.",
                    ),
                ),
            ),
            reply("writer", "Draft 9 is final."),
        ),
    ),
    Thread(
        "swarm-flights-and-hotels",
        "swarm",
        "healthy",
        "Plan a trip to Lisbon, then Porto, then Faro.",
        (
            *each(
                3,
                lambda i: (
                    call(
                        "flights",
                        "search_flights",
                        {"to": ("LIS", "OPO", "FAO")[i]},
                        f"3 flights to {('LIS', 'OPO', 'FAO')[i]}",
                    ),
                    handoff("flights", "hotels", f"Flight {i + 1} booked, find a hotel."),
                    call(
                        "hotels",
                        "search_hotels",
                        {"city": ("Lisbon", "Porto", "Faro")[i]},
                        f"12 hotels in {('Lisbon', 'Porto', 'Faro')[i]}",
                    ),
                    handoff("hotels", "flights", f"Hotel {i + 1} booked, next leg please."),
                ),
            ),
            reply("flights", "Your trip is booked."),
        ),
    ),
    Thread(
        "supervisor-new-tasks",
        "supervisor",
        "healthy",
        "Summarise the research on five topics.",
        each(
            5,
            lambda i: (
                handoff("supervisor", "researcher", f"Research topic {i + 1}."),
                reply("researcher", f"Topic {i + 1}: three papers found."),
                hand_back("researcher"),
            ),
            then=reply("supervisor", "Here is the summary."),
        ),
    ),
    Thread(
        "supervisor-same-task-new-findings",
        "supervisor",
        "healthy",
        "Keep researching until you have five findings.",
        each(
            5,
            lambda i: (
                handoff("supervisor", "researcher", "Keep researching the topic."),
                reply("researcher", f"Finding number {i + 1}."),
                hand_back("researcher"),
            ),
            then=reply("supervisor", "Five findings collected."),
        ),
        why="the same task words, a new report every time",
    ),
    Thread(
        "group-chat-manager-rounds",
        "group chat",
        "healthy",
        "Write and review a sorting function.",
        each(
            4,
            lambda i: (
                handoff("manager", "coder", "Next speaker: coder."),
                handoff("coder", "manager", f"Version {i + 1} of sort() handles case {i + 1}."),
                handoff("manager", "critic", "Next speaker: critic."),
                handoff("critic", "manager", f"Version {i + 1}: add a test for case {i + 2}."),
            ),
            then=reply("manager", "TERMINATE"),
        ),
        why="the manager says the same line each round; the speakers say something new",
    ),
    Thread(
        "group-chat-brainstorm",
        "group chat",
        "healthy",
        "Brainstorm names for the product.",
        each(
            3,
            lambda i: tuple(
                turn
                for speaker, idea in (("ana", "Nimbus"), ("ben", "Quill"), ("cy", "Orbit"))
                for turn in (
                    handoff("manager", speaker, f"{speaker}, your idea?"),
                    handoff(speaker, "manager", f"{idea} {i + 1}: it sounds light and fast."),
                )
            ),
            then=reply("manager", "We will vote on the nine names."),
        ),
    ),
    Thread(
        "two-agent-code-runs",
        "two-agent chat",
        "healthy",
        "Plot NVDA and TSLA stock prices YTD.",
        each(
            4,
            lambda i: (
                handoff(
                    "assistant",
                    "user_proxy",
                    f"Run this script, attempt {i + 1}:\n```python\nplot({i})\n```",
                ),
                handoff(
                    "user_proxy", "assistant", f"exitcode: {i % 2}\nOutput: step {i + 1} of 4 done"
                ),
            ),
            then=reply("assistant", "The chart is saved. TERMINATE"),
        ),
    ),
    Thread(
        "two-agent-twenty-questions",
        "two-agent chat",
        "healthy",
        "Play twenty questions: guess the animal.",
        each(
            8,
            lambda i: (
                handoff(
                    "asker",
                    "answerer",
                    (
                        "Is it a mammal?",
                        "Does it live in water?",
                        "Is it bigger than a cat?",
                        "Does it have stripes?",
                        "Is it a pet?",
                        "Does it eat meat?",
                        "Does it live in Africa?",
                        "Is it a zebra?",
                    )[i],
                ),
                handoff(
                    "answerer",
                    "asker",
                    ("Yes.", "No.", "Yes.", "Yes.", "No.", "No.", "Yes.", "Yes.")[i],
                ),
            ),
            then=reply("asker", "It is a zebra."),
        ),
        why="the answers are Yes. and No. over and over; every question is new",
    ),
    Thread(
        "debate-five-rounds",
        "debate",
        "healthy",
        "Debate: should cities ban cars from their centres?",
        each(
            5,
            lambda i: (
                handoff(
                    "pro",
                    "con",
                    f"Argument {i + 1} for: "
                    + ("air", "noise", "safety", "space", "shops")[i]
                    + ".",
                ),
                handoff(
                    "con",
                    "pro",
                    f"Rebuttal {i + 1}: "
                    + ("jobs", "access", "cost", "delivery", "freedom")[i]
                    + ".",
                ),
            ),
            then=reply("pro", "Closing: the benefits outweigh the costs."),
        ),
    ),
    Thread(
        "debate-with-a-stock-phrase",
        "debate",
        "healthy",
        "Debate: is remote work better?",
        each(
            5,
            lambda i: (
                handoff(
                    "pro",
                    "con",
                    f"I disagree. Point {i + 1}: "
                    + ("focus", "commute", "hiring", "costs", "health")[i]
                    + ".",
                ),
                handoff(
                    "con",
                    "pro",
                    f"I disagree. Point {i + 1}: "
                    + ("mentoring", "culture", "trust", "speed", "ideas")[i]
                    + ".",
                ),
            ),
            then=reply("con", "We agree to differ."),
        ),
    ),
    Thread(
        "tutor-student-drill",
        "tutor and student",
        "healthy",
        "Drill me on multiplication.",
        each(
            6,
            lambda i: (
                handoff("tutor", "student", f"Correct. Next: what is {i + 3} x 8?"),
                handoff("student", "tutor", f"{(i + 3) * 8}."),
            ),
            then=reply("tutor", "Well done: six out of six."),
        ),
        why="the tutor's 'Correct.' repeats; the questions and answers are new",
    ),
    Thread(
        "tutor-student-not-sure",
        "tutor and student",
        "healthy",
        "Help me understand recursion.",
        (
            handoff("tutor", "student", "What does a function need to stop calling itself?"),
            handoff("student", "tutor", "I'm not sure."),
            handoff("tutor", "student", "Hint: think of the smallest input."),
            handoff("student", "tutor", "I'm not sure."),
            handoff("tutor", "student", "Hint: what is factorial(0)?"),
            handoff("student", "tutor", "It is 1, so that is the base case!"),
            reply("tutor", "Exactly: the base case stops the recursion."),
        ),
        why="the student says the same words twice while the tutor's hints change",
    ),
    Thread(
        "planner-executor-steps",
        "planner and executor",
        "healthy",
        "Set up the project and run its tests.",
        each(
            5,
            lambda i: (
                handoff(
                    "planner",
                    "executor",
                    f"Step {i + 1}: " + ("clone", "install", "configure", "build", "test")[i] + ".",
                ),
                call(
                    "executor",
                    "shell",
                    {"cmd": ("git clone", "pip install", "configure", "make", "pytest")[i]},
                    f"ok ({i})",
                ),
                handoff("executor", "planner", f"Step {i + 1} done."),
            ),
            then=reply("planner", "All five steps are done."),
        ),
    ),
    Thread(
        "planner-executor-polling",
        "planner and executor",
        "healthy",
        "Train the model and report when it finishes.",
        each(
            5,
            lambda i: (
                handoff("planner", "executor", "Check the training job."),
                call(
                    "executor", "job_status", {"job": "train-7"}, f"train-7: {(i + 1) * 20}% done"
                ),
                handoff("executor", "planner", f"Still running: {(i + 1) * 20}%."),
            ),
            then=reply("planner", "Training finished."),
        ),
        why="the same check each round; its result advances",
    ),
    Thread(
        "swarm-researcher-writer",
        "swarm",
        "healthy",
        "Write an article on solar power.",
        each(
            5,
            lambda i: (
                call(
                    "researcher",
                    "search",
                    {"topic": f"solar topic {i + 1}"},
                    f"findings on solar topic {i + 1}",
                ),
                handoff("researcher", "writer", "Here is what I found."),
                call("writer", "write", {"draft": f"draft {i + 1}"}, f"draft saved: draft {i + 1}"),
                handoff("writer", "researcher", "Draft saved, what next?"),
            ),
            then=reply("writer", "The article is done."),
        ),
        why="the words beside the handoffs repeat; every lap searches and writes something new",
    ),
    # --- loops -----------------------------------------------------------------------
    Thread(
        "swarm-bounce-login-bug",
        "swarm",
        "loop",
        "Fix the login bug.",
        laps(
            handoff("alice", "bob", "Bob, can you handle the login bug?"),
            handoff("bob", "alice", "This is Alice's area, handing it back."),
            times=8,
        ),
        first_loop_call=5,
    ),
    Thread(
        "swarm-bare-ping-pong",
        "swarm",
        "loop",
        "Plan a trip.",
        laps(handoff("alice", "bob"), handoff("bob", "alice"), times=8),
        first_loop_call=5,
    ),
    Thread(
        "swarm-bounce-reformatted",
        "swarm",
        "loop",
        "Fix the login bug.",
        each(
            8,
            lambda i: (
                handoff(
                    "alice",
                    "bob",
                    "Bob, can you handle the login bug?"
                    if i % 2
                    else "bob,  can you handle the LOGIN bug?",
                ),
                handoff(
                    "bob",
                    "alice",
                    "This is Alice's area,\nhanding it back."
                    if i % 2
                    else "This is Alice's area, handing it back.",
                ),
            ),
        ),
        first_loop_call=5,
        why="the same words, differing only in case and whitespace",
    ),
    Thread(
        "swarm-bounce-timestamped",
        "swarm",
        "loop",
        "Fix the login bug.",
        each(
            8,
            lambda i: (
                handoff(
                    "alice", "bob", f"[10:{i:02d}:1{i % 10}] Bob, can you handle the login bug?"
                ),
                handoff("bob", "alice", f"[10:{i:02d}:2{i % 10}] Not mine, handing it back."),
            ),
        ),
        first_loop_call=5,
        why="the same words, stamped with a new time each lap",
    ),
    Thread(
        "swarm-thank-you-exact",
        "swarm",
        "loop",
        "Book a table for two.",
        (
            call("alice", "book_table", {"people": 2}, "Table 12 booked for 19:00."),
            handoff("alice", "bob", "Booked table 12, please confirm with the guest."),
            handoff("bob", "alice", "Confirmed with the guest."),
            *laps(
                handoff("alice", "bob", "Thank you!"),
                handoff("bob", "alice", "You're welcome! Anything else?"),
                times=7,
            ),
        ),
        first_loop_call=8,
        why="the task is done at call 3; then the same thanks and welcome, lap after lap",
    ),
    Thread(
        "swarm-thank-you-rotating",
        "swarm",
        "loop",
        "Book a table for two.",
        (
            call("alice", "book_table", {"people": 2}, "Table 12 booked for 19:00."),
            handoff("alice", "bob", "Booked table 12, please confirm with the guest."),
            *laps(
                handoff("bob", "alice", "Confirmed. Anything else?"),
                handoff("alice", "bob", "No, thank you!"),
                handoff("bob", "alice", "You're welcome! Anything else?"),
                handoff("alice", "bob", "Nothing more, thanks!"),
                times=5,
            ),
        ),
        first_loop_call=11,
        why="two phrasings each, in turn: a cycle of 4 calls from call 3",
    ),
    Thread(
        "two-agent-anything-else-rotating",
        "two-agent chat",
        "loop",
        "Convert 10 miles to km.",
        (
            handoff("assistant", "user_proxy", "10 miles is 16.09 km."),
            *laps(
                handoff("user_proxy", "assistant", "Thanks!"),
                handoff("assistant", "user_proxy", "You're welcome. Anything else?"),
                handoff("user_proxy", "assistant", "No, that's all."),
                handoff("assistant", "user_proxy", "Glad to help. Anything else?"),
                handoff("user_proxy", "assistant", "Thank you."),
                handoff("assistant", "user_proxy", "My pleasure. Anything else?"),
                times=4,
            ),
        ),
        first_loop_call=14,
        why="three phrasings each, in turn: a cycle of 6 calls from call 2",
    ),
    Thread(
        "two-agent-thank-you-fresh-words",
        "two-agent chat",
        "loop",
        "Convert 10 miles to km.",
        (
            handoff("assistant", "user_proxy", "10 miles is 16.09 km."),
            *each(
                10,
                lambda i: (
                    handoff(
                        "user_proxy",
                        "assistant",
                        f"Thank you{'!' * (i + 1)} Truly grateful, round {i + 1}.",
                    ),
                    handoff(
                        "assistant", "user_proxy", f"You're welcome, round {i + 1}. Anything else?"
                    ),
                ),
            ),
        ),
        first_loop_call=6,
        borderline=True,
        why="pleasantries after the task, reworded every lap: new words, nothing happens",
    ),
    Thread(
        "supervisor-same-task-same-report",
        "supervisor",
        "loop",
        "Research the topic.",
        each(
            8,
            lambda i: (
                handoff("supervisor", "researcher", "Research the topic."),
                reply("researcher", "Nothing found."),
                hand_back("researcher"),
            ),
        ),
        first_loop_call=5,
        why="the same delegation and the same report: a cycle of the delegation and the hand-back",
    ),
    Thread(
        "group-chat-stuck-speaker",
        "group chat",
        "loop",
        "Fix the failing build.",
        (
            handoff("manager", "coder", "Next speaker: coder."),
            handoff("coder", "manager", "Patch applied to build.py."),
            *laps(
                handoff("manager", "critic", "Next speaker: critic."),
                handoff("critic", "manager", "I need more information about the error."),
                times=7,
            ),
        ),
        first_loop_call=7,
    ),
    Thread(
        "group-chat-echo",
        "group chat",
        "loop",
        "Fix the bug in parse().",
        laps(
            handoff("manager", "critic", "Next speaker: critic."),
            handoff("critic", "manager", "Please fix the bug in parse()."),
            handoff("manager", "coder", "Next speaker: coder."),
            handoff("coder", "manager", "The code is correct as written."),
            times=5,
        ),
        first_loop_call=9,
    ),
    Thread(
        "debate-stuck",
        "debate",
        "loop",
        "Debate: tabs or spaces?",
        (
            handoff("pro", "con", "Tabs let each reader choose the width."),
            handoff("con", "pro", "Spaces look the same everywhere."),
            *laps(
                handoff("pro", "con", "As I said, tabs are better."),
                handoff("con", "pro", "As I said, spaces are better."),
                times=6,
            ),
        ),
        first_loop_call=7,
    ),
    Thread(
        "tutor-student-stuck",
        "tutor and student",
        "loop",
        "What is 6 x 7?",
        laps(
            handoff("student", "tutor", "41."),
            handoff("tutor", "student", "That's not right, try again."),
            times=8,
        ),
        first_loop_call=5,
    ),
    Thread(
        "planner-executor-failing-retry",
        "planner and executor",
        "loop",
        "Make the tests pass.",
        laps(
            handoff("planner", "executor", "Fix the failing tests and rerun."),
            call(
                "executor",
                "run_tests",
                {"path": "tests/"},
                "3 failed: test_parse, test_load, test_save",
            ),
            handoff("executor", "planner", "Tests failed: 3 errors."),
            times=6,
        ),
        first_loop_call=7,
    ),
    Thread(
        "planner-executor-same-plan",
        "planner and executor",
        "loop",
        "Deploy the service.",
        (
            handoff("planner", "executor", "Step 1: build the image."),
            call("executor", "shell", {"cmd": "docker build ."}, "Successfully built 3f2a9c1e77"),
            handoff("executor", "planner", "Image built."),
            *laps(
                handoff("planner", "executor", "Step 2: deploy to staging."),
                call("executor", "shell", {"cmd": "deploy staging"}, "error: cluster unreachable"),
                handoff("executor", "planner", "Deploy failed: cluster unreachable."),
                times=6,
            ),
        ),
        first_loop_call=10,
    ),
    Thread(
        "swarm-bounce-after-work",
        "swarm",
        "loop",
        "Triage the ticket.",
        (
            call("alice", "read_ticket", {"id": 4821}, "Login fails with error 500."),
            handoff("alice", "bob", "Backend error, yours."),
            call("bob", "read_logs", {"service": "api"}, "NullPointerException in AuthFilter"),
            *laps(
                handoff("bob", "alice", "The auth filter is frontend config, yours."),
                handoff("alice", "bob", "Backend error, yours."),
                times=7,
            ),
        ),
        first_loop_call=8,
    ),
    Thread(
        "supervisor-two-workers-cycle",
        "supervisor",
        "loop",
        "Get the quarterly numbers approved.",
        laps(
            handoff("supervisor", "analyst", "Prepare the numbers."),
            reply("analyst", "Numbers prepared, pending approval."),
            hand_back("analyst"),
            handoff("supervisor", "approver", "Approve the numbers."),
            reply("approver", "Cannot approve: the numbers need analyst sign-off."),
            hand_back("approver"),
            times=5,
        ),
        first_loop_call=9,
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One thread scanned: the calls of the first steer, block and stop."""

    thread: Thread
    steer: int | None
    block: int | None
    stop: int | None

    @property
    def caught(self) -> bool:
        """A loop steered no later than two calls after its labelled first loop call."""
        first = self.thread.first_loop_call
        return first is not None and self.steer is not None and self.steer <= first + 2


def scan(threads: Sequence[Thread] = THREADS) -> list[Outcome]:
    """Scan every thread as `loop-guard scan` reads a file of OpenAI chat messages."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "conversations.json"
        path.write_text(json.dumps([{"messages": t.messages()} for t in threads]), encoding="utf-8")
        conversations = load(path)
    outcomes = []
    for thread, conversation in zip(threads, conversations, strict=True):
        report = scan_conversation(LoopGuardConfig(), conversation)
        steer, block, stop = (report.first(kind) for kind in ("steer", "block", "stop"))
        outcomes.append(Outcome(thread, *(f and f.call_index for f in (steer, block, stop))))
    return outcomes


def targets(outcomes: Sequence[Outcome]) -> dict[str, tuple[int, int, bool]]:
    """Each target: (met, of, held)."""
    clear = [o for o in outcomes if o.thread.label == "loop" and not o.thread.borderline]
    healthy = [o for o in outcomes if o.thread.label == "healthy"]
    caught = sum(o.caught for o in clear)
    blocked = sum(o.block is not None for o in healthy)
    steered = sum(o.steer is not None for o in healthy)
    return {
        "clear loops steered by their labelled call + 2": (
            caught,
            len(clear),
            caught == len(clear),
        ),
        "healthy threads blocked or stopped": (blocked, len(healthy), blocked == 0),
        "healthy threads steered (at most 1 in 10)": (
            steered,
            len(healthy),
            steered * 10 <= len(healthy),
        ),
    }


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def table(outcomes: Sequence[Outcome]) -> str:
    """Markdown: each thread, its label and what the guard would have done."""
    lines = [
        "| thread | shape | label | first loop call | calls | steer / block / stop | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        thread = outcome.thread
        label = f"{thread.label} (borderline)" if thread.borderline else thread.label
        lines.append(
            f"| {thread.name} | {thread.shape} | {label} | {_cell(thread.first_loop_call)} | "
            f"{thread.calls} | {_cell(outcome.steer)} / {_cell(outcome.block)} / "
            f"{_cell(outcome.stop)} | {_verdict(outcome)} |"
        )
    lines += ["", "| target | result | held |", "|---|---|---|"]
    for name, (met, of, held) in targets(outcomes).items():
        lines.append(f"| {name} | {met}/{of} | {'yes' if held else 'no'} |")
    lines += ["", *_named(outcomes)]
    return "\n".join(lines) + "\n"


def _verdict(outcome: Outcome) -> str:
    if outcome.thread.label == "healthy":
        if outcome.block is not None or outcome.stop is not None:
            return "false alarm: blocked"
        return "false alarm: steered" if outcome.steer is not None else "left alone"
    if outcome.caught:
        return "caught"
    return "missed" if outcome.steer is None else "late"


def _named(outcomes: Sequence[Outcome]) -> Iterator[str]:
    """The misses and the false alarms, each with its label's reason."""
    wrong = [o for o in outcomes if _verdict(o) not in ("caught", "left alone")]
    if not wrong:
        yield "No miss, no false alarm."
        return
    yield "Misses and false alarms:"
    yield ""
    for outcome in wrong:
        why = f": {outcome.thread.why}" if outcome.thread.why else ""
        yield f"- {outcome.thread.name} ({_verdict(outcome)}){why}."


def main(argv: list[str] | None = None) -> int:
    """Scan the threads; print the table, optionally write it; exit 1 when a target fails."""
    parser = argparse.ArgumentParser(prog="python -m evals.conversations", description=__doc__)
    parser.add_argument("--write", type=Path, help="also write the Markdown page here")
    args = parser.parse_args(argv)
    outcomes = scan()
    text = table(outcomes)
    sys.stdout.write(text)
    if args.write:
        healthy = sum(o.thread.label == "healthy" for o in outcomes)
        header = (
            "# Evaluation on conversations between agents\n\n"
            "Generated by `python -m evals.conversations --write evals/CONVERSATIONS.md` from "
            f"the {len(outcomes)} labelled threads of `evals/conversations.py` ({healthy} "
            f"healthy, {len(outcomes) - healthy} loops), scanned with the default settings. "
            "Tool calls (handoffs included) are numbered from 1 in each thread; see the "
            "module's docstring for how the labels count.\n\n"
        )
        args.write.write_text(header + text, encoding="utf-8")
    return 0 if all(held for _, _, held in targets(outcomes).values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
