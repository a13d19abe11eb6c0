"""Run deadlines: a run not done by its deadline fails with DeadlineExceeded."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

import perdure
from perdure.testing import TestClock, TestWorker

HOUR = 3600.0


def assert_deadline_failure(app: perdure.App, run_id: str) -> None:
    """The run ended `failed` with a DeadlineExceeded error, and result() says so."""
    run = app.get_run(run_id)
    assert run.status == "failed"
    assert json.loads(run.error or "{}")["type"].endswith("DeadlineExceeded")
    with pytest.raises(perdure.RunFailed, match="deadline") as info:
        app.handle(run_id).result(timeout=5)
    assert info.value.status == "failed"


def test_workflow_deadline_sets_deadline_at(app: perdure.App, clock: TestClock) -> None:
    """@app.workflow(deadline=...) gives every run deadline_at = start time + deadline."""

    @app.workflow(deadline=timedelta(hours=2))
    async def bounded() -> None:
        return None

    handle = app.start(bounded)
    assert app.get_run(handle.id).deadline_at == pytest.approx(clock.now() + 2 * HOUR)


def test_start_deadline_overrides_the_workflow_default(app: perdure.App, clock: TestClock) -> None:
    """app.start(..., deadline=...) sets the run's deadline, replacing the workflow's default."""

    @app.workflow(deadline=timedelta(days=1))
    async def bounded() -> None:
        return None

    @app.workflow
    async def unbounded() -> None:
        return None

    assert app.get_run(app.start(unbounded).id).deadline_at is None
    run = app.get_run(app.start(unbounded, deadline=60).id)
    assert run.deadline_at == pytest.approx(clock.now() + 60)
    run = app.get_run(app.start(bounded, deadline=timedelta(minutes=5)).id)
    assert run.deadline_at == pytest.approx(clock.now() + 300)


def test_run_within_its_deadline_completes(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run that finishes before its deadline completes normally."""

    @app.workflow(deadline=timedelta(hours=1))
    async def bounded() -> str:
        await perdure.sleep(timedelta(minutes=30))
        return "in time"

    handle = app.start(bounded)
    worker.run_until_idle()
    clock.advance(timedelta(minutes=30))
    worker.run_until_idle()
    assert handle.result(timeout=5) == "in time"


def test_sleep_past_the_deadline_fails_at_the_deadline(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run sleeping past its deadline is woken at the deadline and fails with DeadlineExceeded."""
    after: list[str] = []

    @app.step
    def later() -> None:
        after.append("ran")

    @app.workflow(deadline=timedelta(hours=1))
    async def oversleeps() -> None:
        await perdure.sleep(timedelta(days=1))
        await later()

    handle = app.start(oversleeps)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "sleeping"
    assert run.wake_at == run.deadline_at  # woken at the deadline, not after a day
    clock.advance(HOUR + 1)
    worker.run_until_idle()
    assert_deadline_failure(app, handle.id)
    assert after == []


def test_run_woken_exactly_at_its_deadline_fails(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run woken at exactly its deadline fails then, claimed once, instead of parking again."""

    @app.workflow(deadline=timedelta(hours=1))
    async def oversleeps() -> None:
        await perdure.sleep(timedelta(days=1))

    handle = app.start(oversleeps)
    worker.run_until_idle()
    clock.advance(HOUR)
    bounded = perdure.Worker(app.runtime, perdure.WorkerOptions(concurrency=1, lease=30))
    try:  # a capped number of claim rounds, so the bug shows as a count, not a hang
        claimed = app.runtime.sync(bounded.run_until_idle(max_rounds=20), "test")
    finally:
        bounded.executor.shutdown(wait=False)
    assert claimed == 1
    assert handle.status() == "failed"


def test_event_wait_past_the_deadline_fails(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run waiting (without timeout) for an event that never comes fails at its deadline."""

    @app.workflow
    async def waits() -> object:
        return await perdure.wait_event("never")

    handle = app.start(waits, deadline=600)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "waiting"
    assert run.wake_at == run.deadline_at
    clock.advance(601)
    worker.run_until_idle()
    assert_deadline_failure(app, handle.id)


def test_child_wait_past_the_deadline_fails(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A parent waiting on a slow child fails at its own deadline; the child is unaffected."""

    @app.workflow
    async def slow() -> str:
        await perdure.sleep(timedelta(days=1))
        return "late"

    @app.workflow(deadline=timedelta(hours=1))
    async def parent() -> str:
        return await slow()

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    clock.advance(HOUR + 1)
    worker.run_until_idle()
    assert_deadline_failure(app, handle.id)
    (child,) = app.runtime.sync(app.runtime.store.list_runs(parent_id="p"), "test")
    assert child.status == "sleeping"


def test_pending_run_past_its_deadline_fails_without_running(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run first claimed after its deadline fails at once; its workflow code never runs."""
    calls: list[int] = []

    @app.workflow
    def work() -> None:
        calls.append(1)

    handle = app.start(work, deadline=10)
    clock.advance(11)
    worker.run_until_idle()
    assert_deadline_failure(app, handle.id)
    assert calls == []


def test_deadline_checked_at_step_boundaries(app: perdure.App, clock: TestClock) -> None:
    """A running run that passes its deadline during a step fails before the next step."""
    seen: list[str] = []

    @app.step
    def long_step() -> None:
        seen.append("long")
        clock.advance(120)  # the step takes two minutes of engine time

    @app.step
    def next_step() -> None:
        seen.append("next")

    @app.workflow(deadline=60)
    def bounded() -> None:
        long_step()
        next_step()

    handle = app.start(bounded)
    TestWorker(app).run_until_idle()
    assert seen == ["long"]
    assert_deadline_failure(app, handle.id)
    kinds = [e.kind for e in app.journal(handle.id)]
    assert kinds[-1] == "run.failed"
    outcomes = [e.name for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert outcomes == [long_step.name]


def test_deadline_exceeded_is_a_perdure_error() -> None:
    """DeadlineExceeded is part of the public error tree."""
    assert issubclass(perdure.DeadlineExceeded, perdure.PerdureError)
