"""Fixtures for the store tests: a started SQLite store on a temporary file, and a way to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from perdure.store import SQLiteStore

T = TypeVar("T")
Call = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def call() -> Iterator[Call[Any]]:
    """Run a coroutine to completion on one event loop kept for the whole test."""
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


@pytest.fixture
def store(db_path: Path) -> Iterator[SQLiteStore]:
    """A migrated SQLite store on a fresh file, stopped after the test."""
    opened = SQLiteStore(str(db_path))
    opened.start()
    yield opened
    opened.stop()
