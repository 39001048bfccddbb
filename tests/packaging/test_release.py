"""The release as a user gets it: the built wheel installs into a clean environment and runs
the demo, and the metadata says which Pythons the package supports (slow: a fresh venv and
an install from the package index)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path

from tests.support import ROOT


def test_the_built_wheel_installs_in_a_clean_venv_and_runs_the_demo(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path),
         str(ROOT)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    [wheel] = tmp_path.glob("langchain_loop_guard-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[agents]"],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    user_dir = tmp_path / "elsewhere"  # not the source tree: only the wheel can be imported
    user_dir.mkdir()
    done = subprocess.run(
        [str(bin_dir / "loop-guard"), "demo"],
        cwd=user_dir, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Saved 93 model calls and 96 tool runs." in done.stdout
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import loop_guard; print(loop_guard.__file__)"],
        cwd=user_dir, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert str(venv) in where.stdout


def test_the_metadata_names_each_supported_python() -> None:
    """The classifiers list every Python from the floor in Requires-Python to the newest
    one CI tests (.ci/run), and nothing else."""
    info = metadata("langchain-loop-guard")
    assert info["Requires-Python"] == ">=3.10"
    pythons = {
        line.rsplit(" :: ", 1)[1]
        for line in info.get_all("Classifier") or []
        if line.startswith("Programming Language :: Python :: 3.")
    }
    assert pythons == {"3.10", "3.11", "3.12", "3.13"}
    assert ".ci/python.sh 3.13" in (ROOT / ".ci" / "run").read_text()
