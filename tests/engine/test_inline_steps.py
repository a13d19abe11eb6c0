"""A `def` step of an async workflow runs on the event loop once it has shown itself short,
and goes back to the step pool for good when it is slow or raises there."""

from __future__ import annotations

import threading
import time

import pytest
from step_loops import loop_workflow

import perdure
from perdure.engine import inline
from perdure.testing import TestWorker


@pytest.fixture(autouse=True)
def every_pool_run_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Learning does not depend on how loaded the machine is."""
    monkeypatch.setattr(inline, "SHORT", 10.0)


def on_pool(names: list[str]) -> list[bool]:
    return [name.startswith("perdure-step") for name in names]


def test_a_short_step_runs_inline_after_learning(app: perdure.App, worker: TestWorker) -> None:
    """The first LEARN calls run on the pool, the later ones on the loop, with the same
    results and one outcome per call in the journal."""
    seen: list[str] = []

    @app.step(effect="keyed")
    def bump(i: int) -> int:
        seen.append(threading.current_thread().name)
        return i + 1

    @app.workflow
    async def wf(n: int) -> list[int]:
        return [await bump(i) for i in range(n)]

    handle = app.start(wf, inline.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [i + 1 for i in range(inline.LEARN + 3)]
    assert on_pool(seen) == [True] * inline.LEARN + [False] * 3
    outcomes = [e for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert len(outcomes) == inline.LEARN + 3


def test_a_slow_inline_run_sends_the_step_back_to_the_pool(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One inline run longer than SLOW and the step runs on the pool from then on."""
    monkeypatch.setattr(inline, "SLOW", 0.01)
    seen: list[str] = []

    @app.step(effect="keyed")
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        if i == inline.LEARN:
            time.sleep(0.05)  # the first inline run: slow
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, inline.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == inline.LEARN + 3
    assert on_pool(seen) == [True] * inline.LEARN + [False] + [True] * 2


def test_an_inline_run_that_raises_sends_the_step_back_to_the_pool(
    app: perdure.App, worker: TestWorker
) -> None:
    """A body that fails on the loop is retried on the pool (it may need a thread)."""
    seen: list[str] = []

    @app.step(effect="keyed", retry=perdure.Retry(max_attempts=2, initial=0.0, jitter=0.0))
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        if i == inline.LEARN and not on_pool(seen[-1:])[0]:
            raise RuntimeError("needs a thread of its own")
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, inline.LEARN + 2)
    worker.run_until_idle()
    assert handle.result(timeout=5) == inline.LEARN + 2
    assert on_pool(seen) == [True] * inline.LEARN + [False, True, True]


def test_a_step_with_a_timeout_never_runs_inline(app: perdure.App, worker: TestWorker) -> None:
    """Only a thread can be given up on: a step with a timeout stays on the pool."""
    seen: list[str] = []

    @app.step(effect="keyed", timeout=5.0)
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, inline.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == inline.LEARN + 3
    assert all(on_pool(seen))
