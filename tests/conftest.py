"""Shared fixtures: a driven clock, an App on a fresh SQLite file, and an in-process worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure.testing import TestClock, TestWorker


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
