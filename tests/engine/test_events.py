"""Events: perdure.wait_event in workflows and App.send_event from outside."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import perdure
from live_workers import worker_task
from perdure.testing import TestClock, TestWorker
from waits import wait_for_async


def unconsumed(app: perdure.App, run_id: str, name: str) -> Any:
    """The oldest event `name` still waiting to be consumed by `run_id`, or None."""
    return app.runtime.sync(app.runtime.store.next_event(run_id, name), "test")


def test_wait_event_parks_and_send_delivers_payload(app: perdure.App, worker: TestWorker) -> None:
    """A waiting run is `waiting` for the event; send_event wakes it and the payload is returned."""

    @app.workflow
    async def approval() -> Any:
        return await perdure.wait_event("approve")

    handle = app.start(approval)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "waiting"
    assert run.waiting_for == "event:approve"
    assert run.lease_owner is None

    app.send_event(handle.id, "approve", {"by": "ana", "ok": True})
    assert handle.status() == "pending"
    worker.run_until_idle()
    assert handle.result(timeout=5) == {"by": "ana", "ok": True}


def test_sync_workflow_waits_for_event(app: perdure.App, worker: TestWorker) -> None:
    """wait_event in a sync workflow returns the payload directly after the event arrives."""

    @app.workflow
    def approval(prefix: str) -> str:
        answer = perdure.wait_event("answer")
        return f"{prefix}:{answer}"

    handle = app.start(approval, "got")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    handle.send_event("answer", "yes")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "got:yes"


def test_event_sent_before_the_wait_is_kept(app: perdure.App, worker: TestWorker) -> None:
    """An event sent before the workflow waits for it is kept and delivered without parking."""

    @app.workflow
    async def approval() -> Any:
        return await perdure.wait_event("approve")

    handle = app.start(approval)
    app.send_event(handle.id, "approve", 42)
    assert worker.run_until_idle() == 1
    assert handle.result(timeout=5) == 42
    assert app.get_run(handle.id).lease_epoch == 1  # claimed once: it never parked


def test_event_sent_while_sleeping_is_kept(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """An event that arrives while the run sleeps does not wake it early and is delivered later."""

    @app.workflow
    async def later() -> Any:
        await perdure.sleep(timedelta(hours=1))
        return await perdure.wait_event("go")

    handle = app.start(later)
    worker.run_until_idle()
    app.send_event(handle.id, "go", "payload")
    assert worker.run_until_idle() == 0
    assert handle.status() == "sleeping"
    clock.advance(timedelta(hours=1))
    worker.run_until_idle()
    assert handle.result(timeout=5) == "payload"


def test_events_of_one_name_are_consumed_in_order(app: perdure.App, worker: TestWorker) -> None:
    """Several events of the same name are consumed one per wait, in the order they were sent."""

    @app.workflow
    async def collect(n: int) -> list[Any]:
        return [await perdure.wait_event("item") for _ in range(n)]

    handle = app.start(collect, 4)
    app.send_event(handle.id, "item", "a")
    app.send_event(handle.id, "item", "b")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    app.send_event(handle.id, "item", "c")
    app.send_event(handle.id, "item", "d")
    worker.run_until_idle()
    assert handle.result(timeout=5) == ["a", "b", "c", "d"]
    assert unconsumed(app, handle.id, "item") is None


def test_events_are_matched_by_name(app: perdure.App, worker: TestWorker) -> None:
    """An event of another name does not satisfy a wait and stays for its own wait."""

    @app.workflow
    async def two() -> list[Any]:
        first = await perdure.wait_event("first")
        second = await perdure.wait_event("second")
        return [first, second]

    handle = app.start(two)
    app.send_event(handle.id, "second", 2)
    worker.run_until_idle()
    assert app.get_run(handle.id).waiting_for == "event:first"
    app.send_event(handle.id, "first", 1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [1, 2]


def test_received_event_is_not_consumed_again_on_replay(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A replayed wait_event returns the journaled payload and leaves later events untouched."""

    @app.workflow
    async def once() -> Any:
        got = await perdure.wait_event("x")
        await perdure.sleep(60)  # forces a second execution that replays the wait
        return got

    handle = app.start(once)
    app.send_event(handle.id, "x", "first")
    app.send_event(handle.id, "x", "second")
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "first"
    left = unconsumed(app, handle.id, "x")
    assert left is not None and left.payload == '"second"'


def test_wait_timeout_can_be_caught(app: perdure.App, clock: TestClock, worker: TestWorker) -> None:
    """With no event, wait_event raises WaitTimeout at its timeout; the workflow may catch it."""

    @app.workflow
    async def patient() -> str:
        try:
            await perdure.wait_event("reply", timeout=timedelta(minutes=10))
        except perdure.WaitTimeout:
            return "gave up"
        return "answered"

    handle = app.start(patient)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "waiting"
    assert run.wake_at == pytest.approx(clock.now() + 600)
    clock.advance(599)
    assert worker.run_until_idle() == 0
    assert handle.status() == "waiting"
    clock.advance(1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "gave up"


def test_uncaught_wait_timeout_fails_the_run(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A WaitTimeout the workflow does not catch fails the run with that error."""

    @app.workflow
    def impatient() -> Any:
        return perdure.wait_event("reply", timeout=30)

    handle = app.start(impatient)
    worker.run_until_idle()
    clock.advance(31)
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert info.value.status == "failed"
    assert "reply" in (info.value.error or "")


def test_event_before_timeout_wins(app: perdure.App, clock: TestClock, worker: TestWorker) -> None:
    """An event that arrives before the timeout is delivered; the timeout then never fires."""

    @app.workflow
    async def patient() -> Any:
        return await perdure.wait_event("reply", timeout=600)

    handle = app.start(patient)
    worker.run_until_idle()
    clock.advance(300)
    app.send_event(handle.id, "reply", "in time")
    worker.run_until_idle()
    clock.advance(600)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "in time"


def test_event_after_timeout_stays_for_the_next_wait(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """An event that comes after its wait timed out is kept for the next wait of that name."""

    @app.workflow
    async def twice() -> list[Any]:
        try:
            first = await perdure.wait_event("ping", timeout=60)
        except perdure.WaitTimeout:
            first = "timeout"
        second = await perdure.wait_event("ping")
        return [first, second]

    handle = app.start(twice)
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert app.get_run(handle.id).waiting_for == "event:ping"
    app.send_event(handle.id, "ping", "late")
    worker.run_until_idle()
    assert handle.result(timeout=5) == ["timeout", "late"]


def test_typed_event_payload(app: perdure.App, worker: TestWorker) -> None:
    """wait_event(type=Model) returns the payload validated as that pydantic model."""

    class Decision(BaseModel):
        approved: bool
        note: str = ""

    @app.workflow
    async def review() -> str:
        decision = await perdure.wait_event("decision", type=Decision)
        assert isinstance(decision, Decision)
        return f"{decision.approved}:{decision.note}"

    handle = app.start(review)
    app.send_event(handle.id, "decision", {"approved": True, "note": "lgtm"})
    worker.run_until_idle()
    assert handle.result(timeout=5) == "True:lgtm"


def test_send_event_to_unknown_run_raises_run_not_found(app: perdure.App) -> None:
    """Sending to a run id that names no run raises perdure.RunNotFound."""
    with pytest.raises(perdure.RunNotFound) as info:
        app.send_event("no-such-run", "approve", 1)
    assert info.value.run_id == "no-such-run"


def test_send_event_to_finished_run_is_a_clear_error(app: perdure.App, worker: TestWorker) -> None:
    """Sending to a completed run raises a one-line PerdureError naming the run and its status."""

    @app.workflow
    async def done() -> int:
        return 1

    handle = app.start(done, run_id="finished-run")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 1
    with pytest.raises(perdure.PerdureError) as info:
        app.send_event("finished-run", "late", 1)
    message = str(info.value)
    assert "finished-run" in message
    assert "completed" in message
    assert "\n" not in message
    assert unconsumed(app, "finished-run", "late") is None


def test_send_event_payload_must_be_json(app: perdure.App, worker: TestWorker) -> None:
    """A payload that is not JSON is refused with perdure.PayloadError and nothing is delivered."""

    @app.workflow
    async def approval() -> Any:
        return await perdure.wait_event("approve")

    handle = app.start(approval)
    with pytest.raises(perdure.PayloadError):
        app.send_event(handle.id, "approve", object())
    assert unconsumed(app, handle.id, "approve") is None


def test_send_event_wakes_a_real_worker_promptly(app: perdure.App) -> None:
    """With a worker running, send_event resumes the waiting run without waiting for a poll."""

    @app.workflow
    async def approval() -> Any:
        return await perdure.wait_event("approve")

    async def main() -> None:
        async with worker_task(app, concurrency=2, lease=3, poll=5.0):
            handle = await app.start_async(approval)

            async def waiting() -> bool:
                return await handle.status_async() == "waiting"

            await wait_for_async("the run waiting", waiting, timeout=5)
            await app.client.send_event(handle.id, "approve", "ok")
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await handle.result_async(timeout=3) == "ok"
            assert loop.time() - started < 2.0  # far below the 5 s poll interval

    asyncio.run(main())
