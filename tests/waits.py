"""Waiting in a test for what another process, thread or task does, without sleeping blind."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    what: str,
    until: Callable[[], T],
    log: Path | None = None,
    timeout: float = 30.0,
    every: float = 0.02,
) -> T:
    """Poll `until` every `every` seconds until it returns something truthy, and return that;
    after `timeout` seconds a failure naming `what` (and the end of a worker's `log`: what it
    did instead)."""
    deadline = time.monotonic() + timeout
    while not (value := until()):
        if time.monotonic() > deadline:
            seen = f"; worker log:\n{log.read_text()}" if log is not None else ""
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}{seen}")
        time.sleep(every)
    return value


async def wait_for_async(
    what: str,
    until: Callable[[], Any | Awaitable[Any]],
    timeout: float = 10.0,
    every: float = 0.02,
) -> Any:
    """`wait_for` on the test's event loop: `until` may be a coroutine function (a read of
    the store, say), and the loop runs (a worker task, say) between two polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = until()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(every)
