"""Replay: journaled outcomes are returned instead of re-executing, and divergence is loud."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

import perdure
from perdure.testing import TestClock, TestWorker


def test_steps_before_sleep_run_once(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A resumed run does not execute again the steps it completed before its sleep."""
    calls: list[str] = []

    @app.step(effect="read")
    def fetch(x: int) -> int:
        calls.append(f"fetch {x}")
        return x + 1

    @app.workflow
    def wf(x: int) -> int:
        y = fetch(x)
        perdure.sleep(timedelta(hours=1))
        return fetch(y)

    handle = app.start(wf, 1)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    assert calls == ["fetch 1"]

    clock.advance(timedelta(hours=1, seconds=1))
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert calls == ["fetch 1", "fetch 2"]


def test_async_workflow_replay_skips_done_steps(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """An async workflow replayed after a sleep does not execute its completed async steps again."""
    calls: list[int] = []

    @app.step
    async def bump(x: int) -> int:
        calls.append(x)
        return x + 1

    @app.workflow
    async def wf() -> int:
        a = await bump(0)
        await perdure.sleep(60)
        b = await bump(a)
        await perdure.sleep(60)
        return await bump(b)

    handle = app.start(wf)
    for _ in range(3):
        worker.run_until_idle()
        clock.advance(61)
    assert handle.result(timeout=5) == 3
    assert calls == [0, 1, 2]


def test_gathered_steps_replay(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """Steps started together with asyncio.gather are replayed, each with its own value."""
    calls: list[int] = []

    @app.step
    async def square(x: int) -> int:
        calls.append(x)
        await asyncio.sleep(0.01 * (3 - x))  # finish in reverse order
        return x * x

    @app.workflow
    async def wf() -> list[int]:
        values = await asyncio.gather(*(square(i) for i in range(4)))
        await perdure.sleep(60)
        return list(values)

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [0, 1, 4, 9]
    assert sorted(calls) == [0, 1, 2, 3]


def test_sleep_not_yet_due_keeps_run_parked(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A sleeping run is not resumed before its wake-up time."""

    @app.workflow
    def wf() -> str:
        perdure.sleep(100)
        return "awake"

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(99)
    assert worker.run_until_idle() == 0
    assert handle.status() == "sleeping"
    clock.advance(2)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "awake"


def test_recorded_error_reraised_on_replay(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A recorded step failure is re-raised as the same StepError on replay, not re-run."""
    calls: list[int] = []
    seen: list[tuple[str, str, str, int]] = []

    @app.step(name="flaky")
    def flaky() -> int:
        calls.append(1)
        raise KeyError("missing thing")

    @app.workflow
    def wf() -> str:
        try:
            flaky()
        except perdure.StepError as exc:
            seen.append((str(exc), exc.step, exc.error_type, exc.attempts))
        perdure.sleep(10)
        return "done"

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(11)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert calls == [1]
    assert len(seen) == 2
    assert seen[0] == seen[1]
    message, step, error_type, attempts = seen[0]
    assert (step, error_type, attempts) == ("flaky", "KeyError", 1)
    assert "missing thing" in message


def test_deterministic_values_replay(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """now(), uuid() and random() return the journaled values when the workflow is replayed."""
    seen: list[tuple[object, ...]] = []

    @app.workflow
    def wf() -> None:
        values = (perdure.now(), perdure.uuid(), perdure.random())
        seen.append(values)
        perdure.sleep(5)

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(6)
    worker.run_until_idle()
    assert handle.status() == "completed"
    assert len(seen) == 2
    assert seen[0] == seen[1]
    assert seen[0][0] == datetime.fromtimestamp(clock.now() - 6, UTC)


def test_crash_recovery_replays_completed_steps(app: perdure.App, clock: TestClock) -> None:
    """A run recovered after a crash does not execute the steps that completed before the crash."""
    calls: list[str] = []

    @app.step(name="one", effect="idempotent")
    def one() -> int:
        calls.append("one")
        return 1

    @app.step(name="two", effect="idempotent")
    def two(x: int) -> int:
        calls.append("two")
        return x + 1

    @app.workflow
    def wf() -> int:
        return two(one())

    handle = app.start(wf)
    crashing = TestWorker(app)
    crashing.crash_after_intent("two")
    with pytest.raises(perdure.testing.SimulatedCrash):
        crashing.run_until_idle()
    assert calls == ["one"]

    clock.advance(crashing.lease + 1)
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == 2
    assert calls == ["one", "two"]


# -- non-determinism ---------------------------------------------------------------------


def _start_and_park(app: perdure.App) -> str:
    """Register `orders` as step a, sleep, step b; run it until it sleeps; return its id."""

    @app.step(name="a")
    def a() -> int:
        return 1

    @app.step(name="b")
    def b() -> int:
        return 2

    @app.workflow(name="orders")
    def orders() -> int:
        x = a()
        perdure.sleep(60)
        return x + b()

    handle = app.start(orders, run_id="order-7")
    TestWorker(app).run_until_idle()
    assert handle.status() == "sleeping"
    return handle.id


def test_changed_step_is_non_determinism(db_url: str, clock: TestClock) -> None:
    """Replay against code calling another step fails the run under upgrade="latest" (the
    default parks it first: test_versions.py), naming run, position, steps."""
    old = perdure.App(db_url, clock=clock)
    run_id = _start_and_park(old)
    old.close()

    new = perdure.App(db_url, clock=clock)
    calls: list[str] = []

    @new.step(name="c")
    def c() -> int:
        calls.append("c")
        return 3

    @new.step(name="b")
    def b() -> int:
        return 2

    @new.workflow(name="orders", upgrade="latest")
    def orders() -> int:
        x = c()  # was a() when the run started
        perdure.sleep(60)
        return x + b()

    clock.advance(61)
    TestWorker(new).run_until_idle()
    run = new.get_run(run_id)
    assert run.status == "failed"
    assert calls == [], "the diverging step must not be executed"
    error = json.loads(run.error or "{}")
    assert error["type"] == "perdure.errors.NonDeterminismError"
    message = error["message"]
    assert run_id in message
    assert "position 0" in message
    assert "'a'" in message and "'c'" in message
    assert message.index("'a'") < message.index("'c'"), "expected (journal) before found (code)"
    with pytest.raises(perdure.RunFailed, match="diverged"):
        new.handle(run_id).result(timeout=5)
    new.close()


def test_step_replaced_by_sleep_is_non_determinism(db_url: str, clock: TestClock) -> None:
    """Code calling a step where the journal holds a sleep fails with NonDeterminismError."""
    old = perdure.App(db_url, clock=clock)
    run_id = _start_and_park(old)
    old.close()

    new = perdure.App(db_url, clock=clock)

    @new.step(name="a")
    def a() -> int:
        return 1

    @new.workflow(name="orders", upgrade="latest")  # fails, unchecked
    def orders() -> int:
        x = a()
        a()  # the journal has the sleep at position 1
        perdure.sleep(60)
        return x

    clock.advance(61)
    TestWorker(new).run_until_idle()
    run = new.get_run(run_id)
    assert run.status == "failed"
    message = json.loads(run.error or "{}")["message"]
    assert "position 1" in message and "sleep" in message and "'a'" in message
    new.close()


def test_non_determinism_error_attributes() -> None:
    """NonDeterminismError carries run id, position, expected and found, and says how to fix it."""
    err = perdure.NonDeterminismError("r1", 4, "step 'a'", "step 'c'")
    assert (err.run_id, err.position, err.expected, err.found) == ("r1", 4, "step 'a'", "step 'c'")
    assert "patched" in str(err)


def test_non_determinism_not_swallowed_by_broad_except(db_url: str, clock: TestClock) -> None:
    """A workflow's `except Exception` around a diverging call cannot hide the non-determinism."""
    old = perdure.App(db_url, clock=clock)
    run_id = _start_and_park(old)
    old.close()

    new = perdure.App(db_url, clock=clock)

    @new.step(name="c")
    def c() -> int:
        return 3

    @new.step(name="b")
    def b() -> int:
        return 2

    @new.workflow(name="orders", upgrade="latest")  # fails, unchecked
    def orders() -> int:
        try:
            x = c()
        except Exception:
            x = 0
        perdure.sleep(60)
        return x + b()

    clock.advance(61)
    TestWorker(new).run_until_idle()
    assert new.get_run(run_id).status == "failed"
    new.close()
