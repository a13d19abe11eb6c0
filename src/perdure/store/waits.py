"""A caller's bound on how long its store operations may wait, e.g. for SQLite's write lock.

`App.start(timeout=...)` sets one around its store calls. An operation the store has not
begun when the bound passes is never begun: its caller gets `StoreUnavailable` saying who
holds the store, and nothing of it is written. Other callers (workers) wait as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bound:
    """`seconds` from when it was set, ending at `until` (time.monotonic())."""

    seconds: float
    until: float

    def left(self) -> float:
        return max(0.0, self.until - time.monotonic())


_bound: ContextVar[Bound | None] = ContextVar("perdure_store_wait_bound", default=None)


def current() -> Bound | None:
    """The bound the calling task set, if any."""
    return _bound.get()


@contextmanager
def bounded(seconds: float | None) -> Iterator[Bound | None]:
    """Bound the store operations awaited inside (None: no bound)."""
    if seconds is None:
        yield None
        return
    bound = Bound(seconds, time.monotonic() + seconds)
    token = _bound.set(bound)
    try:
        yield bound
    finally:
        _bound.reset(token)
