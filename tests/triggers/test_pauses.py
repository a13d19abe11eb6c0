"""Pausing a whole workflow or worker: immediate for parked runs, next step for running ones."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

import perdure
from live_workers import worker_task
from perdure.testing import TestClock, TestWorker
from waits import wait_for_async


def test_a_paused_workflow_keeps_its_parked_runs_parked(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    @app.workflow(name="nap")
    async def nap() -> str:
        await perdure.sleep(60)
        return "up"

    @app.workflow(name="other")
    async def other() -> str:
        return "free"

    asleep = app.start(nap, run_id="asleep")
    worker.run_until_idle()
    assert asleep.status() == "sleeping"
    assert app.pause_workflow("nap") is True and app.pause_workflow("nap") is False
    fresh = app.start(nap, run_id="fresh")
    unrelated = app.start(other)
    clock.advance(120)  # the timer is due, but the workflow is paused
    worker.run_until_idle()
    assert (asleep.status(), fresh.status()) == ("sleeping", "pending")
    assert unrelated.result(timeout=5) == "free"  # other workflows go on
    assert app.pauses()[0][:2] == ("workflow", "nap")
    app.resume_workflow("nap")
    worker.run_until_idle()
    assert asleep.result(timeout=5) == "up"  # its timer was long due
    clock.advance(60)  # the fresh run only now began its own nap
    worker.run_until_idle()
    assert fresh.result(timeout=5) == "up"
    assert app.pauses() == []


def test_a_running_run_stops_at_its_next_step_and_resumes_where_it_was(
    app: perdure.App, worker: TestWorker
) -> None:
    done: list[int] = []

    @app.step(name="work")
    def work(i: int) -> int:
        done.append(i)
        if i == 2:
            app.pause_workflow("steps")  # an operator, in this process: reaches the run at once
        return i

    @app.workflow(name="steps")
    async def steps() -> int:
        return sum([await work(i) for i in range(5)])

    handle = app.start(steps, run_id="s1")
    worker.run_until_idle()
    assert done == [0, 1, 2]  # stopped after the step in flight, before the next one
    run = app.get_run("s1")
    assert run.status == "running" and run.lease_until == 0  # handed back, state kept
    app.resume_workflow("steps")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 10
    assert done == [0, 1, 2, 3, 4]  # every step once


def test_a_paused_host_claims_nothing(app: perdure.App, worker: TestWorker) -> None:
    @app.workflow(name="job")
    async def job() -> str:
        return "ok"

    host = socket.gethostname()
    app.pause_worker(host)
    handle = app.start(job)
    assert worker.run_until_idle() == 0 and handle.status() == "pending"
    app.resume_worker(host)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "ok"


def test_a_pause_from_another_process_reaches_a_busy_worker(tmp_path: Path) -> None:
    """A second App (another process's view of the store) pauses the workflow; the worker
    running it learns at its next heartbeat and hands the run back within a few seconds."""
    url = f"sqlite:///{tmp_path}/p.db"
    app = perdure.App(url)
    operator = perdure.App(url)
    done: list[int] = []

    @app.step(name="tick")
    def tick(i: int) -> int:
        time.sleep(0.05)
        done.append(i)
        return i

    @app.workflow(name="long")
    async def long() -> int:
        return sum([await tick(i) for i in range(60)])

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=3.0):
            handle = await app.start_async(long, run_id="L")
            await wait_for_async("five steps done", lambda: len(done) >= 5)
            await asyncio.to_thread(operator.pause_workflow, "long")
            paused_at = time.monotonic()
            while (await app.runtime.store.get_run("L")).lease_until != 0:  # type: ignore[union-attr]
                assert time.monotonic() - paused_at < 5, "the pause did not reach the worker"
                await asyncio.sleep(0.05)
            stopped = len(done)
            await asyncio.sleep(0.5)
            assert len(done) == stopped < 60  # nothing runs while paused
            await asyncio.to_thread(operator.resume_workflow, "long")
            assert await handle.result_async(timeout=30) == sum(range(60))

    try:
        asyncio.run(main())
    finally:
        app.close()
        operator.close()
    assert sorted(done) == list(range(60))  # each step exactly once


@pytest.mark.parametrize("scope", ["workflow", "worker"])
def test_pause_needs_a_name(app: perdure.App, scope: str) -> None:
    call = app.pause_workflow if scope == "workflow" else app.pause_worker
    with pytest.raises(perdure.ConfigError, match=f"name the {scope}"):
        call("")
    assert app.pauses() == []
