"""Cancel, pause and resume: parked runs at once, running runs at the next boundary."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import perdure
import perdure.engine.steps
from live_workers import worker_task
from perdure.testing import TestClock, TestWorker
from waits import wait_for_async

# The live workers' lease. The app's clock stands still, so it never lapses: a short one only
# makes the heartbeat (every third of it) that carries another process's request come sooner.
LEASE = 0.6


async def status_is(app: perdure.App, run_id: str, *statuses: str) -> bool:
    return (await app.client.get(run_id)).status in statuses


# -- cancel -------------------------------------------------------------------------------


def test_cancel_sleeping_run_is_immediate(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Cancelling a sleeping run makes it `cancelled` at once; it never runs again."""
    after: list[str] = []

    @app.step
    def later() -> None:
        after.append("ran")

    @app.workflow
    async def nap() -> None:
        await perdure.sleep(timedelta(hours=1))
        await later()

    handle = app.start(nap)
    worker.run_until_idle()
    assert app.cancel(handle.id) == "cancelled"
    run = app.get_run(handle.id)
    assert run.status == "cancelled"
    assert run.wake_at is None
    assert app.journal(handle.id)[-1].kind == "run.cancelled"
    clock.advance(timedelta(hours=2))
    assert worker.run_until_idle() == 0
    assert after == []
    assert handle.status() == "cancelled"


def test_cancel_waiting_run_is_immediate(app: perdure.App, worker: TestWorker) -> None:
    """Cancelling a run waiting for an event ends it at once; later events are refused."""

    @app.workflow
    async def waits() -> None:
        await perdure.wait_event("go")

    handle = app.start(waits)
    worker.run_until_idle()
    assert handle.cancel() == "cancelled"
    with pytest.raises(perdure.PerdureError, match="cancelled"):
        app.send_event(handle.id, "go")
    assert worker.run_until_idle() == 0


def test_cancel_pending_run_never_starts(app: perdure.App, worker: TestWorker) -> None:
    """A run cancelled before any worker claimed it never executes."""
    calls: list[int] = []

    @app.workflow
    def work() -> None:
        calls.append(1)

    handle = app.start(work)
    assert app.cancel(handle.id) == "cancelled"
    assert worker.run_until_idle() == 0
    assert calls == []


def test_cancel_parent_cancels_children(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Cancelling a parent that waits on children cancels the parent and every unfinished child."""

    @app.workflow
    async def leaf(i: int) -> int:
        await perdure.sleep(3600)
        return i

    @app.workflow
    async def quick() -> int:
        return 0

    @app.workflow
    async def parent() -> list[int]:
        done = await quick()
        handles = [await leaf.start(i) for i in range(3)]
        return [done] + [await h.result() for h in handles]

    app.start(parent, run_id="p")
    worker.run_until_idle()
    assert app.get_run("p").status == "waiting"
    assert app.cancel("p") == "cancelled"
    statuses = {r.id: r.status for r in app.list_runs()}
    assert statuses == {
        "p": "cancelled",
        "p.0": "completed",  # already finished: left alone (its result sits at position 1)
        "p.2": "cancelled",
        "p.3": "cancelled",
        "p.4": "cancelled",
    }
    clock.advance(7200)
    assert worker.run_until_idle() == 0


def test_cancel_finished_run_changes_nothing(app: perdure.App, worker: TestWorker) -> None:
    """Cancelling a completed run returns its status and writes nothing."""

    @app.workflow
    async def done() -> int:
        return 1

    handle = app.start(done)
    worker.run_until_idle()
    before = app.journal(handle.id)
    assert app.cancel(handle.id) == "completed"
    assert app.journal(handle.id) == before
    assert handle.result(timeout=5) == 1


@pytest.fixture(params=["same app", "other process"])
def operator(request: Any, app: perdure.App, db_url: str, clock: TestClock) -> Iterator[Any]:
    """Who sends operator calls: the worker's own app, or another app (reached by heartbeat)."""
    if request.param == "same app":
        yield app
        return
    other = perdure.App(db_url, clock=clock)
    yield other
    other.close()


def test_cancel_running_async_step(app: perdure.App, operator: perdure.App) -> None:
    """A running async step is cancelled: the run is `cancelling`, then `cancelled` within ~1 s."""
    seen: list[str] = []

    @app.step
    async def slow() -> str:
        seen.append("started")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("finished")
        return "done"

    @app.step
    def after() -> None:
        seen.append("after")

    @app.workflow
    async def wf() -> None:
        await slow()
        await after()

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.02):
            handle = await app.start_async(wf)
            await wait_for_async("the step started", lambda: "started" in seen)
            loop = asyncio.get_running_loop()
            began = loop.time()
            assert await operator.client.cancel(handle.id) == "cancelling"
            await wait_for_async("cancelled", lambda: status_is(app, handle.id, "cancelled"), 8)
            assert loop.time() - began < 3.0  # a heartbeat comes every LEASE / 3 while busy
        assert seen == ["started", "cancelled"]
        kinds = [e.kind for e in await app.client.journal(handle.id)]
        assert kinds[-2:] == ["run.cancel_requested", "run.cancelled"]
        assert "step.outcome" not in kinds
        with pytest.raises(perdure.RunFailed) as info:
            await handle.result_async(timeout=1)
        assert info.value.status == "cancelled"

    asyncio.run(main())


def test_cancel_running_sync_workflow_stops_at_next_step(
    app: perdure.App, operator: perdure.App
) -> None:
    """A sync workflow that is cancelled mid-step is stopped before its next step runs."""
    release = asyncio.Event()
    seen: list[str] = []

    @app.step
    async def gate() -> None:
        seen.append("gate")
        await release.wait()

    @app.step
    def after() -> None:
        seen.append("after")

    @app.workflow
    def wf() -> None:
        gate()
        after()

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.02):
            handle = await app.start_async(wf)
            await wait_for_async("the gate step", lambda: "gate" in seen)
            assert await operator.client.cancel(handle.id) == "cancelling"
            if operator is not app:
                await asyncio.sleep(LEASE)  # heartbeats (every LEASE / 3) carry the request over
            release.set()
            await wait_for_async("cancelled", lambda: status_is(app, handle.id, "cancelled"), 8)
        assert seen == ["gate"]

    asyncio.run(main())


def register_two_steps(application: perdure.App, seen: list[str], operate: Any) -> Any:
    """A sync workflow of two steps; the first calls `operate(run_id)` while it runs.

    The second is a `once` step: its intent write is refused while a cancel or pause
    is pending, so the guarantee holds whichever process the request came from.
    """

    @application.step(name="first", effect="read")
    def first() -> None:
        operate(perdure.current_step().run_id)  # the request arrives mid-step
        seen.append("first")

    @application.step(name="second")
    def second() -> None:
        seen.append("second")

    @application.workflow(name="two_steps")
    def two_steps() -> str:
        first()
        second()
        return "done"

    return two_steps


def register_held_first(application: perdure.App, seen: list[str], release: asyncio.Event) -> Any:
    """An async workflow of two steps; the first runs until `release` is set."""

    @application.step
    async def first() -> None:
        seen.append("first")
        await release.wait()

    @application.step
    def second() -> None:
        seen.append("second")

    @application.workflow
    async def wf() -> str:
        await first()
        await second()
        return "done"

    return wf


def test_cancel_requested_during_a_step_stops_before_the_next_step(
    app: perdure.App, worker: TestWorker
) -> None:
    """A cancel requested (in this process) while a step runs ends the run before the next step."""
    seen: list[str] = []
    wf = register_two_steps(app, seen, app.cancel)
    handle = app.start(wf)
    worker.run_until_idle()
    assert seen == ["first"]
    assert handle.status() == "cancelled"


@pytest.mark.parametrize(("operation", "status"), [("cancel", "cancelled"), ("pause", "paused")])
def test_a_request_from_another_process_stops_before_the_next_step(
    app: perdure.App,
    db_url: str,
    clock: TestClock,
    worker: TestWorker,
    monkeypatch: pytest.MonkeyPatch,
    operation: str,
    status: str,
) -> None:
    """A cancel (or pause) from another process while a step runs ends (parks) the run before
    the next once step."""
    # A flush (after a slow first step, or by the linger timer) would learn of the request by
    # chance (e.g. on a busy machine); the guarantee must not depend on that, so those paths
    # are switched off here.
    monkeypatch.setattr(perdure.engine.steps, "LINGER", 3600.0)
    monkeypatch.setattr(perdure.engine.context, "LINGER", 3600.0)
    seen: list[str] = []
    operator = perdure.App(db_url, clock=clock)
    try:
        wf = register_two_steps(app, seen, getattr(operator, operation))
        handle = app.start(wf)
        worker.run_until_idle()
        assert seen == ["first"]
        assert handle.status() == status
    finally:
        operator.close()


# -- pause and resume ---------------------------------------------------------------------


def test_pause_sleeping_run_holds_it_past_its_timer(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A paused sleeping run is `paused`; its timer passing does not run it; resume continues it."""
    after: list[float] = []

    @app.step
    def later() -> None:
        after.append(clock.now())

    @app.workflow
    async def nap() -> str:
        await perdure.sleep(60)
        await later()
        return "done"

    handle = app.start(nap)
    worker.run_until_idle()
    assert app.pause(handle.id) == "paused"
    clock.advance(3600)
    assert worker.run_until_idle() == 0
    assert handle.status() == "paused"
    assert after == []
    assert app.resume(handle.id) == "pending"
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert after == [clock.now()]
    kinds = [e.kind for e in app.journal(handle.id)]
    assert kinds.index("run.paused") < kinds.index("run.resumed")


def test_resume_before_the_timer_goes_back_to_sleep(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A run resumed before its wake-up time sleeps again until the original wake_at."""

    @app.workflow
    async def nap() -> str:
        await perdure.sleep(600)
        return "done"

    handle = app.start(nap)
    worker.run_until_idle()
    wake_at = app.get_run(handle.id).wake_at
    app.pause(handle.id)
    clock.advance(100)
    app.resume(handle.id)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "sleeping"
    assert run.wake_at == wake_at
    clock.advance(500)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"


def test_pause_waiting_run_keeps_events_until_resume(app: perdure.App, worker: TestWorker) -> None:
    """An event sent to a paused run does not wake it; after resume it is delivered."""

    @app.workflow
    async def waits() -> str:
        return await perdure.wait_event("go")

    handle = app.start(waits)
    worker.run_until_idle()
    assert app.pause(handle.id) == "paused"
    app.send_event(handle.id, "go", "payload")
    assert handle.status() == "paused"
    assert worker.run_until_idle() == 0
    app.resume(handle.id)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "payload"


def test_pause_pending_run_keeps_it_from_starting(app: perdure.App, worker: TestWorker) -> None:
    """A run paused before any worker claimed it does not start until resumed."""
    calls: list[int] = []

    @app.workflow
    def work() -> int:
        calls.append(1)
        return 5

    handle = app.start(work)
    assert app.pause(handle.id) == "paused"
    assert worker.run_until_idle() == 0
    assert calls == []
    app.resume(handle.id)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 5


def test_pause_running_run_takes_effect_at_next_step(
    app: perdure.App, operator: perdure.App
) -> None:
    """A pause requested mid-step lets that step finish, then parks the run before the next."""
    release = asyncio.Event()
    seen: list[str] = []
    wf = register_held_first(app, seen, release)

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.02):
            handle = await app.start_async(wf)
            await wait_for_async("the first step", lambda: seen == ["first"])
            assert await operator.client.pause(handle.id) == "running"
            assert (await app.client.get(handle.id)).pause_requested
            if operator is not app:
                await asyncio.sleep(LEASE)  # heartbeats (every LEASE / 3) carry the request over
            release.set()
            await wait_for_async("paused", lambda: status_is(app, handle.id, "paused"))
            await asyncio.sleep(0.2)
            assert seen == ["first"]
            kinds = [e.kind for e in await app.client.journal(handle.id)]
            assert kinds.count("step.outcome") == 1  # the first step's outcome was kept
            # the worker may claim the resumed run before resume() reads the status back
            assert await app.client.resume(handle.id) in ("pending", "running")
            assert await handle.result_async(timeout=5) == "done"
            assert seen == ["first", "second"]

    asyncio.run(main())


def test_pause_requested_during_a_step_stops_before_the_next_step(
    app: perdure.App, worker: TestWorker
) -> None:
    """A pause requested (in this process) while a step runs parks the run before the next step."""
    seen: list[str] = []
    wf = register_two_steps(app, seen, app.pause)
    handle = app.start(wf)
    worker.run_until_idle()
    assert seen == ["first"]
    assert handle.status() == "paused"
    app.resume(handle.id)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert seen == ["first", "second"]


def test_resume_of_pause_request_before_boundary_cancels_the_pause(app: perdure.App) -> None:
    """Resuming a run whose pause was only requested withdraws the request; it never parks."""
    release = asyncio.Event()
    seen: list[str] = []
    wf = register_held_first(app, seen, release)

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=LEASE, poll=0.02):
            handle = await app.start_async(wf)
            await wait_for_async("the first step", lambda: seen == ["first"])
            await app.client.pause(handle.id)
            assert await app.client.resume(handle.id) == "running"
            release.set()
            assert await handle.result_async(timeout=5) == "done"
            assert seen == ["first", "second"]
            kinds = [e.kind for e in await app.client.journal(handle.id)]
            assert "run.paused" not in kinds

    asyncio.run(main())


def test_pause_and_resume_errors(app: perdure.App, worker: TestWorker) -> None:
    """Pausing a finished run or resuming a run that is not paused raises a clear PerdureError."""

    @app.workflow
    async def done() -> None:
        return None

    @app.workflow
    async def nap() -> None:
        await perdure.sleep(60)

    finished = app.start(done, run_id="finished")
    sleeping = app.start(nap, run_id="sleeping")
    worker.run_until_idle()
    assert finished.status() == "completed"
    with pytest.raises(perdure.PerdureError, match="'finished' is completed"):
        app.pause("finished")
    with pytest.raises(perdure.PerdureError, match="not paused"):
        app.resume("sleeping")
    assert sleeping.status() == "sleeping"


def test_pause_twice_is_harmless(app: perdure.App, worker: TestWorker) -> None:
    """Pausing an already paused run keeps it paused and adds no second pause entry."""

    @app.workflow
    async def nap() -> None:
        await perdure.sleep(60)

    handle = app.start(nap)
    worker.run_until_idle()
    assert app.pause(handle.id) == "paused"
    assert app.pause(handle.id) == "paused"
    assert [e.kind for e in app.journal(handle.id)].count("run.paused") == 1


def test_cancel_paused_run(app: perdure.App, worker: TestWorker) -> None:
    """A paused run can be cancelled directly."""

    @app.workflow
    async def nap() -> None:
        await perdure.sleep(60)

    handle = app.start(nap)
    worker.run_until_idle()
    app.pause(handle.id)
    assert app.cancel(handle.id) == "cancelled"
    with pytest.raises(perdure.PerdureError):
        app.resume(handle.id)


def test_resume_is_not_lost_when_the_worker_parks_the_run_meanwhile(
    app: perdure.App, clock: TestClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume racing the worker that parks the run as paused still leaves it runnable."""
    from perdure.store.base import Append, Entry

    @app.workflow
    def quick() -> int:
        return 1

    async def main() -> None:
        await app.start_async(quick, run_id="race")
        [claim] = await app.runtime.store.claim("w1", clock.now(), 30.0, 1, [quick.name])
        assert await app.client.pause("race") == "running"  # pause requested, not reached
        real_get = app.client.get

        async def get_then_worker_parks(run_id: str) -> Any:
            run = await real_get(run_id)
            if run.status == "running":  # the worker reaches its step boundary right now
                await app.runtime.store.append(
                    Append(
                        run_id="race",
                        epoch=claim.run.lease_epoch,
                        entries=[Entry(kind="run.paused", at=clock.now())],
                        status="paused",
                        fields={"lease_owner": None, "lease_until": None},
                    )
                )
            return run

        monkeypatch.setattr(app.client, "get", get_then_worker_parks)
        assert await app.client.resume("race") == "pending"
        monkeypatch.undo()
        run = await app.client.get("race")
        assert (run.status, run.pause_requested) == ("pending", False)

    asyncio.run(main())
