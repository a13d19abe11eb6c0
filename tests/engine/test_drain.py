"""A stopping worker in process: no new step, hand-back at the boundary, leases kept while
draining, a second stop abandons, and a stop that lands during a once step's intent write."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

import perdure
from live_workers import worker_task
from perdure.engine.inspection import explain
from perdure.store.base import Append, AppendResult
from perdure.testing import TestWorker
from waits import wait_for_async


def reasons(app: perdure.App, run_id: str) -> list[str]:
    return [
        json.loads(e.data or "{}")["reason"]
        for e in app.journal(run_id)
        if e.kind == "step.needs_attention"
    ]


def test_stop_hands_the_run_back_at_the_next_step_without_waiting_the_grace(
    app: perdure.App,
) -> None:
    """Stopped during step one: step two never starts here, the run is released as soon as
    step one ends (grace 30 s unused), and the next worker goes on from step two."""
    go = asyncio.Event()
    calls: list[str] = []

    @app.step(effect="idempotent")
    async def one() -> str:
        calls.append("one")
        await go.wait()
        return "one"

    @app.step(effect="once")
    async def two() -> str:
        calls.append("two")
        return "two"

    @app.workflow
    async def job() -> str:
        return await one() + await two()

    async def main() -> str:
        worker = app.worker(concurrency=2, lease=30, poll=0.02, grace=30)
        task = asyncio.create_task(worker.run())
        handle = await app.start_async(job)
        await wait_for_async("the first step", lambda: calls == ["one"])
        worker.stop()
        go.set()
        began = time.monotonic()
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - began < 2
        run = await app.client.get(handle.id)
        assert run.status == "running" and run.lease_until == 0  # released, not expiring
        return handle.id

    run_id = asyncio.run(main())
    assert calls == ["one"]
    assert TestWorker(app).run_until_idle() == 1
    assert app.handle(run_id).result(timeout=5) == "onetwo"
    assert calls == ["one", "two"]
    assert reasons(app, run_id) == []


def test_a_draining_worker_keeps_renewing_its_leases(db_url: str) -> None:
    """While a step finishes within the grace, heartbeats go on: the lease never expires for
    another worker to take the run over mid-step."""
    app = perdure.App(db_url)

    @app.step(effect="once")
    async def slow() -> str:
        await asyncio.sleep(1.5)
        return "done"

    @app.workflow
    async def job() -> str:
        return await slow()

    async def main() -> list[float]:
        worker = app.worker(lease=0.6, poll=0.02, grace=10)
        task = asyncio.create_task(worker.run())
        handle = await app.start_async(job)
        await wait_for_async("a step executing", lambda: worker.executing() == 1)
        worker.stop()
        left = []
        for _ in range(4):
            await asyncio.sleep(0.3)
            run = await app.client.get(handle.id)
            left.append((run.lease_until or 0) - time.time())
        await asyncio.wait_for(task, 10)
        assert await handle.result_async(timeout=1) == "done"
        return left

    try:
        assert min(asyncio.run(main())) > 0  # 1.2 s into the drain of a 0.6 s lease
    finally:
        app.close()


def test_a_second_stop_abandons_a_once_step_and_recovery_says_stopped(app: perdure.App) -> None:
    """stop() twice while a once step runs: run() returns at once, the journal says the step
    was stopped while executing, and the run parks with that reason, not 'crashed'."""

    @app.step(effect="once")
    async def charge() -> str:
        await asyncio.sleep(60)
        return "charged"

    @app.workflow
    async def job() -> str:
        return await charge()

    async def main() -> str:
        worker = app.worker(lease=30, poll=0.02, grace=30)
        task = asyncio.create_task(worker.run())
        handle = await app.start_async(job)
        await wait_for_async("a step executing", lambda: worker.executing() == 1)
        worker.stop()
        await asyncio.sleep(0.1)
        worker.stop()
        await asyncio.wait_for(task, 3)
        assert worker.abandoned == 1
        return handle.id

    run_id = asyncio.run(main())
    kinds = [e.kind for e in app.journal(run_id)]
    assert kinds[-2:] == ["step.intent", "step.stopped"]
    run = app.get_run(run_id)
    assert "stopped while executing" in explain(app.runtime, run, app.journal(run_id))[0].state
    TestWorker(app).run_until_idle()
    assert app.handle(run_id).status() == "needs_attention"
    (reason,) = reasons(app, run_id)
    assert reason.startswith("stopped while executing a once step (second signal while stopping")
    report = explain(app.runtime, app.get_run(run_id), app.journal(run_id))[0]
    assert report.detail == reason


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_stop_during_a_once_intent_write_never_starts_the_body(
    app: perdure.App, kind: str
) -> None:
    """The stop lands while the once step's intent is being committed: the body does not
    start, the journal says so, and the next worker runs it once without parking the run."""
    ran: list[int] = []
    worker = app.worker(lease=30, poll=0.02, grace=30)

    if kind == "async":

        @app.step(name="pay", effect="once")
        async def pay_async() -> str:
            ran.append(1)
            return "paid"

        @app.workflow(name="job")
        async def job_async() -> str:
            return await pay_async()

    else:

        @app.step(name="pay", effect="once")
        def pay() -> str:
            ran.append(1)
            return "paid"

        @app.workflow(name="job")
        def job() -> str:
            return pay()

    def stop_after_intent(original: Any) -> Any:
        def landed(append: Append) -> None:
            worker.stop()  # the signal arrives while the intent is being written

        async def wrapped(append: Append) -> AppendResult:
            result = await original(append)
            if any(e.kind == "step.intent" and e.name == "pay" for e in append.entries):
                if asyncio._get_running_loop() is None:  # a sync workflow's own thread
                    for ctx in list(worker.contexts.values()):
                        ctx.update(hold=True)  # what stop() does first, seen by this thread
                    loop.call_soon_threadsafe(landed, append)
                else:
                    landed(append)
            return result  # type: ignore[no-any-return]

        return wrapped

    loop: Any = None
    store: Any = app.runtime.store
    store.append = stop_after_intent(store.append)

    async def main() -> str:
        nonlocal loop
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(worker.run())
        handle = await app.start_async("job")
        await asyncio.wait_for(task, 10)
        return handle.id

    run_id = asyncio.run(main())
    del store.append
    assert ran == []
    stopped = [json.loads(e.data or "{}") for e in app.journal(run_id) if e.kind == "step.stopped"]
    assert stopped and stopped[0]["executing"] is False
    TestWorker(app).run_until_idle()
    assert app.handle(run_id).result(timeout=5) == "paid"
    assert ran == [1]
    assert reasons(app, run_id) == []


def test_a_short_sleep_met_while_stopping_hands_the_run_back(db_url: str) -> None:
    """A sleep (short enough to wait in process) met while stopping is a step boundary: the
    run is handed back at once, not after sleeping, and a later worker finishes it."""
    app = perdure.App(db_url)
    go = asyncio.Event()

    @app.step(effect="idempotent")
    async def first() -> str:
        await go.wait()
        return "first"

    @app.workflow
    async def job() -> str:
        value = await first()
        await perdure.sleep(0.9)
        return value

    async def main() -> tuple[str, float]:
        worker = app.worker(lease=30, poll=0.02, grace=30)
        task = asyncio.create_task(worker.run())
        handle = await app.start_async(job)
        await wait_for_async("a step executing", lambda: worker.executing() == 1)
        worker.stop()
        began = time.monotonic()
        go.set()
        await asyncio.wait_for(task, 10)
        run = await app.client.get(handle.id)
        assert (run.status, run.lease_until) == ("running", 0)
        took = time.monotonic() - began
        async with worker_task(app, lease=30, poll=0.02):
            assert await handle.result_async(timeout=10) == "first"
        return run.status, took

    try:
        assert asyncio.run(main())[1] < 0.8
    finally:
        app.close()
