"""Peers: the published LangChain loop guards, side by side with ours.

With `--peers`, a throwaway venv (`benchmarks/.peers-venv`, git-ignored) gets the same
LangChain/LangGraph versions as this environment plus the peers from PyPI, and
`peers_worker.py` runs there (our package comes from this checkout via PYTHONPATH, so
both are measured in one process). Without `--peers` (and in `--quick`), only our guard
and the unguarded agent run, in-process, so the harness itself never rots.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from _harness import HERE, REPO, Scale, Section, Target, print_flush, ratio, us

PEERS = ("able-harness-kit", "langchain-tool-recover", "loopguard-runtime")
FRAMEWORK = (
    "langchain",
    "langchain-core",
    "langgraph",
    "langgraph-prebuilt",
    "langgraph-checkpoint",
)
VENV = HERE / ".peers-venv"


def _pip(python: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pip", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def availability() -> dict[str, str]:
    """Each peer: 'available <file>' or why `pip download` could not get it."""
    found: dict[str, str] = {}
    for name in PEERS:
        with tempfile.TemporaryDirectory() as folder:
            done = _pip(sys.executable, "download", "--no-deps", "-q", "-d", folder, name)
            files = sorted(p.name for p in Path(folder).iterdir())
        if done.returncode == 0 and files:
            found[name] = f"available ({files[0]})"
        else:
            reason = (done.stderr or done.stdout).strip().splitlines()
            found[name] = "not installable from PyPI here: " + (reason[-1] if reason else "?")
    return found


def setup_venv(peers: list[str]) -> tuple[str, list[str]]:
    """The venv's python, and notes on what could not be installed."""
    notes: list[str] = []
    python = str(VENV / "bin" / "python")
    if not Path(python).exists():
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True, check=False
        )
        if made.returncode != 0:
            raise RuntimeError(f"could not create {VENV}: {made.stderr.strip()}")
    pins = [f"{name}=={metadata.version(name)}" for name in FRAMEWORK]
    done = _pip(python, "install", "-q", *pins, *peers)
    if done.returncode != 0:  # try each peer alone, to name the one that fails
        _pip(python, "install", "-q", *pins)
        for peer in peers:
            alone = _pip(python, "install", "-q", *pins, peer)
            if alone.returncode != 0:
                last = (alone.stderr or alone.stdout).strip().splitlines()
                notes.append(f"{peer} failed to install: {last[-1] if last else '?'}")
    return python, notes


def run_worker(python: str, scale: Scale) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            python,
            str(HERE / "peers_worker.py"),
            "--healthy-steps",
            str(scale.peer_healthy_steps),
            "--stubborn-limit",
            str(scale.peer_stubborn_limit),
            "--rounds",
            str(scale.peer_rounds),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"peers_worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _stubborn_cell(outcome: dict[str, Any]) -> str:
    return (
        f"{outcome['model_calls']} model calls, {outcome['tool_runs']} tool runs: {outcome['how']}"
    )


def run(scale: Scale, *, peers: bool) -> Section:
    section = Section(
        key="peers",
        title="Peers",
        what=(
            "The same scripted agents through each published loop guard that plugs into"
            " LangChain, each attached as its README says, with its defaults, a fresh"
            " instance per run. **Stubborn**: the model repeats one call forever, either"
            " reading a missing file (an error result) or looking up the same record (the"
            " same successful result); recursion limit"
            f" {scale.peer_stubborn_limit}, so an unstopped run with no extra graph node makes"
            f" {scale.peer_stubborn_limit // 2} model calls. **Healthy**: legitimate"
            " repetition — distinct reads, a poll whose result advances (same args 12 times),"
            " pagination, lookups that all answer 'no such record', parallel reads, a"
            " verification re-read; an *intervention* is any tool result the tool did not"
            " produce, any message the model did not write, or a run that did not finish."
            f" **Overhead**: a healthy {scale.peer_healthy_steps}-step run of distinct calls,"
            f" added wall time per step against no guard (median of {scale.peer_rounds}"
            " interleaved rounds)."
        ),
        columns=[
            "guard",
            "version",
            "stubborn, error result",
            "stubborn, same OK result",
            "healthy: interventions",
            "added / step",
            "vs ours",
        ],
    )
    if peers:
        found = availability()
        section.notes += [f"`{name}`: {state}." for name, state in found.items()]
        installable = [name for name, state in found.items() if state.startswith("available")]
        python, notes = setup_venv(installable)
        section.notes += notes
        print_flush("  peers installed; running the worker …")
        result = run_worker(python, scale)
    else:
        from peers_worker import measure

        result = measure(
            scale.peer_healthy_steps, scale.peer_stubborn_limit, scale.peer_rounds, peers=False
        )
        section.notes.append(
            "Peers not run: pass `--peers` (needs PyPI) to install and measure them."
        )
    guards = result["guards"]
    ours = guards["loop_guard (ours)"]
    for name, info in guards.items():
        if "error" in info:
            section.rows.append([name, info["version"], info["error"], "—", "—", "—", "—"])
            continue
        healthy, added = info["healthy"], info["added_per_step_s"]
        base = name == "no guard"
        versus = "—"
        if not base and ours["added_per_step_s"] > 0:
            versus = ratio(added / ours["added_per_step_s"]) if added > 0 else "≈ 0"
        section.rows.append(
            [
                name,
                info["version"] or "—",
                _stubborn_cell(info["stubborn"]),
                _stubborn_cell(info["stubborn_ok"]),
                f"{healthy['interventions']} ({healthy['ended']})",
                "—" if base else (us(added) if added > 0 else "≤ 0 (within noise)"),
                versus,
            ]
        )
    section.targets.append(
        Target(
            name="ours stops the stubborn agent cleanly",
            goal="stopped, with a final message",
            measured=f"{ours['stubborn']['how']}, {ours['stubborn']['model_calls']} model calls",
            holds=ours["stubborn"]["how"].startswith("ended cleanly"),
        )
    )
    section.targets.append(
        Target(
            name="ours leaves the healthy agent alone",
            goal="0 interventions",
            measured=str(ours["healthy"]["interventions"]),
            holds=ours["healthy"]["interventions"] == 0,
        )
    )
    section.notes.append(
        "The peers' overhead runs use the same healthy distinct-call agent; a guard that"
        " intervened there would be flagged in its healthy column first."
    )
    return section
