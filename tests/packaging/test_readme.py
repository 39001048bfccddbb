"""The README's Python snippets run as written, and print what their comments say.

They run in order in one namespace that starts empty: the first defines the scripted model and
the tool the others use, as a reader copying them would.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loop_guard import Steer
from loop_guard.marks import GUARD_NAME
from tests.support import ROOT
from tests.support.snippets import DEEPAGENTS, snippets

README = ROOT / "README.md"
# `print(...)  # what it prints`: the comment is the start of the line printed.
SHOWN = re.compile(r"^\s*print\(.*\)  # (.+)$", re.MULTILINE)
STOP = "Stopped by loop_guard: the agent kept calling `read_file`"
FIRST_SCREEN = 40  # lines


def test_every_readme_snippet_runs_and_prints_what_it_shows() -> None:
    """Each face ends the stubborn agent's request, the engine's session steers at the 3rd
    identical result, and each printed line starts as the snippet's comment says."""
    found = snippets(README)
    assert len(found) >= 5  # one per face
    namespace: dict[str, Any] = {}
    printed: list[str] = []
    for number, snippet in enumerate(found):
        if "deepagents" in snippet and not DEEPAGENTS:
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(snippet, f"{README}, snippet {number + 1}", "exec"), namespace)
        lines = out.getvalue().splitlines()
        shown = SHOWN.findall(snippet)
        assert len(lines) == len(shown), (snippet, lines)
        for line, start in zip(lines, shown, strict=True):
            assert line.startswith(start), (line, start)
        if number == 0:  # the middleware, as in the demo: 7 model calls
            assert namespace["model"].calls == 7
        printed += lines
    stops = [line for line in printed if line.startswith(STOP)]
    # The middleware, the person who stops the asking one, the graph, the handler, the
    # deep agent.
    assert len(stops) == (5 if DEEPAGENTS else 4)
    assert namespace["result"]["messages"][-1].name == GUARD_NAME
    steer = namespace["steer"]
    assert isinstance(steer, Steer)
    assert steer.streak == 3


def test_the_first_screen_shows_the_install_and_the_one_line() -> None:
    """Within its first lines the README gives the Install section's command and shows, in a
    snippet that compiles, the one line a `create_agent` user adds."""
    text = README.read_text()
    install = re.search(r"## Install\n.*?```bash\n(pip install [^\n#]*?)\s*(#|\n)", text, re.DOTALL)
    assert install, "the Install section has no pip command"
    first_screen = "\n".join(text.splitlines()[:FIRST_SCREEN])
    assert install[1] in first_screen
    shown = re.search(r"```py\n(.*?)```", first_screen, re.DOTALL)
    assert shown, "no snippet on the first screen"
    assert "middleware=[LoopGuardMiddleware()]" in shown[1]
    compile(shown[1], f"{README}, first screen", "exec")


# Runs in the fresh environment: the README's `python` snippets, in order, in one namespace.
RUN_SNIPPETS = """
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
namespace = {}
ran = 0
for number, snippet in enumerate(re.findall(r"```python\\n(.*?)```", text, re.DOTALL)):
    if "deepagents" in snippet and sys.version_info < (3, 11):
        continue  # the README says so: the deepagents extra needs Python 3.11
    exec(compile(snippet, f"README.md, snippet {number + 1}", "exec"), namespace)
    ran += 1
print("ran", ran)
"""


@pytest.mark.slow
def test_the_snippets_run_after_the_readmes_own_install_line(tmp_path: Path) -> None:
    """A reader who runs the install line of "Use it" in a fresh environment can run every
    snippet, in order: the line brings what they import (the deepagents extra included)."""
    text = README.read_text()
    use = text[text.index("## Use it") :]
    line = re.search(r"```bash\n(pip install [^\n]+)\n```", use)
    assert line is not None
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = shlex.split(line.group(1))
    done = subprocess.run(
        [str(python), "-m", *install, "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    script = tmp_path / "run_snippets.py"
    script.write_text(RUN_SNIPPETS)
    ran = subprocess.run(
        [str(python), str(script), str(README)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    skipped = sum("deepagents" in snippet for snippet in snippets(README))
    expected = len(snippets(README)) - (skipped if sys.version_info < (3, 11) else 0)
    assert ran.stdout.strip().splitlines()[-1] == f"ran {expected}"
