"""Fixtures of the deployment tests: a PostgreSQL server and fresh threads on it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def postgres_url() -> str:
    """LOOP_GUARD_TEST_POSTGRES_URL, with LangGraph's tables set up; skip without a server."""
    pytest.importorskip("langgraph.checkpoint.postgres", reason="needs the [postgres] extra")
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    url = os.environ.get("LOOP_GUARD_TEST_POSTGRES_URL")
    if not url:
        pytest.skip(
            "no PostgreSQL server: set LOOP_GUARD_TEST_POSTGRES_URL, e.g. "
            'LOOP_GUARD_TEST_POSTGRES_URL="$(.ci/postgres.sh)"'
        )
    try:
        with psycopg.connect(url, connect_timeout=10):
            pass
    except psycopg.OperationalError as error:
        pytest.skip(
            f"the PostgreSQL server at LOOP_GUARD_TEST_POSTGRES_URL does not answer: {error}"
        )
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    return url


@pytest.fixture
def new_thread(postgres_url: str) -> Iterator[Any]:
    """Fresh thread ids (so tests never share a thread), deleted after the test."""
    from langgraph.checkpoint.postgres import PostgresSaver

    made: list[str] = []

    def make() -> str:
        made.append(f"workers-{uuid.uuid4()}")
        return made[-1]

    yield make
    with PostgresSaver.from_conn_string(postgres_url) as saver:
        for thread in made:
            saver.delete_thread(thread)
