"""Retry policies: attempts, which errors retry, backoff that parks the run, timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import perdure
from perdure.engine import sticky
from perdure.testing import TestClock, TestWorker

NOW = perdure.Retry(initial=0, jitter=0)  # retries without waiting


def failing(times: int, error: type[Exception] = RuntimeError):  # type: ignore[no-untyped-def]
    """A step body that fails `times` times, then returns the attempt number it succeeded on."""
    attempts: list[int] = []

    def body() -> int:
        attempts.append(perdure.current_step().attempt)
        if len(attempts) <= times:
            raise error(f"failure {len(attempts)}")
        return attempts[-1]

    body.attempts = attempts  # type: ignore[attr-defined]
    return body


def test_retries_until_success(app: perdure.App, worker: TestWorker) -> None:
    """A step failing twice under max_attempts=3 succeeds on attempt 3, each attempt journaled."""
    body = failing(2)
    step = app.step(name="flaky", effect="idempotent", retry=NOW)(body)

    @app.workflow
    def wf() -> int:
        return step()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert body.attempts == [1, 2, 3]  # type: ignore[attr-defined]
    failed = [e for e in app.journal(handle.id) if e.kind == "step.attempt_failed"]
    assert [e.attempt for e in failed] == [1, 2]
    assert json.loads(failed[0].data or "{}")["error"]["message"] == "failure 1"


def test_last_failure_raised_into_workflow(app: perdure.App, worker: TestWorker) -> None:
    """After max_attempts failures the workflow receives a catchable StepError with the count."""
    body = failing(10, ValueError)
    policy = perdure.Retry(max_attempts=4, initial=0, jitter=0)
    step = app.step(name="flaky", effect="idempotent", retry=policy)(body)

    @app.workflow
    def wf() -> list[object]:
        try:
            step()
        except perdure.StepError as exc:
            return [exc.step, exc.error_type, exc.message, exc.attempts]
        return []

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == ["flaky", "ValueError", "failure 4", 4]
    assert body.attempts == [1, 2, 3, 4]  # type: ignore[attr-defined]


def test_uncaught_last_failure_fails_run(app: perdure.App, worker: TestWorker) -> None:
    """A step that exhausts its attempts and is not caught fails the run with its error."""
    step = app.step(name="flaky", effect="read", retry=perdure.Retry(max_attempts=2, initial=0))(
        failing(5)
    )

    @app.workflow
    def wf() -> int:
        return step()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.status() == "failed"
    with pytest.raises(perdure.RunFailed, match="flaky"):
        handle.result(timeout=5)


def test_no_retry_on_fails_at_once(app: perdure.App, worker: TestWorker) -> None:
    """An exception listed in no_retry_on is not retried even with attempts left."""
    body = failing(5, PermissionError)
    policy = perdure.Retry(max_attempts=5, initial=0, no_retry_on=(PermissionError,))
    step = app.step(name="guarded", effect="idempotent", retry=policy)(body)

    @app.workflow
    def wf() -> int:
        try:
            return step()
        except perdure.StepError as exc:
            return -exc.attempts

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == -1
    assert body.attempts == [1]  # type: ignore[attr-defined]


def test_retry_on_limits_retried_errors(app: perdure.App, worker: TestWorker) -> None:
    """An exception not in retry_on fails at once; one in retry_on is retried."""
    policy = perdure.Retry(max_attempts=5, initial=0, retry_on=(TimeoutError,))
    value_error = failing(5, ValueError)
    timeout_error = failing(2, TimeoutError)
    bad = app.step(name="bad", effect="read", retry=policy)(value_error)
    slow = app.step(name="slow", effect="read", retry=policy)(timeout_error)

    @app.workflow
    def wf() -> int:
        with contextlib.suppress(perdure.StepError):
            bad()
        return slow()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert value_error.attempts == [1]  # type: ignore[attr-defined]
    assert timeout_error.attempts == [1, 2, 3]  # type: ignore[attr-defined]


def test_once_step_not_retried_by_default(app: perdure.App, worker: TestWorker) -> None:
    """A once step without a retry policy gets a single attempt."""
    body = failing(1)
    step = app.step(name="pay")(body)

    @app.workflow
    def wf() -> str:
        try:
            step()
        except perdure.StepError as exc:
            return f"{exc.attempts}"
        return "ok"

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "1"
    assert body.attempts == [1]  # type: ignore[attr-defined]


def test_default_retry_for_rerunnable_steps(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A read step without a policy gets 3 attempts, 1 s then 2 s apart (±20%)."""
    body = failing(2)
    step = app.step(name="fetch", effect="read")(body)

    @app.workflow
    def wf() -> int:
        return step()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    clock.advance(1.21)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    clock.advance(2.41)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3


def test_long_backoff_parks_run(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """A retry delay parks the run as sleeping until the clock passes it, then retries."""
    body = failing(1)
    policy = perdure.Retry(
        max_attempts=2, initial=timedelta(minutes=10), max_delay=timedelta(hours=1), jitter=0
    )
    step = app.step(name="flaky", effect="idempotent", retry=policy)(body)

    @app.workflow
    def wf() -> int:
        return step()

    handle = app.start(wf)
    started = clock.now()
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "sleeping"
    assert run.wake_at == started + 600
    assert run.lease_owner is None

    clock.advance(599)
    assert worker.run_until_idle() == 0
    assert body.attempts == [1]  # type: ignore[attr-defined]

    clock.advance(2)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 2
    assert body.attempts == [1, 2]  # type: ignore[attr-defined]


def test_backoff_does_not_rerun_earlier_steps(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """Resuming after a parked retry replays the steps before the retried one."""
    calls: list[str] = []

    @app.step(name="first", effect="read")
    def first() -> int:
        calls.append("first")
        return 1

    body = failing(1)
    step = app.step(name="flaky", effect="idempotent", retry=perdure.Retry(initial=60))(body)

    @app.workflow
    def wf() -> int:
        return first() + step()

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(100)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert calls == ["first"]


def test_async_step_timeout(app: perdure.App, worker: TestWorker) -> None:
    """An async step running past its timeout raises StepTimeout into the workflow."""

    @app.step(name="slow", timeout=0.05)
    async def slow() -> str:
        await asyncio.sleep(2)
        return "finished"

    @app.workflow
    async def wf() -> str:
        try:
            return await slow()
        except perdure.StepTimeout as exc:
            return f"timeout in {exc.step}"

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "timeout in slow"


def test_async_step_timeout_is_a_step_error(app: perdure.App, worker: TestWorker) -> None:
    """A timed-out async step fails its attempt with a StepError whose type is StepTimeout."""

    @app.step(name="slow", timeout=timedelta(milliseconds=50))
    async def slow() -> str:
        await asyncio.sleep(2)
        return "finished"

    @app.workflow
    async def wf() -> str:
        try:
            return await slow()
        except perdure.StepError as exc:
            return exc.error_type

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5).endswith("StepTimeout")


def test_step_timeout_replays_as_step_timeout(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A recorded timeout is raised again as the same StepTimeout when the workflow is replayed."""
    seen: list[tuple[type, str]] = []
    calls: list[int] = []

    @app.step(name="slow", timeout=0.05)
    async def slow() -> None:
        calls.append(1)
        await asyncio.sleep(2)

    @app.workflow
    async def wf() -> None:
        try:
            await slow()
        except perdure.StepError as exc:
            seen.append((type(exc), str(exc)))
        await perdure.sleep(60)

    handle = app.start(wf)
    worker.run_until_idle()
    sticky.cache_of(app.runtime).clear()  # wake by replay, not from where it parked in memory
    clock.advance(61)
    worker.run_until_idle()
    assert handle.status() == "completed"
    assert calls == [1]
    assert [kind for kind, _ in seen] == [perdure.StepTimeout, perdure.StepTimeout]
    assert seen[0][1] == seen[1][1]
    assert seen[0][1].count("failed after") == 1, "the message is not wrapped twice"


def test_exhausted_after_parked_backoff_counts_all_attempts(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """Attempts made before and after a parked backoff add up in the final StepError."""
    body = failing(10)
    policy = perdure.Retry(max_attempts=3, initial=60, jitter=0)
    step = app.step(name="flaky", effect="idempotent", retry=policy)(body)

    @app.workflow
    def wf() -> int:
        try:
            step()
        except perdure.StepError as exc:
            return exc.attempts
        return 0

    handle = app.start(wf)
    for _ in range(3):
        worker.run_until_idle()
        clock.advance(121)
    assert handle.result(timeout=5) == 3
    assert body.attempts == [1, 2, 3]  # type: ignore[attr-defined]


def test_timed_out_attempt_is_retried(app: perdure.App, worker: TestWorker) -> None:
    """A timeout counts as a failed attempt and the next attempt may succeed."""
    attempts: list[int] = []

    @app.step(name="slow", effect="read", timeout=0.05, retry=NOW)
    async def slow() -> int:
        attempt = perdure.current_step().attempt
        attempts.append(attempt)
        if attempt == 1:
            await asyncio.sleep(2)
        return attempt

    @app.workflow
    async def wf() -> int:
        return await slow()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 2
    assert attempts == [1, 2]


# -- the policy object -------------------------------------------------------------------


def test_delay_grows_exponentially_without_jitter() -> None:
    """With no jitter, delays are initial * backoff**(attempt-1), capped at max_delay."""
    policy = perdure.Retry(initial=1.5, backoff=2, max_delay=10, jitter=0)
    assert [policy.delay(n) for n in range(1, 6)] == [1.5, 3.0, 6.0, 10.0, 10.0]


def test_delay_capped_by_default_max_delay() -> None:
    """Without max_delay a long initial delay is cut to the default cap of 60 seconds."""
    assert perdure.Retry(initial=600, jitter=0).delay(1) == 60.0


def test_delay_accepts_timedeltas() -> None:
    """initial and max_delay may be timedeltas."""
    policy = perdure.Retry(initial=timedelta(seconds=2), max_delay=timedelta(seconds=3), jitter=0)
    assert (policy.delay(1), policy.delay(2)) == (2.0, 3.0)


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"backoff": 0.5}, {"jitter": -0.1}, {"jitter": 1.5}]
)
def test_invalid_policy_rejected(kwargs: dict[str, float]) -> None:
    """A policy with impossible numbers is refused with a ConfigError."""
    with pytest.raises(perdure.ConfigError):
        perdure.Retry(**kwargs)  # type: ignore[arg-type]


def test_should_retry_counts_attempts() -> None:
    """should_retry says yes until the last attempt, and never for no_retry_on errors."""
    policy = perdure.Retry(max_attempts=3, no_retry_on=(KeyError,))
    assert policy.should_retry(ValueError(), 1)
    assert policy.should_retry(ValueError(), 2)
    assert not policy.should_retry(ValueError(), 3)
    assert not policy.should_retry(KeyError(), 1)


@given(
    initial=st.floats(min_value=0, max_value=1e3),
    backoff=st.floats(min_value=1, max_value=10),
    max_delay=st.floats(min_value=0.001, max_value=1e4),
    jitter=st.floats(min_value=0, max_value=1),
    attempt=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_delay_within_jitter_bounds(
    initial: float, backoff: float, max_delay: float, jitter: float, attempt: int, seed: int
) -> None:
    """Every delay lies within ±jitter of the capped exponential base, and is never negative."""
    policy = perdure.Retry(initial=initial, backoff=backoff, max_delay=max_delay, jitter=jitter)
    base = min(initial * backoff ** (attempt - 1), max_delay)
    delay = policy.delay(attempt, random.Random(seed))
    tolerance = 1e-9 * max(1.0, base)
    assert delay >= 0
    assert base * (1 - jitter) - tolerance <= delay <= base * (1 + jitter) + tolerance


@given(
    initial=st.floats(min_value=0.001, max_value=100),
    backoff=st.floats(min_value=1, max_value=5),
    attempt=st.integers(min_value=1, max_value=20),
)
def test_delay_never_shrinks_without_jitter(initial: float, backoff: float, attempt: int) -> None:
    """Without jitter the next delay is never shorter than the previous one."""
    policy = perdure.Retry(initial=initial, backoff=backoff, max_delay=1e6, jitter=0)
    assert policy.delay(attempt + 1) >= policy.delay(attempt)


def test_a_delay_asked_for_by_the_error_is_honoured() -> None:
    """An error with `retry_after` (a provider's 429) waits at least that long, never less."""

    class Limited(Exception):
        retry_after = 7.5

    policy = perdure.Retry(initial=1.0, jitter=0.0)
    assert policy.delay(1, error=Limited()) == 7.5
    assert policy.delay(4, error=Limited()) == 8.0  # the backoff is longer: it wins
    assert policy.delay(1, error=ValueError()) == 1.0
