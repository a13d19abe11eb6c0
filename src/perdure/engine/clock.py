"""The one clock all engine time comes from: UTC epoch seconds, drivable in tests.

On a store with a server of its own (PostgreSQL) the engine reads the server's time:
this host's clock plus the offset last measured against the server. Leases, timers,
schedule ticks, deadlines and journal times then mean the same on every host of the
store, whatever each host's clock says; a skewed host is told so (`MAX_SKEW`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from ..store.dialect import server_time

if TYPE_CHECKING:
    from ..store.roles import Store

MAX_SKEW = 1.0  # seconds between this host's clock and the store server's worth a warning


class Clock(Protocol):
    """A source of UTC time in epoch seconds."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock UTC time, set to the store server's where there is one (`offset`)."""

    def __init__(self) -> None:
        self.offset = 0.0  # seconds the store server's clock is ahead of this host's

    def now(self) -> float:
        return time.time() + self.offset


async def follow_server(clock: Clock, store: Store) -> float | None:
    """Set a SystemClock to `store`'s server time; the offset found (server minus this
    host), or None when the store has no clock of its own (SQLite: one host) or the
    clock is driven (tests). The best of three round trips, halved, is the estimate."""
    if not isinstance(clock, SystemClock):
        return None
    best: tuple[float, float] | None = None
    for _ in range(3):
        sent = time.time()
        server = await store.run_sql(server_time, write=False)
        got = time.time()
        if server is None:
            return None
        if best is None or got - sent < best[0]:
            best = (got - sent, server - (sent + got) / 2)
    assert best is not None
    clock.offset = best[1]
    return clock.offset
