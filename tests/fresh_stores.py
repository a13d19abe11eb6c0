"""A fresh store of each kind for a test: a SQLite file in its tmp_path, or a schema of its
own on the machine's PostgreSQL, dropped after."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from extras_needed import needs

PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def fresh_store_url(kind: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh store of `kind` ("sqlite" or "postgres")."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
        return
    psycopg = pytest.importorskip("psycopg", reason=needs("postgres"))
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
