"""Fixtures: observers installed for one test only, logs captured as lines, fresh metrics."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from perdure.engine import observers
from perdure.observe import metrics as metrics_module
from perdure.observe.logs import configure_logging
from perdure.observe.metrics import Metrics


@pytest.fixture(autouse=True)
def no_observers() -> Iterator[None]:
    """Every observer a test installs is gone after it, and so is its logging setup."""
    before = observers.installed()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for observer in observers.installed():
        if observer not in before:
            observers.uninstall(observer)
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog = sys.modules.get("structlog")  # imported (the observe extra) only if configured
    if structlog is not None:
        structlog.reset_defaults()


@pytest.fixture
def log_lines() -> io.StringIO:
    """Logs of this test as JSON lines, DEBUG and up."""
    stream = io.StringIO()
    configure_logging(json=True, level="DEBUG", stream=stream)
    return stream


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> Metrics:
    """This process's metrics, fresh for this test (and what /metrics serves)."""
    fresh = Metrics()
    monkeypatch.setattr(metrics_module, "_default", fresh)
    observers.install(fresh)
    return fresh
