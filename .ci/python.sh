#!/usr/bin/env bash
# python.sh MINOR: the path of an interpreter for Python MINOR (3.10, 3.13), from pyenv's
# versions or the PATH; fails when the machine has none, so CI never skips a supported version.
set -euo pipefail
minor="$1"
for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$minor".*/bin/python "$(command -v "python$minor" || true)"; do
    if [[ -x "$candidate" ]] && "$candidate" -c 'import sys; sys.exit(0)' 2>/dev/null; then
        echo "$candidate"
        exit 0
    fi
done
echo "python.sh: no Python $minor on this machine" >&2
exit 1
