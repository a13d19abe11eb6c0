"""A run parked for a person the way a real crash parks it, driven by the test's clock."""

from __future__ import annotations

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def crash_and_recover(app: perdure.App, clock: TestClock, step: str) -> None:
    """A worker dies between the intent and the outcome of `step` (its body never ran); once
    its lease has run out, the next worker's recovery finds the step in doubt (a `once` step
    without a probe parks its run: needs_attention)."""
    dying = TestWorker(app)
    dying.crash_after_intent(step)
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    clock.advance(dying.lease + 1)
    TestWorker(app).run_until_idle()
