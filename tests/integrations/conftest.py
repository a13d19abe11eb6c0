"""Fixtures of the integration tests: a fresh store of each kind for the kill tests, the
scripted OpenAI-compatible server, and a real worker on its own thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents_support import wire_servers

import perdure
from fresh_stores import fresh_store_url
from live_workers import worker_thread


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, or a fresh schema on the machine's PostgreSQL (dropped after)."""
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def server() -> Iterator[Any]:
    """The scripted OpenAI-compatible server on 127.0.0.1 (tests/agent/wire_servers.py)."""
    running = wire_servers().OpenAIServer().start()
    yield running
    running.stop()


@pytest.fixture
def live_worker(app: perdure.App) -> Iterator[perdure.Worker]:
    """A real worker on its own thread and loop, as `perdure worker` runs one."""
    with worker_thread(app, poll=0.02, gc_every=None) as worker:
        yield worker
