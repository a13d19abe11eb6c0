"""Fixtures of the agent tests: a fresh store of each kind, and a counting model server slow
enough that concurrent first calls overlap (files that want another latency define their own)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from wire_servers import CountingServer

PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def server() -> Iterator[CountingServer]:
    s = CountingServer(latency=0.3).start()  # long enough for all first calls to overlap
    yield s
    s.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, or a fresh schema on the machine's PostgreSQL (dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
        return
    schema = f"t_agent_{uuid.uuid4().hex[:10]}"
    yield f"{PG_URL}?schema={schema}"
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
