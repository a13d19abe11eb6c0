"""Waiting in a test for what another process or thread does, without sleeping blind."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest


def wait_for(
    what: str, until: Callable[[], bool], log: Path | None = None, timeout: float = 30.0
) -> None:
    """Poll `until`; after `timeout` seconds a failure naming `what` (and the end of a
    worker's `log`: what it did instead)."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            seen = f"; worker log:\n{log.read_text()}" if log is not None else ""
            pytest.fail(f"timed out waiting for {what}{seen}")
        time.sleep(0.02)
