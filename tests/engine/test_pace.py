"""A `def` step body's pace (engine/pace.py): learned short on the pool, it runs on the event
loop; a slow run there sends it back to learn again, and only STRIKES slow runs, one
blocking run or one that raises keep it on the pool for good."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import perdure
from perdure.engine import pace
from perdure.engine.pace import Pace
from perdure.testing import TestWorker


def learned() -> Pace:
    """A pace that ran LEARN short runs on the pool: on the loop now."""
    found = Pace()
    for _ in range(pace.LEARN):
        found.timed(lambda: None)
    assert found.on_loop and not found.pooled
    return found


@pytest.fixture(autouse=True)
def every_pool_run_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool run counts as short however loaded the machine is (the rule is under test,
    not the machine's speed)."""
    monkeypatch.setattr(pace, "SHORT", 10.0)


def test_a_slow_run_on_the_loop_sends_the_body_back_to_learn_again() -> None:
    found = learned()
    found.slow(pace.SLOW * 2)
    assert not found.on_loop and not found.pooled and found.short_runs == 0
    for _ in range(pace.LEARN - 1):
        found.timed(lambda: None)
    assert not found.on_loop  # it learns again from the start
    found.timed(lambda: None)
    assert found.on_loop


def test_strikes_a_blocking_run_or_a_raise_keep_it_on_the_pool_for_good() -> None:
    struck = learned()
    for strike in range(pace.STRIKES):
        struck.slow(pace.SLOW * 2)
        assert struck.pooled == (strike == pace.STRIKES - 1)
        for _ in range(pace.LEARN):
            struck.timed(lambda: None)
    assert struck.pooled and not struck.on_loop
    blocked = learned()
    blocked.slow(pace.BLOCKED * 2)
    raised = learned()
    raised.to_pool()
    for found in (blocked, raised):
        for _ in range(pace.LEARN * 3):
            found.timed(lambda: None)
        assert found.pooled and not found.on_loop


@given(st.lists(st.sampled_from(["short", "long", "slow", "blocked", "raised"]), max_size=60))
def test_on_the_loop_only_after_learn_short_runs_and_never_once_pooled(events: list[str]) -> None:
    """Whatever happens, the body is on the loop only right after LEARN short pool runs in a
    row, never after it was pooled, and it is pooled once it struck out, blocked or raised."""
    found, streak, slow, ended = Pace(), 0, 0, False
    for event in events:
        if event in ("short", "long"):
            if event == "short":
                found.timed(lambda: None)
                streak += 1
            else:
                found.short_runs, streak = 0, 0  # what a long pool run does, without waiting
        elif found.on_loop:  # slow, blocked and raised happen to runs on the loop
            if event == "raised":
                found.to_pool()
                ended = True
            else:
                found.slow(pace.SLOW * 2 if event == "slow" else pace.BLOCKED * 2)
                slow += 1
                ended = ended or event == "blocked" or slow >= pace.STRIKES
            streak = 0
        assert found.pooled == ended
        assert found.on_loop == (streak >= pace.LEARN and not ended)


def test_a_preempted_body_returns_to_the_loop_in_a_worker(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the step route: a `def` body of an async workflow learned short runs on the
    loop; one run of it slowed past SLOW (as a preemption would) sends it to the pool, and
    it runs on the loop again after LEARN short runs."""
    monkeypatch.setattr(pace, "SLOW", 0.5)  # no run here is that slow but the one slowed
    monkeypatch.setattr(pace, "BLOCKED", 5.0)
    slowed = {5 + pace.LEARN}  # a call made on the loop
    places: list[bool] = []

    @app.step(name="pace.add", effect="keyed")
    def add(i: int) -> int:
        places.append(app.runtime.steps["pace.add"].pace.on_loop)
        if i in slowed:
            time.sleep(0.6)
        return i + 1

    @app.workflow(name="pace.many")
    async def many(n: int) -> int:
        total = 0
        for i in range(n):
            total += await add(i)
        return total

    calls = 5 + 3 * pace.LEARN
    handle = app.start(many, calls)
    worker.run_until_idle()
    assert handle.result(timeout=5) == sum(range(1, calls + 1))
    step = app.runtime.steps["pace.add"]
    slow_at = 5 + pace.LEARN
    assert places[slow_at] and not places[slow_at + 1]  # on the loop, then back to the pool
    assert places[-1] and step.pace.on_loop and not step.pace.pooled  # learned again
    assert step.pace.slow_runs == 1
