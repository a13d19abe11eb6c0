"""A bound on how long `start` waits for the store is the caller's: a run that a worker of
the same process takes at once (created claimed) does not inherit it, however long it runs."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import perdure
from live_workers import worker_task
from waits import wait_for_async


def test_a_run_taken_at_its_start_outlives_the_starts_bound(
    app: perdure.App, caplog: pytest.LogCaptureFixture
) -> None:
    """Two runs started with a 0.3 s bound and taken at once by an idle worker here run a
    step of 1 s, then write while the store thread is busy (their writes wait their turn):
    both complete, every write landing at its first try (the bound leaked into their tasks
    refused such writes: "store unavailable", then retried, or failed for good)."""

    @app.step(effect="keyed", name="slow")
    def slow(i: int) -> int:
        time.sleep(1.0)
        # the store thread busy as the step's outcome is written: the write waits its turn
        app.runtime.store.submit(lambda db: time.sleep(0.3), write=False)  # type: ignore[attr-defined]
        return i

    @app.step(effect="keyed", name="after")
    def after(i: int) -> int:
        return i * 10

    @app.workflow(name="long")
    async def long(i: int) -> int:
        return int(await after(await slow(i)))

    async def main() -> list[int]:
        async with worker_task(app, concurrency=2, poll=0.05, lease=30.0) as worker:
            await wait_for_async("the worker idle", worker.nothing_runnable)
            app.runtime.store.busy_timeout = 0.3  # type: ignore[attr-defined]
            handles = [await app.start_async(long, i, run_id=f"b{i}") for i in (1, 2)]
            assert {app.runtime.claimed.get(h.id) is not None for h in handles} == {True}
            return [int(await h.result_async(30)) for h in handles]

    with caplog.at_level(logging.WARNING, logger="perdure.worker"):
        assert asyncio.run(main()) == [10, 20]
    refused = [r.getMessage() for r in caplog.records if "store unavailable" in r.getMessage()]
    assert refused == []
