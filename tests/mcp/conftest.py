"""Fixtures of tests/mcp: real `perdure mcp --http` processes (serving.py) on a fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import Store, sqlite_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A SQLite store for `perdure mcp --http` processes (`store.serve()`), stopped afterwards."""
    with sqlite_store(tmp_path) as made:
        yield made
