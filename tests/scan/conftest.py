"""Fixtures of the scan's tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def postgres() -> Iterator[str]:
    """A fresh database of its own on the server at LOOP_GUARD_TEST_POSTGRES_URL, dropped
    afterwards: the URL to it."""
    server = os.environ.get("LOOP_GUARD_TEST_POSTGRES_URL")
    if server is None:
        pytest.skip("no PostgreSQL server: set LOOP_GUARD_TEST_POSTGRES_URL (.ci/postgres.sh)")
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = f"loop_guard_fleet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(server)
    yield "postgresql://{user}:{password}@{host}:{port}/{db}".format(**params, db=name)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
