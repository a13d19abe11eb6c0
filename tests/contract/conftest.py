"""The store contract fixtures: every test here runs once per store (SQLite, PostgreSQL).

PostgreSQL tests use the machine's server (PERDURE_TEST_PG, default the local
`test` database) and a schema of their own, dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests_contract_support import PG_URL, drop_schema

import perdure
from perdure.store import open_store
from perdure.store.base import Store
from perdure.testing import TestClock


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL naming a fresh, empty store of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/contract.db"
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    drop_schema(schema)


@pytest.fixture
def new_store(store_url: str) -> Iterator[Callable[[], Store]]:
    """Open stores on the same database (as separate processes would); closed after the test."""
    opened: list[Store] = []

    def make() -> Store:
        store = open_store(store_url, environ={})
        store.start()  # type: ignore[attr-defined]
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.stop()  # type: ignore[attr-defined]


@pytest.fixture
def store(new_store: Callable[[], Store]) -> Store:
    return new_store()


@pytest.fixture
def any_app(store_url: str) -> Iterator[perdure.App]:
    """An App on each kind of store, driven by a TestClock."""
    app = perdure.App(store_url, clock=TestClock())
    yield app
    app.close()
