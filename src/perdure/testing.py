"""Tools for testing your own workflows: a driven clock, an in-process worker, crash injection.

    clock = TestClock()
    app = perdure.App("sqlite:///:memory:", clock=clock)
    worker = TestWorker(app)
    handle = app.start(checkout, "o1")
    worker.run_until_idle()           # runs until the workflow sleeps
    clock.advance(timedelta(days=1))
    worker.run_until_idle()           # the timer fired; the run went on

Crash injection stops the worker between the intent and the outcome of a step,
exactly where a real crash is dangerous; a new `TestWorker` then recovers the
run once the lease has expired (`clock.advance(worker.lease + 1)`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .app import App
from .engine.context import SimulatedCrash
from .engine.retry import seconds
from .engine.worker import Worker, WorkerOptions
from .triggers.schedules import scheduler_of

__all__ = ["SimulatedCrash", "TestClock", "TestWorker"]


class TestClock:
    """A clock that moves only when told to; starts at 2026-01-01T00:00:00Z unless given."""

    __test__ = False  # not a pytest test class

    def __init__(self, start: datetime | float | None = None) -> None:
        if start is None:
            start = datetime(2026, 1, 1, tzinfo=UTC)
        self._now = start.timestamp() if isinstance(start, datetime) else float(start)

    def now(self) -> float:
        return self._now

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self._now, UTC)

    def advance(self, by: float | timedelta) -> None:
        """Move time forward by `by` seconds (or a timedelta)."""
        self._now += seconds(by) or 0.0

    def set(self, when: datetime) -> None:
        self._now = when.timestamp()


class TestWorker:
    """An in-process worker that the test drives: each call runs until nothing is runnable."""

    __test__ = False

    def __init__(
        self,
        app: App,
        *,
        lease: float = 30.0,
        concurrency: int = 8,
        max_recoveries: int | None = 5,
        gc: bool = False,
    ) -> None:
        """`max_recoveries` as in `WorkerOptions`; `gc=True` applies retention after each
        `run_until_idle` (a real worker does it in the background; a TestWorker only if asked)."""
        self.app = app
        self.lease = lease
        self.concurrency = concurrency
        self.max_recoveries = max_recoveries
        self.gc = gc
        self.crash_points: frozenset[str] = frozenset()
        self.worker: Worker | None = None

    def crash_after_intent(self, step: str) -> None:
        """Make the next `run_until_idle` die right after journaling the intent of `step`."""
        self.crash_points = self.crash_points | {step}

    async def run_until_idle_async(self) -> int:
        options = WorkerOptions(
            concurrency=self.concurrency,
            lease=self.lease,
            max_recoveries=self.max_recoveries,
            gc_every=None,
        )
        worker = Worker(self.app.runtime, options)
        worker.crash_after_intent = self.crash_points
        self.crash_points = frozenset()  # "the next run_until_idle": used up by this one
        self.worker = worker
        await self.app.runtime.open_store()
        await scheduler_of(self.app.runtime).run_pass(
            self.app.clock.now()
        )  # ticks due at the test's time
        try:
            claimed = await worker.run_until_idle()
        finally:
            worker.executor.shutdown(wait=False)
        if self.gc:
            await self.app.client.gc()
        return claimed

    def run_until_idle(self) -> int:
        """Run every runnable run until each finishes or parks; returns how many were claimed.

        Raises `SimulatedCrash` if a crash point was hit (the worker is then dead: its
        leases stay held until they expire, as after a real kill -9).
        """
        return self.app.runtime.sync(self.run_until_idle_async(), "TestWorker.run_until_idle()")
