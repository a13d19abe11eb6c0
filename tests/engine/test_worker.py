"""The worker: draining on stop, lease release, exclusive execution, recovery, heartbeats."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from step_loops import counting_loop, one_after_another

import perdure
from live_workers import worker_task
from perdure.store.base import Claim
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from waits import wait_for_async

LEASE = 30.0


def ghost_claim(app: perdure.App, limit: int = 100) -> list[Claim]:
    """Claim runnable runs as a worker that then dies without running them."""
    return app.runtime.sync(  # type: ignore[no-any-return]
        app.runtime.store.claim(
            "ghost", app.clock.now(), LEASE, limit, list(app.runtime.workflows)
        ),
        "test",
    )


def test_stop_drains_running_runs(app: perdure.App) -> None:
    """worker.stop() lets a running run finish before run() returns, and claims nothing new."""
    release = asyncio.Event()
    started: list[str] = []

    @app.step
    async def busy(tag: str) -> str:
        started.append(tag)
        await release.wait()
        return tag

    @app.workflow
    async def job(tag: str) -> str:
        return await busy(tag)

    async def main() -> None:
        worker = app.worker(concurrency=4, lease=3, poll=0.02, grace=10)
        task = asyncio.create_task(worker.run())
        first = await app.start_async(job, "first")
        await wait_for_async("the first run started", lambda: started == ["first"])
        worker.stop()
        late = await app.start_async(job, "late")
        await asyncio.sleep(0.2)
        assert not task.done()  # still draining the running run
        release.set()
        await asyncio.wait_for(task, 10)
        assert await first.status_async() == "completed"
        assert await first.result_async(timeout=1) == "first"
        assert await late.status_async() == "pending"
        assert started == ["first"]

    asyncio.run(main())


def test_stop_after_grace_releases_leases_for_another_worker(
    app: perdure.App, clock: TestClock
) -> None:
    """A run still busy when the grace ends is released, so another worker claims it at once."""
    calls: list[int] = []

    @app.step(effect="idempotent")
    async def work() -> str:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(60)  # the first attempt outlives the grace period
        return f"attempt {len(calls)}"

    @app.workflow
    async def job() -> str:
        return await work()

    async def main() -> str:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.02, grace=0.2) as worker:
            handle = await app.start_async(job)
            await wait_for_async("the step started", lambda: len(calls) == 1)
        run = await app.client.get(handle.id)
        assert run.status == "running"
        assert run.lease_until is not None and run.lease_until <= clock.now()
        return worker.id

    first_worker = asyncio.run(main())
    second = TestWorker(app, lease=LEASE)
    assert second.run_until_idle() == 1  # the clock did not move: the lease was handed back
    (run,) = app.list_runs()
    assert app.handle(run.id).result(timeout=5) == "attempt 2"
    recovered = [e for e in app.journal(run.id) if e.kind == "run.recovered"]
    assert len(recovered) == 1
    assert json.loads(recovered[0].data or "{}")["from"] == first_worker


def test_two_workers_never_run_the_same_run_concurrently(db_url: str, clock: TestClock) -> None:
    """Two workers (separate apps, one DB) run every run exactly once and never at the same time."""
    active: set[str] = set()
    overlaps: list[str] = []
    executions: Counter[str] = Counter()

    def register(application: perdure.App) -> perdure.Workflow[[int], int]:
        @application.step(name="touch", effect="idempotent")
        async def touch(i: int) -> int:
            run_id = perdure.current_step().run_id
            if run_id in active:
                overlaps.append(run_id)
            active.add(run_id)
            executions[run_id] += 1
            await asyncio.sleep(0.005)
            active.discard(run_id)
            return i

        @application.workflow(name="job")
        async def job(i: int) -> int:
            return await touch(i)

        return job

    apps = [perdure.App(db_url, clock=clock) for _ in range(2)]
    job = register(apps[0])
    register(apps[1])
    n = 40

    async def main() -> list[perdure.Worker]:
        handles = [await apps[0].start_async(job, i) for i in range(n)]
        workers = [a.worker(concurrency=4, lease=LEASE, poll=0.01) for a in apps]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:
            results = [await h.result_async(timeout=30) for h in handles]
            assert results == list(range(n))
        finally:
            for w in workers:
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return workers

    try:
        workers = asyncio.run(main())
    finally:
        for a in apps:
            a.close()
    assert overlaps == []
    assert len(executions) == n
    assert set(executions.values()) == {1}
    assert all(w.claimed > 0 for w in workers)
    assert sum(w.claimed for w in workers) == n


def test_concurrency_limit_is_respected(app: perdure.App) -> None:
    """A worker with concurrency=2 never has more than two runs executing at once."""
    active: list[int] = []
    peak: list[int] = [0]

    @app.step
    async def busy(i: int) -> int:
        active.append(i)
        peak[0] = max(peak[0], len(active))
        await asyncio.sleep(0.02)
        active.remove(i)
        return i

    @app.workflow
    async def job(i: int) -> int:
        return await busy(i)

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.01):
            handles = [await app.start_async(job, i) for i in range(8)]
            assert [await h.result_async(timeout=10) for h in handles] == list(range(8))

    asyncio.run(main())
    assert peak[0] == 2


def test_run_with_live_lease_is_not_taken(app: perdure.App, clock: TestClock) -> None:
    """A run whose lease has not expired is not claimed by another worker."""

    @app.workflow
    async def job() -> int:
        return 1

    handle = app.start(job)
    assert len(ghost_claim(app)) == 1
    clock.advance(LEASE - 1)
    assert TestWorker(app).run_until_idle() == 0
    run = app.get_run(handle.id)
    assert run.status == "running"
    assert run.lease_owner == "ghost"


def test_expired_lease_is_recovered_with_a_journal_entry(
    app: perdure.App, clock: TestClock
) -> None:
    """A run whose lease expired is claimed by another worker, which journals `run.recovered`."""

    @app.workflow
    async def job() -> str:
        return "done"

    handle = app.start(job)
    (claim,) = ghost_claim(app)
    clock.advance(LEASE + 1)
    worker = TestWorker(app)
    assert worker.run_until_idle() == 1
    assert handle.result(timeout=5) == "done"
    run = app.get_run(handle.id)
    assert run.recoveries == 1
    assert run.lease_epoch == claim.run.lease_epoch + 1
    (entry,) = [e for e in app.journal(handle.id) if e.kind == "run.recovered"]
    data = json.loads(entry.data or "{}")
    assert data["from"] == "ghost"
    assert worker.worker is not None and data["to"] == worker.worker.id
    assert data["epoch"] == run.lease_epoch


def test_crashed_worker_run_is_recovered_after_lease(app: perdure.App, clock: TestClock) -> None:
    """After a crash mid-step, a new worker resumes the run once the lease expires."""
    calls: list[int] = []

    @app.step(effect="idempotent")
    def write_file() -> int:
        calls.append(1)
        return len(calls)

    @app.workflow
    def job() -> int:
        return write_file()

    handle = app.start(job)
    crashing = TestWorker(app, lease=LEASE)
    crashing.crash_after_intent(write_file.name)
    with pytest.raises(SimulatedCrash):
        crashing.run_until_idle()
    assert handle.status() == "running"
    assert TestWorker(app, lease=LEASE).run_until_idle() == 0  # lease still held
    clock.advance(LEASE + 1)
    assert TestWorker(app, lease=LEASE).run_until_idle() == 1
    assert handle.result(timeout=5) == 1
    assert calls == [1]  # the crash came before the effect ran; recovery ran it once
    assert [e.kind for e in app.journal(handle.id)].count("run.recovered") == 1


def test_recovery_is_bulk(app: perdure.App, clock: TestClock, monkeypatch: Any) -> None:
    """One claim takes every expired run it has room for, not one run per claim."""

    @app.workflow
    async def job(i: int) -> int:
        return i

    handles = [app.start(job, i) for i in range(25)]
    assert len(ghost_claim(app)) == 25
    clock.advance(LEASE + 1)

    sizes: list[int] = []
    real_claim = app.runtime.store.claim

    async def counting_claim(*args: Any, **kwargs: Any) -> list[Claim]:
        claims = await real_claim(*args, **kwargs)
        sizes.append(len(claims))
        return claims

    monkeypatch.setattr(app.runtime.store, "claim", counting_claim)
    assert TestWorker(app, concurrency=50).run_until_idle() == 25
    assert sizes[0] == 25
    assert [h.result(timeout=5) for h in handles] == list(range(25))
    assert all(app.get_run(h.id).recoveries == 1 for h in handles)


def test_heartbeat_extends_the_lease(app: perdure.App, clock: TestClock) -> None:
    """While a worker heartbeats, its run is not taken even after the original lease has passed."""
    release = asyncio.Event()
    started: list[int] = []

    @app.step
    async def busy() -> str:
        started.append(1)
        await release.wait()
        return "mine"

    @app.workflow
    async def job() -> str:
        return await busy()

    async def main() -> None:
        handle = await app.start_async(job)
        owner = app.worker(concurrency=1, lease=LEASE)
        thief = app.worker(concurrency=1, lease=LEASE)
        try:
            assert await owner.claim_once() == 1
            await wait_for_async("the step started", lambda: started == [1])
            first_until = (await app.client.get(handle.id)).lease_until
            clock.advance(LEASE - 5)
            await owner.heartbeat_once()
            clock.advance(10)  # past the first lease, within the extended one
            assert clock.now() > (first_until or 0)
            assert await thief.claim_once() == 0
            release.set()
            await asyncio.wait_for(asyncio.gather(*owner.tasks.values()), 5)
            assert await handle.result_async(timeout=1) == "mine"
            assert (await app.client.get(handle.id)).recoveries == 0
        finally:
            owner.executor.shutdown(wait=False)
            thief.executor.shutdown(wait=False)

    asyncio.run(main())


def register_lease_job(application: perdure.App, calls: list[int], gate: list[Any]) -> Any:
    """A workflow whose first step attempt blocks (the zombie) and later ones return at once."""

    @application.step(name="work", effect="idempotent")
    async def work() -> str:
        calls.append(1)
        if len(calls) > 1:
            return "rescuer"
        await gate[0].wait()  # the zombie is stuck here while its lease runs out
        return "zombie"

    @application.workflow(name="job")
    async def job() -> str:
        return await work()

    return job


def test_zombie_worker_cannot_write_after_losing_its_lease(
    app: perdure.App, db_url: str, clock: TestClock
) -> None:
    """A worker whose lease was taken over writes nothing more; the new owner's outcome stands."""
    calls: list[int] = []
    gate: list[Any] = []
    other = perdure.App(db_url, clock=clock)  # the rescuing worker lives in another "process"
    job = register_lease_job(app, calls, gate)
    register_lease_job(other, calls, gate)

    async def main() -> None:
        gate.append(asyncio.Event())
        handle = await app.start_async(job)
        zombie = app.worker(concurrency=1, lease=LEASE)
        rescuer = other.worker(concurrency=1, lease=LEASE)
        try:
            assert await zombie.claim_once() == 1  # no heartbeat loop: the lease will lapse
            await wait_for_async("the zombie's step started", lambda: calls == [1])
            zombie_epoch = (await app.client.get(handle.id)).lease_epoch
            clock.advance(LEASE + 1)
            assert await rescuer.claim_once() == 1
            await asyncio.wait_for(asyncio.gather(*rescuer.tasks.values()), 5)
            assert await handle.result_async(timeout=1) == "rescuer"
            zombie_tasks = list(zombie.tasks.values())
            gate[0].set()
            await asyncio.wait_for(asyncio.gather(*zombie_tasks), 5)
        finally:
            zombie.executor.shutdown(wait=False)
            rescuer.executor.shutdown(wait=False)
        run = await app.client.get(handle.id)
        assert run.status == "completed"
        entries = await app.client.journal(handle.id)
        # what the zombie wrote while it held the lease (its step's intent, committed by
        # the linger timer) stays; nothing of it comes after the takeover
        zombie = [e for e in entries if e.epoch == zombie_epoch]
        later = [e.seq for e in entries if e.epoch is not None and e.epoch > zombie_epoch]
        assert [e.kind for e in zombie] in ([], ["step.intent"])
        assert all(e.seq < min(later) for e in zombie)
        assert [e.kind for e in entries].count("run.completed") == 1
        assert await handle.result_async(timeout=1) == "rescuer"

    try:
        asyncio.run(main())
    finally:
        other.close()


def test_heartbeat_notices_a_lost_lease_and_stops_the_run(
    app: perdure.App, db_url: str, clock: TestClock
) -> None:
    """A heartbeat that finds the lease taken cancels the local execution of that run."""
    calls: list[int] = []
    gate: list[Any] = []
    other = perdure.App(db_url, clock=clock)
    job = register_lease_job(app, calls, gate)
    register_lease_job(other, calls, gate)

    async def main() -> None:
        gate.append(asyncio.Event())  # never set: only cancellation ends the zombie's step
        handle = await app.start_async(job)
        zombie = app.worker(concurrency=1, lease=LEASE)
        rescuer = other.worker(concurrency=1, lease=LEASE)
        try:
            await zombie.claim_once()
            await wait_for_async("the zombie's step started", lambda: calls == [1])
            clock.advance(LEASE + 1)
            await rescuer.claim_once()
            await asyncio.wait_for(asyncio.gather(*rescuer.tasks.values()), 5)
            zombie_tasks = list(zombie.tasks.values())
            assert zombie_tasks
            await zombie.heartbeat_once()
            await asyncio.wait(zombie_tasks, timeout=5)
            assert all(t.done() for t in zombie_tasks)
            assert not zombie.tasks
            assert await handle.result_async(timeout=1) == "rescuer"
        finally:
            zombie.executor.shutdown(wait=False)
            rescuer.executor.shutdown(wait=False)

    try:
        asyncio.run(main())
    finally:
        other.close()


def test_same_app_workers_keep_their_own_runs_apart(app: perdure.App, clock: TestClock) -> None:
    """Two workers of one app: the one that lost a run's lease stops, the new owner finishes."""
    calls: list[int] = []
    stuck = asyncio.Event()  # never set: the zombie's attempt ends only by cancellation
    release = asyncio.Event()

    @app.step(effect="idempotent")
    async def work() -> str:
        calls.append(1)
        if len(calls) == 1:
            await stuck.wait()
        return "rescuer"

    @app.step
    async def tail() -> None:
        await release.wait()

    @app.workflow
    async def job() -> str:
        value = await work()
        await tail()
        return value

    async def main() -> None:
        handle = await app.start_async(job)
        zombie = app.worker(concurrency=1, lease=LEASE)
        rescuer = app.worker(concurrency=1, lease=LEASE)
        try:
            await zombie.claim_once()
            await wait_for_async("the zombie's step started", lambda: calls == [1])
            clock.advance(LEASE + 1)
            await rescuer.claim_once()
            await wait_for_async("the rescuer in `tail`", lambda: len(calls) == 2)
            zombie_tasks = list(zombie.tasks.values())
            await zombie.heartbeat_once()
            await asyncio.wait(zombie_tasks, timeout=5)
            assert all(t.done() for t in zombie_tasks)
            release.set()
            await asyncio.wait(list(rescuer.tasks.values()), timeout=5)
            assert await handle.result_async(timeout=1) == "rescuer"
        finally:
            zombie.executor.shutdown(wait=False)
            rescuer.executor.shutdown(wait=False)

    asyncio.run(main())


def test_one_claim_per_run_started_one_after_another(db_url: str) -> None:
    """A claim that filled fewer slots than were free is not repeated at once, a run's end
    wakes no claim while the worker had slots left, and a run started beside a worker with
    nothing else to run is created claimed by it: no claim at all once it looked."""
    app = perdure.App(db_url)

    wf = counting_loop(app)

    claims: list[str] = []

    async def main() -> list[int]:
        async with worker_task(app, concurrency=4, poll=60.0, gc_every=None, stop_within=30) as w:
            await wait_for_async("its first claim to find nothing", w.nothing_runnable)
            store: Any = app.runtime.store
            claim = store.claim

            async def counted(*args: Any, **kwargs: Any) -> Any:
                claims.append("claim")
                return await claim(*args, **kwargs)

            store.claim = counted
            return await one_after_another(app, wf, 2)

    try:
        assert asyncio.run(main()) == [2] * 5
    finally:
        app.close()
    assert claims == []


def test_heartbeats_keep_a_long_run_able_to_start_once_steps(db_url: str) -> None:
    """A run that outlives its first lease many times over still starts its once steps:
    each heartbeat the store accepts extends the lease the worker can show."""
    app = perdure.App(db_url)
    paid: list[str] = []

    @app.step(name="work", effect="keyed")
    async def work() -> None:
        await asyncio.sleep(2.0)  # three leases of 0.6 s

    @app.step(name="pay", effect="once")
    def pay() -> None:
        paid.append("paid")

    @app.workflow(name="long")
    async def long() -> str:
        await work()
        await pay()
        return "done"

    async def main() -> str:
        async with worker_task(
            app, concurrency=1, lease=0.6, poll=0.05, gc_every=None, stop_within=30
        ):
            handle = await app.start_async(long)
            return str(await handle.result_async(20))

    try:
        assert asyncio.run(main()) == "done"
    finally:
        app.close()
    assert paid == ["paid"]
