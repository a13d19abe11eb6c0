"""Fixtures of the trigger tests: a database of its own on the machine's PostgreSQL with an
`orders` table, for the table change triggers (perdure's store goes in the same database)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

SERVER = os.environ.get("PERDURE_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture
def database() -> Iterator[str]:
    """The URL of a fresh database with an `orders` table; dropped after the test."""
    import psycopg

    name = f"tc_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    url = f"{SERVER}/{name}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE orders (id SERIAL PRIMARY KEY, item TEXT NOT NULL, qty INT NOT NULL)"
        )
    yield url
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
