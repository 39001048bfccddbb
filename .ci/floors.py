"""The dependency floors of pyproject.toml, for .ci/floors.sh.

    python3 .ci/floors.py extras          every extra but those of UNFLOORED, comma-separated
    python3 .ci/floors.py pins EXTRA...   constraints (name==floor) for the installer

A pin is written for each of the package's own requirements (`[project].dependencies` and the
`agents` extra): the highest floor (`>=`) that `[project]` and the given extras declare for it.
Each of those must have a floor, written as a plain release number.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)")
FLOOR = re.compile(r">=\s*([^,\s]+)")
# Extras the floors run never installs: tools for the repository, not for the package's users.
UNFLOORED = {"docs"}


def parse(requirement: str) -> tuple[str, tuple[int, ...] | None]:
    """The normalized name of a requirement and its floor, if it has one."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        sys.exit(f"floors.py: cannot read the requirement {requirement!r}")
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    found = FLOOR.search(match.group(3))
    if found is None:
        return name, None
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", found.group(1)):
        sys.exit(f"floors.py: {requirement!r}: the floor is not a plain release number")
    return name, tuple(int(part) for part in found.group(1).split("."))


def main(argv: list[str]) -> None:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    if argv == ["extras"]:
        print(",".join(extra for extra in extras if extra not in UNFLOORED))
        return
    if not argv or argv[0] != "pins" or not set(argv[1:]) <= set(extras):
        sys.exit(__doc__)
    declared = [parse(r) for r in project["dependencies"]]
    declared += [parse(r) for extra in argv[1:] for r in extras[extra]]
    for requirement in project["dependencies"] + extras.get("agents", []):
        name, own = parse(requirement)
        if own is None:
            sys.exit(f"floors.py: {requirement!r} has no floor (>=)")
        highest = max([own] + [f for n, f in declared if n == name and f is not None])
        print(f"{name}=={'.'.join(map(str, highest))}")


if __name__ == "__main__":
    main(sys.argv[1:])
