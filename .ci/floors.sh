#!/usr/bin/env bash
# The dependency floors of pyproject.toml, kept true: the lowest versions they allow, each in a
# fresh virtual environment outside the tree. uv installs every direct requirement at its floor
# (--resolution lowest-direct) and the package's own requirements exactly at theirs (pins from
# .ci/floors.py), so that a newer release of something else cannot lift one unseen.
#   1. As a user installs it, `pip install "langchain-loop-guard[agents]"`: the demo runs.
#   2. With every extra and the dev tools: the suite (pytest's arguments are this script's:
#      CI passes the quick subset), then the README's install line in a fresh environment.
# Both run on the oldest Python supported, 3.10: the oldest versions together.
set -euo pipefail
cd "$(dirname "$0")/.."

work="$(mktemp -d)"
oldest="$(.ci/python.sh 3.10)"
python3 -m venv "$work/uv"
"$work/uv/bin/python" -m pip install --quiet uv

lowest() { # lowest VENV EXTRA...: the package and these extras at their floors, in VENV
    local venv="$1" extras
    shift
    extras="$(IFS=,; echo "$*")"
    "$oldest" -m venv "$venv"
    python3 .ci/floors.py pins "$@" > "$venv/floors.txt"
    echo "floors.sh: .[$extras] with" $(cat "$venv/floors.txt")
    # Bytecode compiled, as pip does: the tests start many processes (.ci/run says why).
    "$work/uv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" \
        --resolution lowest-direct --constraint "$venv/floors.txt" -e ".[$extras]"
}

lowest "$work/user" agents
(cd "$work" && "$work/user/bin/python" -m loop_guard demo > /dev/null)

IFS=, read -r -a extras <<< "$(python3 .ci/floors.py extras)"
lowest "$work/all" "${extras[@]}"
"$work/all/bin/pytest" "$@"
# The README's install line and its snippets, on the oldest Python (a fresh environment).
"$work/all/bin/pytest" -p no:cacheprovider tests/packaging/test_readme.py

rm -rf "$work"
