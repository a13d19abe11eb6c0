"""Services: long-lived loops a worker runs beside its runs (schedulers, folder watchers).

A trigger that watches something is a service (see `engine.triggers`): every worker
process runs each one until it stops. A service that fails is logged and restarted after
a backoff, so one broken trigger never stops a worker from running runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger("perdure.worker")


@runtime_checkable
class Service(Protocol):
    """A loop run by every worker; `run` returns once `worker.stopping` is set."""

    @property
    def name(self) -> str: ...

    async def run(self, worker: Worker) -> None: ...


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
