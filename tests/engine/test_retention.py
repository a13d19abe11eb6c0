"""Retention: per-workflow policies, app.gc(), the worker's background pass, reused run ids."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

import perdure
from live_workers import worker_task
from perdure.engine.client import Client
from perdure.testing import TestClock, TestWorker
from waits import wait_for_async


def counting(app: perdure.App, retention: perdure.Retention | None, name: str = "job") -> Any:
    """A workflow with one step that counts how often it really executes."""
    calls: list[str] = []

    @app.step(name=f"{name}.work", effect="idempotent")
    def work(tag: str) -> str:
        calls.append(tag)
        return f"did {tag}"

    @app.workflow(name=name, retention=retention)
    def job(tag: str) -> str:
        return work(tag)

    return job, calls


def test_retention_needs_a_rule_and_sane_values() -> None:
    """Retention() with no rule, or a negative one, is a one-line ConfigError."""
    for bad in ({}, {"keep_days": -1}, {"keep_last": -2}, {"keep_last": 1.5}):
        with pytest.raises(perdure.ConfigError) as info:
            perdure.Retention(**bad)
        assert "\n" not in str(info.value)
    assert perdure.Retention(keep_last=0).keep_last == 0


def test_retention_must_be_a_retention_object(app: perdure.App) -> None:
    """Passing a dict as retention= is refused at registration, naming the fix."""
    with pytest.raises(perdure.ConfigError, match=r"perdure\.Retention"):
        app.workflow(retention={"keep_days": 3})  # type: ignore[call-overload]


def test_gc_keeps_the_last_runs_of_a_workflow(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """keep_last=2 leaves the two most recently finished runs and deletes the rest."""
    job, _ = counting(app, perdure.Retention(keep_last=2))
    for i in range(4):
        app.start(job, str(i), run_id=f"r{i}")
        worker.run_until_idle()
        clock.advance(1)
    report = app.gc()
    assert (report.runs, report.batches) == (2, 1)
    assert report.entries > 0
    assert sorted(r.id for r in app.list_runs()) == ["r2", "r3"]
    with pytest.raises(perdure.RunNotFound):
        app.get_run("r0")


def test_gc_keeps_runs_younger_than_keep_days(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """keep_days deletes runs that finished longer ago than that, by the app's clock."""
    job, _ = counting(app, perdure.Retention(keep_days=7))
    app.start(job, "old", run_id="old")
    worker.run_until_idle()
    clock.advance(timedelta(days=5))
    app.start(job, "new", run_id="new")
    worker.run_until_idle()
    assert app.gc().runs == 0
    clock.advance(timedelta(days=3))
    assert app.gc().runs == 1
    assert [r.id for r in app.list_runs()] == ["new"]


def test_a_reused_run_id_never_sees_the_old_runs_outcomes(
    app: perdure.App, worker: TestWorker
) -> None:
    """After gc, a new run with the same id starts with an empty journal and executes its steps."""
    job, calls = counting(app, perdure.Retention(keep_last=0))
    first = app.start(job, "first", run_id="nightly")
    worker.run_until_idle()
    assert first.result(timeout=5) == "did first"
    assert app.gc().runs == 1
    again = app.start(job, "second", run_id="nightly")
    assert app.journal("nightly") == []
    assert app.get_run("nightly").status == "pending"
    worker.run_until_idle()
    assert again.result(timeout=5) == "did second"
    assert calls == ["first", "second"]


def test_without_gc_a_reused_id_returns_the_old_run(app: perdure.App, worker: TestWorker) -> None:
    """Idempotent start still holds until gc: the same id names the finished run."""
    job, calls = counting(app, perdure.Retention(keep_last=0))
    app.start(job, "first", run_id="nightly")
    worker.run_until_idle()
    again = app.start(job, "second", run_id="nightly")
    worker.run_until_idle()
    assert again.result(timeout=5) == "did first"
    assert calls == ["first"]


def test_workflows_without_retention_keep_every_run(app: perdure.App, worker: TestWorker) -> None:
    """gc touches only workflows that declare a retention policy."""
    kept, _ = counting(app, None, name="kept")
    pruned, _ = counting(app, perdure.Retention(keep_last=0), name="pruned")
    app.start(kept, "a", run_id="k")
    app.start(pruned, "b", run_id="p")
    worker.run_until_idle()
    assert app.gc().runs == 1
    assert [r.id for r in app.list_runs()] == ["k"]


def test_unfinished_runs_survive_gc(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """A run that is waiting, however old, is never deleted."""

    @app.workflow(name="waits", retention=perdure.Retention(keep_last=0, keep_days=0))
    async def waits() -> Any:
        return await perdure.wait_event("go")

    handle = app.start(waits)
    worker.run_until_idle()
    clock.advance(timedelta(days=365))
    assert app.gc().runs == 0
    handle.send_event("go", 1)
    worker.run_until_idle()
    clock.advance(1)
    assert app.gc().runs == 1


def test_a_child_stays_while_its_parent_runs(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A finished child of a waiting parent is kept; once the parent is done both go."""
    child, _ = counting(app, perdure.Retention(keep_last=0), name="child")

    @app.workflow(name="parent", retention=perdure.Retention(keep_last=0))
    async def parent() -> str:
        got = await child("c")
        await perdure.wait_event("finish")
        return str(got)

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert app.get_run("p.0").status == "completed"
    assert app.gc().runs == 0
    handle.send_event("finish")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "did c"
    assert app.gc().runs == 2
    assert app.list_runs() == []


def test_gc_deletes_blobs_nobody_names_any_more(db_url: str, clock: TestClock) -> None:
    """A large payload stored as a blob is deleted with the last run that referenced it."""
    app = perdure.App(db_url, clock=clock, blob_threshold=100)
    try:
        job, _ = counting(app, perdure.Retention(keep_last=0))
        app.start(job, "x" * 500, run_id="big")
        TestWorker(app).run_until_idle()
        report = app.gc()
        assert report.runs == 1 and report.blobs >= 1
        count = app.runtime.store.submit(  # type: ignore[attr-defined]
            lambda c: c.execute("SELECT COUNT(*) FROM blobs").fetchone()[0], write=False
        ).result()
        assert count == 0
    finally:
        app.close()


def test_gc_in_small_batches_deletes_everything(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A backlog larger than one batch is deleted over several transactions."""
    job, _ = counting(app, perdure.Retention(keep_last=1))
    for i in range(7):
        app.start(job, str(i))
        worker.run_until_idle()
        clock.advance(1)
    report = app.gc(batch=2)
    assert report.runs == 6 and report.batches >= 3
    assert len(app.list_runs()) == 1


def test_test_worker_applies_retention_only_when_asked(app: perdure.App) -> None:
    """TestWorker leaves finished runs alone unless built with gc=True."""
    job, _ = counting(app, perdure.Retention(keep_last=0))
    app.start(job, "a")
    TestWorker(app).run_until_idle()
    assert len(app.list_runs()) == 1
    app.start(job, "b")
    TestWorker(app, gc=True).run_until_idle()
    assert app.list_runs() == []


def test_the_worker_collects_in_the_background(app: perdure.App) -> None:
    """A running worker applies retention by itself every gc_every seconds."""
    job, _ = counting(app, perdure.Retention(keep_last=0))

    async def main() -> None:
        await app.start_async(job, "a", run_id="bg")
        async with worker_task(app, gc_every=0.05, poll=0.01):

            async def gone() -> bool:
                return not await app.client.list_runs()

            await wait_for_async("the run deleted", gone)

    app.runtime.sync(main(), "test")
    with pytest.raises(perdure.RunNotFound):
        app.get_run("bg")


def test_a_failing_gc_pass_never_stops_the_worker(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When gc raises, the worker logs it and keeps running workflows."""
    job, _ = counting(app, perdure.Retention(keep_last=0))
    failures: list[int] = []

    async def broken(self: Client, **kw: Any) -> Any:
        failures.append(1)
        raise perdure.StoreError("gc exploded")

    monkeypatch.setattr(Client, "gc", broken)  # every client of the app, the worker's too

    async def main() -> str:
        async with worker_task(app, gc_every=0.01, poll=0.01):
            await wait_for_async("three failed gc passes", lambda: len(failures) >= 3)
            handle = await app.start_async(job, "still working")
            return str(await handle.result_async(timeout=10))

    with caplog.at_level(logging.WARNING, logger="perdure.worker"):
        assert app.runtime.sync(main(), "test") == "did still working"
    assert "gc pass failed" in caplog.text and "gc exploded" in caplog.text


def test_worker_gc_can_be_switched_off(app: perdure.App) -> None:
    """gc_every=None starts no gc loop: finished runs stay while the worker runs."""
    job, _ = counting(app, perdure.Retention(keep_last=0))

    async def main() -> int:
        handle = await app.start_async(job, "a")
        async with worker_task(app, gc_every=None, poll=0.01):
            await handle.result_async(timeout=10)
            await asyncio.sleep(0.2)
            return len(await app.client.list_runs())

    assert app.runtime.sync(main(), "test") == 1
