#!/usr/bin/env bash
# A PostgreSQL server for the tests of `loop-guard scan postgresql://...`.
#
# Installs the server (Debian/Ubuntu, as root) when it is missing, starts it on 127.0.0.1 with its
# own data directory (the machine's clusters are left alone), creates the user, password and
# database below, and prints the connection URL on stdout (everything else goes to stderr):
#
#     LOOP_GUARD_TEST_POSTGRES_URL="$(.ci/postgres.sh)"; export LOOP_GUARD_TEST_POSTGRES_URL
#
# Idempotent: a server already answering on the port is reused. Settings (environment):
# LOOP_GUARD_PG_PORT (54329), LOOP_GUARD_PG_DATA (/var/tmp/loop-guard-postgres when root, else
# ~/.cache/loop-guard-postgres), LOOP_GUARD_PG_NO_INSTALL=1 to never run apt-get.
set -euo pipefail

port="${LOOP_GUARD_PG_PORT:-54329}"
name=loop_guard # user, password and database
if [ "$(id -u)" = 0 ]; then
    data="${LOOP_GUARD_PG_DATA:-/var/tmp/loop-guard-postgres}"
else
    data="${LOOP_GUARD_PG_DATA:-${HOME}/.cache/loop-guard-postgres}"
fi
say() { echo "postgres.sh: $*" >&2; }

find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
bin="$(find_bin)"
if [ -z "$bin" ] && command -v pg_ctl > /dev/null; then
    bin="$(dirname "$(command -v pg_ctl)")"
fi
if [ -z "$bin" ]; then
    if [ "${LOOP_GUARD_PG_NO_INSTALL:-0}" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
        say "no PostgreSQL server is installed (install the Debian package 'postgresql')"
        exit 1
    fi
    say "installing PostgreSQL (apt-get install postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >&2
    bin="$(find_bin)"
fi

# The server refuses to run as root: as root, run it as the package's `postgres` user.
run=()
if [ "$(id -u)" = 0 ]; then
    id postgres > /dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
    run=(runuser -u postgres --)
fi

if ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
    if [ ! -s "$data/PG_VERSION" ]; then
        say "creating a database cluster in $data"
        mkdir -p "$data"
        [ "$(id -u)" != 0 ] || chown postgres: "$data"
        chmod 700 "$data"
        "${run[@]}" "$bin/initdb" -D "$data" -U postgres -A trust --auth-host=scram-sha-256 \
            -E UTF8 --locale=C.UTF-8 > /dev/null
    fi
    say "starting PostgreSQL on 127.0.0.1:$port"
    "${run[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $data" start > /dev/null
fi

# The user and its database (local socket, trusted); CREATEDB lets each test use its own database.
psql=("${run[@]}" "$bin/psql" -h "$data" -p "$port" -U postgres -v ON_ERROR_STOP=1 -qtA)
if [ -z "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = '$name'")" ]; then
    "${psql[@]}" -c "CREATE ROLE $name LOGIN CREATEDB PASSWORD '$name'" > /dev/null
fi
if [ -z "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$name'")" ]; then
    "${psql[@]}" -c "CREATE DATABASE $name OWNER $name" > /dev/null
fi
echo "postgresql://$name:$name@127.0.0.1:$port/$name"
