"""A store outage met by an engine read (not a write) is waited out: the read is tried again
until the store answers and the run goes on in the same execution; it never fails it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.errors import StoreUnavailable
from perdure.store.base import CANCELLED
from perdure.testing import TestClock, TestWorker


def fail_once(store: Any, method: str, when: Callable[..., bool] = lambda *a: True) -> list[int]:
    """Make `store.<method>` raise StoreUnavailable the first time `when(*args)` holds."""
    real = getattr(store, method)
    hits: list[int] = []

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if not hits and when(*args, **kwargs):
            hits.append(1)
            raise StoreUnavailable("store x unreachable: server closed the connection")
        return await real(*args, **kwargs)

    setattr(store, method, flaky)
    return hits


def no_engine_errors(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_outage_while_waiting_for_an_event_is_waited_out(
    app: perdure.App, worker: TestWorker, clock: TestClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The event read meets the outage: read again, the run waits for its event, no
    recovery (the lease never had to expire) and no failure."""

    @app.workflow(name="waits")
    async def waits() -> Any:
        return await perdure.wait_event("go")

    hits = fail_once(app.runtime.store, "next_event")
    handle = app.start(waits)
    worker.run_until_idle()
    assert hits and handle.status() == "waiting"
    assert not [e for e in app.journal(handle.id) if e.kind == "run.recovered"]
    handle.send_event("go", 7)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 7
    no_engine_errors(caplog)


def test_outage_while_reading_a_child_result_is_waited_out(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    @app.workflow(name="child")
    async def child() -> int:
        return 3

    @app.workflow(name="parent")
    async def parent() -> int:
        return int(await child()) + 1

    hits = fail_once(app.runtime.store, "get_run")
    handle = app.start(parent)
    worker.run_until_idle()
    assert hits and handle.status() != "failed"
    clock.advance(worker.lease + 1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 4


def test_outage_reading_the_journal_at_claim_is_no_engine_error(
    app: perdure.App, worker: TestWorker, clock: TestClock, caplog: pytest.LogCaptureFixture
) -> None:
    @app.workflow(name="plain")
    async def plain() -> str:
        await perdure.sleep(10)
        return "ok"

    handle = app.start(plain)
    worker.run_until_idle()  # asleep, with a journal to read when it wakes
    assert handle.status() == "sleeping"
    hits = fail_once(app.runtime.store, "journal")
    clock.advance(11)
    worker.run_until_idle()
    assert hits and handle.status() == "running"
    clock.advance(worker.lease + 1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "ok"
    no_engine_errors(caplog)


def test_outage_while_finishing_a_cancel_is_no_engine_error(
    app: perdure.App, worker: TestWorker, clock: TestClock, caplog: pytest.LogCaptureFixture
) -> None:
    @app.step(effect="read")
    def ask_to_cancel() -> None:
        app.cancel(perdure.current_step().run_id)

    @app.step(effect="once")
    def never() -> None:
        raise AssertionError("a cancelled run executed its next step")

    @app.workflow(name="cancelled")
    async def cancelled() -> None:
        await ask_to_cancel()
        await never()

    hits = fail_once(app.runtime.store, "append", lambda a: a.status == CANCELLED)
    handle = app.start(cancelled)
    worker.run_until_idle()
    assert hits and handle.status() == "cancelling"
    clock.advance(worker.lease + 1)
    worker.run_until_idle()
    assert handle.status() == CANCELLED
    no_engine_errors(caplog)


def land_then_fail(store: Any, when: Callable[[Any], bool]) -> list[int]:
    """Make the first `store.append` matching `when` land, then report the connection lost
    (a COMMIT that reached the server, its answer cut off)."""
    real = store.append
    hits: list[int] = []

    async def flaky(append: Any) -> Any:
        result = await real(append)
        if not hits and when(append):
            hits.append(1)
            raise StoreUnavailable("store x unreachable: server closed the connection")
        return result

    store.append = flaky
    return hits


def outcome_of(step: str) -> Callable[[Any], bool]:
    return lambda a: any(e.kind == "step.outcome" and e.name == step for e in a.entries)


@pytest.mark.parametrize("landed", [False, True], ids=["lost", "landed-unseen"])
def test_a_once_outcome_met_by_an_outage_is_recorded_when_the_store_is_back(
    app: perdure.App, worker: TestWorker, caplog: pytest.LogCaptureFixture, landed: bool
) -> None:
    """The write of a once step's outcome meets an outage: the live worker keeps it and
    writes it once the store answers (once, whether or not the first try had landed); the
    run completes with no recovery and no needs_attention, the body ran once."""
    calls: list[int] = []

    @app.step(effect="once", name="charge")
    def charge() -> str:
        calls.append(1)
        return "charged"

    @app.step(effect="read", name="after")
    def after() -> str:
        return "read"

    @app.workflow(name="pays")
    async def pays() -> str:
        return await charge() + "+" + await after()

    hits = (land_then_fail if landed else fail_once_append)(app.runtime.store, outcome_of("charge"))
    handle = app.start(pays)
    with caplog.at_level(logging.WARNING, logger="perdure.worker"):
        worker.run_until_idle()
    assert hits and handle.result(timeout=5) == "charged+read"
    assert calls == [1]
    kinds = [e.kind for e in app.journal(handle.id) if e.name == "charge"]
    assert kinds == ["step.intent", "step.outcome"]
    assert not [e for e in app.journal(handle.id) if e.kind == "run.recovered"]
    assert any("holding them until it is back" in r.getMessage() for r in caplog.records)
    no_engine_errors(caplog)


def fail_once_append(store: Any, when: Callable[[Any], bool]) -> list[int]:
    return fail_once(store, "append", when)
