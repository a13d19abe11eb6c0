"""A real worker for the lines of a test between its start and its stop: as a task on the
test's event loop, or on a thread and loop of its own (as `perdure worker` runs one)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import perdure


@asynccontextmanager
async def worker_task(
    app: perdure.App,
    options: perdure.WorkerOptions | None = None,
    *,
    stop_within: float = 10.0,
    **kwargs: Any,
) -> AsyncIterator[perdure.Worker]:
    """`app.worker(options, **kwargs)` running as a task of the running loop; on exit it is
    stopped and awaited (its failure, if it failed, raised), within `stop_within` seconds."""
    worker = app.worker(options, **kwargs)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_within)


@contextmanager
def worker_thread(
    app: perdure.App,
    options: perdure.WorkerOptions | None = None,
    *,
    stop_within: float = 20.0,
    **kwargs: Any,
) -> Iterator[perdure.Worker]:
    """`app.worker(options, **kwargs)` running on a thread and event loop of its own while the
    test goes on in this thread; on exit it is stopped and its thread joined."""
    worker = app.worker(options, **kwargs)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(worker.run(),), name="worker", daemon=True
    )
    thread.start()
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(stop_within)
        loop.close()
