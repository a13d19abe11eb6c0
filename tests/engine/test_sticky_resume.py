"""A parked async run is kept suspended in the worker process that parked it: its next wake-up
goes on from the wait, reading only the journal's new tail, unless anything but its own
execution touched the run in between (then it replays from the journal as before)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import perdure
from perdure.engine import sticky
from perdure.store.base import Entry, NewRun
from perdure.testing import TestClock, TestWorker

ENTRIES = 5_000  # seeded journal entries: 2,500 keyed steps (an intent and an outcome each)


def counting_journal(app: perdure.App) -> list[int]:
    """Count the journal rows the store hands out (the real store, only counted)."""
    real = app.runtime.store.journal
    rows: list[int] = []

    async def journal(*args: Any, **kwargs: Any) -> list[Entry]:
        found = await real(*args, **kwargs)
        rows.append(len(found))
        return found

    app.runtime.store.journal = journal  # type: ignore[method-assign]
    return rows


def long_app(app: perdure.App, ran: list[int]) -> Any:
    @app.step(name="work", effect="keyed")
    def work(i: int) -> int:
        return i

    @app.workflow(name="history")
    async def history(steps: int) -> int:
        total = 0
        for i in range(steps):
            ran.append(i)  # workflow code between steps: runs again on every replay
            total += await work(i)
        payload = await perdure.wait_event("go")
        return total + payload + await work(-1)

    return history


def seed(app: perdure.App, run_id: str, steps: int) -> None:
    """The journal the run's `steps` keyed steps would have written, as one new run."""
    from perdure.engine.client import encode_input

    now = app.clock.now()
    entries = []
    for pos in range(steps):
        entries.append(Entry(kind="step.intent", name="work", position=pos, attempt=1, at=now,
                             data=f'{{"effect":"keyed","key":"{run_id}:{pos}"}}'))  # fmt: skip
        entries.append(Entry(kind="step.outcome", name="work", position=pos, attempt=1,
                             final=True, at=now, data=f'{{"value":{pos},"ms":0.0}}'))  # fmt: skip
    version = app.runtime.workflows["history"].version
    new = NewRun(id=run_id, workflow="history", input=encode_input("history", [steps], {}),
                 code_version=version, now=now, entries=entries)  # fmt: skip
    app.runtime.sync(app.runtime.store.create_run(new), "seed")


def test_waking_a_long_run_reads_only_the_new_tail_and_replays_nothing(
    app: perdure.App, worker: TestWorker
) -> None:
    """After 5,000 entries, the wake-up reads at most a few journal rows and runs none of the
    workflow code before the wait again: the work is bounded, whatever the journal's size."""
    ran: list[int] = []
    long_app(app, ran)
    seed(app, "h", ENTRIES // 2)
    rows = counting_journal(app)
    worker.run_until_idle()
    assert app.get_run("h").status == "waiting"
    assert rows == [ENTRIES] and len(ran) == ENTRIES // 2  # the first execution replays all
    cache = sticky.cache_of(app.runtime)
    assert "h" in cache.kept
    rows.clear()
    ran.clear()
    app.send_event("h", "go", 7)
    worker.run_until_idle()
    steps = ENTRIES // 2
    assert app.handle("h").result(timeout=5) == steps * (steps - 1) // 2 + 7 - 1
    assert ran == []  # nothing before the wait ran again
    assert sum(rows) <= 2, rows  # only the tail written since it parked
    assert cache.resumed == 1 and "h" not in cache.kept


def test_a_resumed_run_ends_exactly_as_a_replayed_one(app: perdure.App, worker: TestWorker) -> None:
    """The same long run woken from memory and woken by replay: same result, same journal."""
    ran: list[int] = []
    long_app(app, ran)
    seed(app, "warm", 500)
    seed(app, "cold", 500)
    worker.run_until_idle()
    cache = sticky.cache_of(app.runtime)
    cache.drop("cold")  # this one replays from the top
    for run_id in ("warm", "cold"):
        app.send_event(run_id, "go", 3)
    worker.run_until_idle()
    assert cache.resumed == 1
    assert app.handle("warm").result(timeout=5) == app.handle("cold").result(timeout=5)

    def shape(run_id: str) -> list[tuple[Any, ...]]:
        out = []
        for e in app.journal(run_id):
            data = re.sub(r'"(event_id|ms)":[0-9.]+', "", (e.data or "").replace(run_id, "R"))
            out.append((e.kind, e.name, e.position, e.attempt, e.final, data))
        return out

    assert shape("warm") == shape("cold")


def test_a_run_another_worker_touched_meanwhile_replays_from_the_journal(
    app: perdure.App, worker: TestWorker, clock: TestClock, db_url: str
) -> None:
    """A kept run claimed by another process in between is not resumed from memory (its
    lease epoch moved on twice): it replays, and the journal's outcome is the one used."""
    ran: list[int] = []
    long_app(app, ran)
    seed(app, "h", 10)
    worker.run_until_idle()
    other = perdure.App(db_url, clock=clock)
    try:
        long_app(other, [])
        intruder = TestWorker(other)
        other.send_event("h", "go", 1)
        intruder.crash_after_intent("work")  # it journals the last step's intent, then dies
        with pytest.raises(BaseException, match="crash injected"):
            intruder.run_until_idle()
    finally:
        other.close()
    ran.clear()
    clock.advance(worker.lease + 1)
    worker.run_until_idle()
    assert app.handle("h").result(timeout=5) == 45 + 1 - 1
    cache = sticky.cache_of(app.runtime)
    assert cache.missed == 1 and cache.resumed == 0
    assert len(ran) == 10  # replayed from the top


def test_a_paused_and_resumed_kept_run_goes_on_from_memory(
    app: perdure.App, worker: TestWorker
) -> None:
    """An operator's pause and resume while it waits do not force a replay."""
    ran: list[int] = []
    long_app(app, ran)
    seed(app, "h", 10)
    worker.run_until_idle()
    handle = app.handle("h")
    app.pause("h")
    assert handle.status() == "paused"
    app.resume("h")
    app.send_event("h", "go", 0)
    ran.clear()
    worker.run_until_idle()
    assert handle.result(timeout=5) == 45 - 1
    assert ran == [] and sticky.cache_of(app.runtime).resumed == 1


def test_a_kept_run_holds_no_task_and_no_thread(app: perdure.App, worker: TestWorker) -> None:
    """While parked in memory the run has no asyncio task, no lease and no thread."""
    long_app(app, [])
    seed(app, "h", 10)
    worker.run_until_idle()
    kept = sticky.cache_of(app.runtime).kept["h"]
    assert kept.ctx.task is None
    tasks = app.runtime.sync(_tasks(), "tasks")
    assert not [t for t in tasks if t.startswith("perdure-run-")]
    run = app.get_run("h")
    assert run.status == "waiting" and run.lease_owner is None
    assert kept.ctx.by_position.keys() == {10}  # only the position it waits at


async def _tasks() -> list[str]:
    return [task.get_name() for task in asyncio.all_tasks()]


def test_the_cache_is_bounded_and_an_evicted_run_still_ends_right(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its bound the least recently parked run is dropped; it then replays."""
    monkeypatch.setattr(sticky, "MAX_RUNS", 2)
    long_app(app, [])
    for run_id in ("a", "b", "c"):
        seed(app, run_id, 10)
        worker.run_until_idle()
    cache = sticky.cache_of(app.runtime)
    assert list(cache.kept) == ["b", "c"]
    for run_id in ("a", "b", "c"):
        app.send_event(run_id, "go", 0)
    worker.run_until_idle()
    assert [app.handle(r).result(timeout=5) for r in "abc"] == [44, 44, 44]
    assert cache.resumed == 2


def test_sync_workflows_are_not_kept(app: perdure.App, worker: TestWorker) -> None:
    """A `def` workflow would keep its thread: it parks by unwinding, as before."""

    @app.workflow()
    def waits() -> int:
        return int(perdure.wait_event("go"))

    handle = app.start(waits, run_id="s")
    worker.run_until_idle()
    assert handle.status() == "waiting" and not sticky.cache_of(app.runtime).kept
    handle.send_event("go", 5)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 5


def test_a_kept_run_woken_past_its_deadline_fails_and_is_closed(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """Woken after its deadline, a kept run fails as a replayed one would; its suspended
    code is closed then (its `finally` runs), not left for the garbage collector."""
    cleaned: list[str] = []

    @app.workflow()
    async def slow() -> None:
        try:
            await perdure.sleep(100)
        finally:
            cleaned.append("closed")

    handle = app.start(slow, run_id="d", deadline=50)
    worker.run_until_idle()
    assert "d" in sticky.cache_of(app.runtime).kept and cleaned == []
    clock.advance(60)
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="deadline"):
        handle.result(timeout=5)
    assert cleaned == ["closed"]


@pytest.mark.parametrize("seconds", [60.0, sticky.HORIZON * 10])
def test_only_a_run_that_wakes_soon_is_kept_in_memory(
    app: perdure.App, worker: TestWorker, clock: TestClock, seconds: float
) -> None:
    """A run parked on a timer within HORIZON is kept suspended; one sleeping longer (a day's
    sleep) is not, so sleeping runs cost a worker no memory, and both wake as they should."""

    @app.workflow(name="nap")
    async def nap() -> str:
        await perdure.sleep(seconds)
        return "rested"

    handle = app.start(nap, run_id="n")
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    assert ("n" in sticky.cache_of(app.runtime).kept) == (seconds <= sticky.HORIZON)
    clock.advance(seconds + 1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "rested"
