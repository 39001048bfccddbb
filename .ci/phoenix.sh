#!/usr/bin/env bash
# A Phoenix server for the tests of `loop-guard scan phoenix://...`.
#
# Installs Arize Phoenix into a virtual environment of its own (outside the tree: its
# dependencies are not the package's), starts it on 127.0.0.1 with its default SQLite storage in
# a fresh working directory, waits until it answers, and prints its URL on stdout (everything
# else goes to stderr):
#
#     LOOP_GUARD_TEST_PHOENIX_URL="$(.ci/phoenix.sh)"; export LOOP_GUARD_TEST_PHOENIX_URL
#
# Idempotent: a server already answering on the port is reused, an installed environment too.
# Settings (environment): LOOP_GUARD_PHOENIX_PORT (6019; gRPC on the next port),
# LOOP_GUARD_PHOENIX_VENV (/var/tmp/loop-guard-phoenix when root, else
# ~/.cache/loop-guard-phoenix), LOOP_GUARD_PHOENIX_UV (a uv to install with instead of pip).
set -euo pipefail

port="${LOOP_GUARD_PHOENIX_PORT:-6019}"
release="20.26.1" # the release the tests were run against
if [ "$(id -u)" = 0 ]; then
    venv="${LOOP_GUARD_PHOENIX_VENV:-/var/tmp/loop-guard-phoenix}"
else
    venv="${LOOP_GUARD_PHOENIX_VENV:-${HOME}/.cache/loop-guard-phoenix}"
fi
url="http://127.0.0.1:$port"
say() { echo "phoenix.sh: $*" >&2; }
answers() {
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "$url/healthz" 2> /dev/null
}

if ! answers; then
    if [ ! -x "$venv/bin/phoenix" ]; then
        say "installing arize-phoenix $release into $venv"
        python3 -m venv "$venv"
        if [ -n "${LOOP_GUARD_PHOENIX_UV:-}" ]; then # CI's uv: the same install, in seconds
            "$LOOP_GUARD_PHOENIX_UV" pip install --quiet --python "$venv/bin/python" \
                "arize-phoenix==$release" >&2
        else
            "$venv/bin/python" -m pip install --quiet "arize-phoenix==$release" >&2
        fi
    fi
    work="$(mktemp -d)"
    say "starting Phoenix on $url (working directory $work)"
    PHOENIX_WORKING_DIR="$work" PHOENIX_HOST=127.0.0.1 PHOENIX_PORT="$port" \
        PHOENIX_GRPC_PORT="$((port + 1))" PHOENIX_TELEMETRY_ENABLED=false \
        nohup "$venv/bin/phoenix" serve > "$work/server.log" 2>&1 &
    for _ in $(seq 300); do
        answers && break
        sleep 1
    done
    if ! answers; then
        say "Phoenix did not answer within 300 s; its log ends:"
        tail -n 20 "$work/server.log" >&2
        exit 1
    fi
fi
echo "$url"
