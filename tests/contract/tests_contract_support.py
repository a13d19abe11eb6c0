"""Where the contract tests find PostgreSQL, and how they clean up their schemas."""

from __future__ import annotations

import os

PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def drop_schema(schema: str) -> None:
    """Remove a test's schema and everything in it."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
