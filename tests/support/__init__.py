"""What the test packages share: scripted agents and their drivers, worker processes run
by path, fixtures, and the repository's root."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: README.md, examples/, ...
FIXTURES = Path(__file__).resolve().parent / "fixtures"
