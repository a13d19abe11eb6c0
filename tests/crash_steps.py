"""Crashes staged in-process: a worker that dies (SimulatedCrash) after a step's intent,
and the recovery by a fresh worker once its lease lapsed."""

from __future__ import annotations

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def crash_after(app: perdure.App, step: str | None = None) -> TestWorker:
    """A worker that dies after recording `step`'s intent (None: the crash the test armed
    elsewhere); returned for its lease."""
    dead = TestWorker(app)
    if step is not None:
        dead.crash_after_intent(step)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    return dead


def recover(app: perdure.App, clock: TestClock, dead: TestWorker) -> TestWorker:
    """Let the dead worker's lease lapse; a fresh worker recovers and runs what is left."""
    clock.advance(dead.lease + 1)
    fresh = TestWorker(app)
    fresh.run_until_idle()
    return fresh


def crash_and_recover(app: perdure.App, clock: TestClock, step: str) -> None:
    """`crash_after(step)`, then `recover`."""
    recover(app, clock, crash_after(app, step))
