"""Durable sleep and the journaled non-deterministic calls: now(), uuid(), random()."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import perdure
from live_workers import worker_task
from perdure.testing import TestClock, TestWorker
from waits import wait_for_async

HOUR = 3600.0


def test_sleep_parks_run_with_wake_at_and_no_lease(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run that sleeps is `sleeping`, has wake_at = now + duration and holds no lease."""

    @app.workflow
    async def nap() -> str:
        await perdure.sleep(timedelta(hours=1))
        return "awake"

    handle = app.start(nap)
    started_at = clock.now()
    assert worker.run_until_idle() == 1
    run = app.get_run(handle.id)
    assert run.status == "sleeping"
    assert run.wake_at == pytest.approx(started_at + HOUR)
    assert run.waiting_for == "timer"
    assert run.lease_owner is None
    assert run.lease_until is None


def test_sleeping_run_does_not_run_before_wake_at(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Nothing after the sleep executes until the clock reaches wake_at; then the run finishes."""
    after: list[float] = []

    @app.step
    def mark() -> None:
        after.append(clock.now())

    @app.workflow
    async def nap() -> str:
        await perdure.sleep(timedelta(hours=1))
        await mark()
        return "awake"

    handle = app.start(nap)
    worker.run_until_idle()
    clock.advance(HOUR - 1)
    assert worker.run_until_idle() == 0
    assert handle.status() == "sleeping"
    assert after == []
    clock.advance(1)
    assert worker.run_until_idle() == 1
    assert handle.status() == "completed"
    assert handle.result(timeout=5) == "awake"
    assert after == [clock.now()]


def test_sync_workflow_sleeps_durably(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A sync workflow's perdure.sleep parks the run the same way and resumes after wake_at."""

    @app.workflow
    def nap(seconds: float) -> str:
        perdure.sleep(seconds)
        return "awake"

    handle = app.start(nap, 90.0)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    assert app.get_run(handle.id).wake_at == pytest.approx(clock.now() + 90.0)
    clock.advance(91)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "awake"


def test_sleep_zero_does_not_park(app: perdure.App, worker: TestWorker) -> None:
    """A zero-length sleep returns at once: the run completes in one pass without parking."""

    @app.workflow
    async def nap() -> int:
        await perdure.sleep(0)
        await perdure.sleep(timedelta(0))
        return 1

    handle = app.start(nap)
    assert worker.run_until_idle() == 1
    assert handle.result(timeout=5) == 1
    assert app.get_run(handle.id).lease_epoch == 1  # claimed once: never parked


def test_successive_sleeps_each_park(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Two sleeps in a row park twice; the second wake_at counts from when the first ended."""

    @app.workflow
    async def naps() -> str:
        await perdure.sleep(60)
        await perdure.sleep(120)
        return "done"

    handle = app.start(naps)
    t0 = clock.now()
    worker.run_until_idle()
    assert app.get_run(handle.id).wake_at == pytest.approx(t0 + 60)
    clock.advance(70)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "sleeping"
    assert run.wake_at == pytest.approx(t0 + 70 + 120)
    clock.advance(120)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"


def test_sleep_survives_a_restart(db_url: str, clock: TestClock) -> None:
    """A sleeping run wakes in a brand-new App and worker on the same store file."""

    def register(application: perdure.App) -> perdure.Workflow[[], str]:
        @application.workflow(name="nap")
        async def nap() -> str:
            await perdure.sleep(timedelta(days=2))
            return "rested"

        return nap

    first = perdure.App(db_url, clock=clock)
    handle = first.start(register(first), run_id="nap-1")
    TestWorker(first).run_until_idle()
    assert handle.status() == "sleeping"
    first.close()

    clock.advance(timedelta(days=2, seconds=1))
    second = perdure.App(db_url, clock=clock)
    try:
        register(second)
        assert TestWorker(second).run_until_idle() == 1
        assert second.handle("nap-1").result(timeout=5) == "rested"
    finally:
        second.close()


def test_now_uuid_random_replay_identically(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """now(), uuid() and random() return on replay exactly the values of the first execution."""

    @app.step
    def keep(values: list[Any]) -> list[Any]:
        return values

    @app.workflow
    async def draw() -> dict[str, Any]:
        values = [perdure.now().isoformat(), str(perdure.uuid()), perdure.random()]
        first = await keep(values)
        await perdure.sleep(timedelta(days=1))
        # On resumption the workflow runs from the top: these calls are replays.
        return {"first": first, "replayed": values, "later": perdure.now().isoformat()}

    start = datetime.fromtimestamp(clock.now(), UTC)
    handle = app.start(draw)
    worker.run_until_idle()
    clock.advance(timedelta(days=1, minutes=5))
    worker.run_until_idle()
    out = handle.result(timeout=5)
    assert out["replayed"] == out["first"]
    assert out["first"][0] == start.isoformat()
    assert 0.0 <= out["first"][2] < 1.0
    # A call first made after the resumption sees the new time, not the old one.
    assert datetime.fromisoformat(out["later"]) == start + timedelta(days=1, minutes=5)


def test_now_is_utc_and_comes_from_the_clock(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """perdure.now() is a timezone-aware UTC datetime equal to the engine clock's time."""
    clock.set(datetime(2030, 6, 1, 12, 30, tzinfo=UTC))

    @app.workflow
    def when() -> str:
        moment = perdure.now()
        assert moment.tzinfo is not None and moment.utcoffset() == timedelta(0)
        return moment.isoformat()

    handle = app.start(when)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "2030-06-01T12:30:00+00:00"


def test_uuid_and_random_differ_between_runs(app: perdure.App, worker: TestWorker) -> None:
    """Journaling does not make uuid()/random() constant: two runs draw different values."""

    @app.workflow
    def draw() -> list[Any]:
        return [str(perdure.uuid()), perdure.random()]

    first, second = app.start(draw), app.start(draw)
    worker.run_until_idle()
    a, b = first.result(timeout=5), second.result(timeout=5)
    assert a[0] != b[0]
    assert a[1] != b[1]


def test_sleeping_run_holds_no_worker_slot(app: perdure.App) -> None:
    """A worker with concurrency=1 runs other runs while one run sleeps."""

    @app.workflow
    async def nap() -> str:
        await perdure.sleep(timedelta(hours=1))
        return "awake"

    @app.workflow
    async def quick(i: int) -> int:
        return i * 2

    async def main() -> None:
        async with worker_task(app, concurrency=1, lease=3, poll=0.02) as worker:
            sleeper = await app.start_async(nap)

            async def parked() -> bool:
                return await sleeper.status_async() == "sleeping"

            await wait_for_async("the run asleep", parked)
            others = [await app.start_async(quick, i) for i in range(3)]
            results = [await h.result_async(timeout=10) for h in others]
            assert results == [0, 2, 4]
            assert await sleeper.status_async() == "sleeping"
            assert sleeper.id not in worker.tasks

    asyncio.run(main())
