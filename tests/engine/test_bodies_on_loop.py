"""A `def` step of an async workflow runs on the event loop once it has shown itself short,
and goes back to the step pool for good when it is slow or raises there."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from step_loops import loop_workflow

import perdure
import perdure.testing
from perdure.engine import pace
from perdure.testing import TestWorker


@pytest.fixture(autouse=True)
def every_run_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Learning, and staying on the loop, do not depend on how loaded the machine is (a test
    of a slow run sets its own SLOW)."""
    monkeypatch.setattr(pace, "SHORT", 10.0)
    monkeypatch.setattr(pace, "SLOW", 1.0)


def on_pool(names: list[str]) -> list[bool]:
    return [name.startswith("perdure-step") for name in names]


def test_a_short_step_runs_on_the_loop_after_learning(app: perdure.App, worker: TestWorker) -> None:
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

    handle = app.start(wf, pace.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [i + 1 for i in range(pace.LEARN + 3)]
    assert on_pool(seen) == [True] * pace.LEARN + [False] * 3
    outcomes = [e for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert len(outcomes) == pace.LEARN + 3


def test_a_slow_run_on_the_loop_sends_the_step_back_to_the_pool(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run on the loop longer than SLOW and the step runs on the pool from then on."""
    monkeypatch.setattr(pace, "SLOW", 0.01)
    seen: list[str] = []

    @app.step(effect="keyed")
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        if i == pace.LEARN:
            time.sleep(0.05)  # the first run on the loop: slow
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, pace.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == pace.LEARN + 3
    assert on_pool(seen) == [True] * pace.LEARN + [False] + [True] * 2


def test_a_run_on_the_loop_that_raises_sends_the_step_back_to_the_pool(
    app: perdure.App, worker: TestWorker
) -> None:
    """A body that fails on the loop is retried on the pool (it may need a thread)."""
    seen: list[str] = []

    @app.step(effect="keyed", retry=perdure.Retry(max_attempts=2, initial=0.0, jitter=0.0))
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        if i == pace.LEARN and not on_pool(seen[-1:])[0]:
            raise RuntimeError("needs a thread of its own")
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, pace.LEARN + 2)
    worker.run_until_idle()
    assert handle.result(timeout=5) == pace.LEARN + 2
    assert on_pool(seen) == [True] * pace.LEARN + [False, True, True]


def test_a_step_with_a_timeout_never_runs_on_the_loop(app: perdure.App, worker: TestWorker) -> None:
    """Only a thread can be given up on: a step with a timeout stays on the pool."""
    seen: list[str] = []

    @app.step(effect="keyed", timeout=5.0)
    def work(i: int) -> int:
        seen.append(threading.current_thread().name)
        return i

    wf = loop_workflow(app, work)

    handle = app.start(wf, pace.LEARN + 3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == pace.LEARN + 3
    assert all(on_pool(seen))


def _journal_shape(app: perdure.App, run_id: str) -> list[tuple[Any, ...]]:
    """The journal without what differs from run to run (times, the body's ms, workers),
    by position: gathered steps may interleave in either order, each position's own
    entries keep theirs."""
    shape = []
    for e in app.journal(run_id):
        data = json.loads(e.data) if e.data else None
        if isinstance(data, dict):
            data.pop("ms", None)
            if isinstance(data.get("error"), dict):
                data["error"] = {k: data["error"][k] for k in ("type", "message")}
            data.pop("retry_at", None)
        shape.append((e.kind, e.name, e.position, e.attempt, e.final, data))
    return sorted(shape, key=lambda entry: -1 if entry[2] is None else entry[2])


def _mixed(app: perdure.App) -> Any:
    """A workflow that meets every way a short `def` step of an async workflow can go."""
    flaky_calls: list[int] = []

    @app.step(effect="keyed", retry=perdure.Retry(max_attempts=3, initial=0.0, jitter=0.0))
    def flaky(i: int) -> int:
        flaky_calls.append(i)
        if flaky_calls.count(i) < 2:
            raise ConnectionError(f"try {i} again")
        return i * 10

    charged: list[int] = []

    @app.step(
        effect="once", name="charge", retry=perdure.Retry(max_attempts=2, initial=0.0, jitter=0.0)
    )
    def charge(i: int) -> int:
        charged.append(i)
        if charged.count(i) < 2:
            raise ConnectionError(f"card {i} declined, try again")
        return i + 100

    @app.step(effect="idempotent", retry=perdure.Retry(max_attempts=1))
    def broken(i: int) -> int:
        raise ValueError(f"bad {i}")

    @app.step(effect="read")
    def look(i: int) -> dict[str, int]:
        return {"i": i}

    @app.step(effect="keyed")
    def not_an_int(i: int) -> int:
        return {"not": "an int"}  # type: ignore[return-value]

    @app.step(effect="keyed")
    def shape(i: int) -> list[int]:
        return [i, i]

    @app.workflow(name="mixed")
    async def mixed(n: int) -> list[Any]:
        out: list[Any] = []
        for i in range(n):
            out.append(await flaky(i))
            out.append(await look(i))
            try:
                await broken(i)
            except perdure.StepError as exc:
                out.append(exc.error_type)
            out.append(await shape(i))
            out.append(await charge(i))
        out.append(list(await asyncio.gather(look(n), shape(n))))
        await perdure.sleep(3600)  # parked: the rest is a replay from the top
        try:
            await not_an_int(n)
        except perdure.PerdureError as exc:
            out.append(type(exc).__name__)
        return out

    return mixed


def test_bodies_on_the_loop_journal_what_pooled_bodies_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every body on the loop from its first call (LEARN 0) and with none
    ever there (every body on the step pool), the same workflow returns the same
    result and leaves the same journal: retries, a failure caught by the workflow, reads,
    gathered steps, a replay from the top in another process after a sleep, and a return
    value that does not fit its hint."""
    results: dict[int, Any] = {}
    journals: dict[int, Any] = {}
    for learn in (0, 10_000):
        monkeypatch.setattr(pace, "LEARN", learn)
        url, clock = f"sqlite:///{tmp_path}/learn-{learn}.db", perdure.testing.TestClock(1e9)
        first = perdure.App(url, clock=clock)
        handle = first.start(_mixed(first), 3, run_id="mixed")
        TestWorker(first).run_until_idle()
        assert handle.status() == "sleeping"
        first.close()
        again = perdure.App(url, clock=clock)  # a new process: nothing kept in memory
        _mixed(again)
        clock.advance(7200.0)
        TestWorker(again).run_until_idle()
        results[learn] = again.get_run("mixed").status, again.handle("mixed").result(timeout=5)
        journals[learn] = _journal_shape(again, "mixed")
        again.close()
    assert results[0] == results[10_000]
    assert journals[0] == journals[10_000]
    status, value = results[0]
    assert status == "completed"
    assert value[:5] == [0, {"i": 0}, "ValueError", [0, 0], 100] and value[-1] == "PayloadError"
    once = [e[0] for e in journals[0] if e[1] == "charge" and e[2] == 4]
    assert once == ["step.intent", "step.attempt_failed", "step.intent", "step.outcome"]


def test_a_once_step_waits_its_turn_when_the_store_thread_is_busy(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `once` intent is committed on the loop's thread only while the store thread is
    idle. Busy with another call, the intent is queued behind it instead: the body still
    runs once, after its intent is on disk, and the journal holds one intent and one
    outcome, as when the store can commit it at once."""
    monkeypatch.setattr(pace, "LEARN", 0)
    gate = threading.Event()
    ran: list[tuple[int, bool]] = []

    @app.step(effect="keyed")
    def occupy() -> None:  # holds the store thread until the gate opens
        app.runtime.store.submit(lambda db: gate.wait(10), write=False)  # type: ignore[attr-defined]
        threading.Timer(0.2, gate.set).start()

    @app.step(effect="once", name="charge")
    def charge(i: int) -> int:
        ran.append((i, gate.is_set()))
        return i * 2

    @app.workflow(name="busy")
    async def busy() -> int:
        await occupy()
        return await charge(1) + await charge(2)

    handle = app.start(busy, run_id="busy")
    worker.run_until_idle()
    assert handle.result(timeout=10) == 6
    assert ran == [(1, True), (2, True)]  # the first intent waited for the store thread
    kinds = [(e.kind, e.position) for e in app.journal("busy") if e.name == "charge"]
    assert kinds == [("step.intent", 1), ("step.outcome", 1), ("step.intent", 2),
                     ("step.outcome", 2)]  # fmt: skip
