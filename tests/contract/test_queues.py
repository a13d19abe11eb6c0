"""Queues on every store: global and per-worker limits, rate, priority and partition keys."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import perdure
from perdure.testing import TestClock, TestWorker


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def held_intervals(app: perdure.App, run_ids: list[str]) -> list[tuple[float, float]]:
    """From each journal: when the run's step started (its intent) until the run completed."""
    spans = []
    for run_id in run_ids:
        entries = app.journal(run_id)
        start = next(e.at for e in entries if e.kind == "step.intent")
        end = next(e.at for e in entries if e.kind == "run.completed")
        spans.append((start, end))
    return spans


def test_a_concurrency_2_queue_never_runs_3_across_workers(store_url: str) -> None:
    """Two apps (as two processes) with four slots each never run three runs of the queue."""
    apps = [perdure.App(store_url), perdure.App(store_url)]
    for app in apps:
        app.queue("narrow", concurrency=2)

        @app.step(name="hold")
        async def hold() -> None:
            await asyncio.sleep(0.15)

        @app.workflow(name="job", queue="narrow")
        async def job() -> str:
            await hold()
            return "ok"

    run_ids = [apps[0].start("job").id for _ in range(8)]

    async def main() -> None:
        workers = [app.worker(concurrency=4, poll=0.02) for app in apps]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:
            for run_id in run_ids:
                assert await apps[0].client.result(run_id, timeout=30) == "ok"
        finally:
            for w in workers:
                w.stop()
            await asyncio.gather(*tasks)

    try:
        asyncio.run(main())
        overlap = max_overlap(held_intervals(apps[0], run_ids))
        assert overlap == 2, overlap  # the limit holds, and is used
    finally:
        for app in apps:
            app.close()


def test_runs_sharing_a_partition_key_run_one_at_a_time(store_url: str) -> None:
    """Runs of one user (partition key) never overlap; other users' runs proceed meanwhile."""
    app = perdure.App(store_url)

    @app.step(name="hold")
    async def hold() -> None:
        await asyncio.sleep(0.1)

    @app.workflow(name="job")
    async def job() -> str:
        await hold()
        return "ok"

    ana = [app.start("job", partition_key="user-ana").id for _ in range(3)]
    bo = [app.start("job", partition_key="user-bo").id for _ in range(3)]

    async def main() -> None:
        worker = app.worker(concurrency=6, poll=0.02)
        task = asyncio.create_task(worker.run())
        try:
            for run_id in ana + bo:
                await app.client.result(run_id, timeout=30)
        finally:
            worker.stop()
            await task

    try:
        asyncio.run(main())
        assert max_overlap(held_intervals(app, ana)) == 1
        assert max_overlap(held_intervals(app, bo)) == 1
        assert max_overlap(held_intervals(app, ana + bo)) == 2
    finally:
        app.close()


def test_higher_priority_runs_are_claimed_first(any_app: perdure.App) -> None:
    """In a one-at-a-time queue, a later high-priority run goes before waiting low ones."""
    order: list[str] = []
    any_app.queue("single", concurrency=1)

    @any_app.step(name="note")
    def note(tag: str) -> None:
        order.append(tag)

    @any_app.workflow(name="tagged", queue="single")
    def tagged(tag: str) -> None:
        note(tag)

    for tag in ("low-1", "low-2", "low-3"):
        any_app.start("tagged", tag)
    any_app.start("tagged", "urgent", priority=10)
    TestWorker(any_app).run_until_idle()
    assert order == ["urgent", "low-1", "low-2", "low-3"]


def test_rate_limit_spreads_starts_over_periods(any_app: perdure.App) -> None:
    """A queue limited to 2 starts a minute starts 2, then 2 more after the minute passes."""
    clock = any_app.clock
    assert isinstance(clock, TestClock)
    any_app.queue("slow", rate=(2, timedelta(minutes=1)))

    @any_app.workflow(name="tick", queue="slow")
    async def tick() -> str:
        return "done"

    handles = [any_app.start("tick") for _ in range(5)]
    worker = TestWorker(any_app)
    assert worker.run_until_idle() == 2
    clock.advance(61)
    assert worker.run_until_idle() == 2
    clock.advance(61)
    assert worker.run_until_idle() == 1
    assert all(h.status() == "completed" for h in handles)


def test_parked_runs_hold_no_queue_slot(any_app: perdure.App) -> None:
    """Sleeping runs of a concurrency-1 queue do not stop others of the queue from running."""
    clock = any_app.clock
    assert isinstance(clock, TestClock)
    any_app.queue("one", concurrency=1)

    @any_app.workflow(name="napper", queue="one")
    async def napper() -> str:
        await perdure.sleep(timedelta(hours=1))
        return "rested"

    handles = [any_app.start("napper") for _ in range(3)]
    TestWorker(any_app).run_until_idle()
    assert [h.status() for h in handles] == ["sleeping"] * 3
    clock.advance(timedelta(hours=1, seconds=1))
    TestWorker(any_app).run_until_idle()
    assert [h.status() for h in handles] == ["completed"] * 3
    first = json.loads(any_app.get_run(handles[0].id).result or "null")
    assert first == "rested"
