"""Shared fixtures: a driven clock, an App on a fresh SQLite file, an in-process worker, a
fresh PostgreSQL schema; a `postgres` test skips without the postgres extra, and the plugin
that fails a CI session in which a test skipped for a missing extra."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.testing import TestClock, TestWorker

# Loaded before anything imports it (so that pytest may rewrite its asserts): the fixtures
# and hooks below import it, and fresh_stores, when they run.
pytest_plugins = ["extras_needed"]


@pytest.fixture
def clock() -> TestClock:
    """A clock that only moves when the test advances it."""
    return TestClock()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """The URL of a fresh SQLite store file for this test."""
    return f"sqlite:///{tmp_path}/x.db"


@pytest.fixture
def app(db_url: str, clock: TestClock) -> Iterator[perdure.App]:
    """An App on a fresh store, driven by `clock`; closed after the test."""
    application = perdure.App(db_url, clock=clock)
    yield application
    application.close()


@pytest.fixture
def worker(app: perdure.App) -> TestWorker:
    """An in-process worker for `app`; `worker.run_until_idle()` runs everything runnable."""
    return TestWorker(app)


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh schema on the machine's PostgreSQL, dropped after the test."""
    from fresh_stores import fresh_store_url

    with fresh_store_url("postgres", tmp_path) as url:
        yield url


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `postgres` needs the postgres extra (the store's driver): without it,
    it skips naming the extra."""
    if item.get_closest_marker("postgres") is not None:
        from extras_needed import require

        require("postgres")


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server that keeps the JSON bodies POSTed to it (an alert hook's)."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            bodies.append(json.loads(self.rfile.read(length)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/alerts", bodies
    finally:
        server.shutdown()
