"""Services: long-lived loops a worker runs beside its runs (schedulers, folder watchers).

A trigger that watches something is a service (see `engine.triggers`): every worker
process runs each one until it stops. A service that fails is logged and restarted after
a backoff, so one broken trigger never stops a worker from running runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger("perdure.worker")
READY_WAIT = 10.0  # seconds a worker's ready line waits for its services to start working


@runtime_checkable
class Service(Protocol):
    """A loop run by every worker; `run` returns once `worker.stopping` is set."""

    @property
    def name(self) -> str: ...

    async def run(self, worker: Worker) -> None: ...


@runtime_checkable
class Starting(Protocol):
    """A service that takes a moment to start working (a consumer connecting to its
    broker): the worker's ready line waits for it, READY_WAIT seconds at most."""

    @property
    def name(self) -> str: ...

    def readiness(self) -> str | None:
        """`starting` until its first attempt ends; then None while it works, else the
        state that keeps it from working (`refused`, `down`, `paused (...)`)."""
        ...


async def not_working(services: Sequence[Starting], stopping: asyncio.Event) -> dict[str, str]:
    """Wait until every service in `services` has started (or failed to), READY_WAIT
    seconds at most, or the worker stops; those not working then, with their state."""
    loop = asyncio.get_running_loop()
    until = loop.time() + READY_WAIT
    while any(s.readiness() == "starting" for s in services):
        if stopping.is_set() or loop.time() >= until:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 0.05)
    found = {s.name: s.readiness() for s in services}
    return {name: state for name, state in found.items() if state is not None}


async def supervise(service: Service, worker: Worker) -> None:
    """Run `service` until the worker stops, restarting it (with backoff) if it fails."""
    backoff = 0.1
    while not worker.stopping.is_set():
        try:
            await service.run(worker)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "worker %s: service %s failed (%s); restarting in %.1fs",
                worker.id,
                service.name,
                exc,
                backoff,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(worker.stopping.wait(), backoff)
        backoff = min(backoff * 2, 30.0)
