"""Dead-lettering: a run whose recoveries keep crashing becomes `dead` instead of looping."""

from __future__ import annotations

import json
from typing import Any

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker

LEASE = 30.0


def poisoned(app: perdure.App) -> tuple[perdure.Workflow[[], str], list[int]]:
    """A workflow whose idempotent step crashes every worker that has it as a crash point."""
    calls: list[int] = []

    @app.step(name="poison", effect="idempotent")
    def poison() -> int:
        calls.append(1)
        return len(calls)

    @app.workflow(name="job")
    def job() -> str:
        return f"ran {poison()}"

    return job, calls


def crash(app: perdure.App, clock: TestClock, step: str = "poison", **kw: Any) -> TestWorker:
    """A worker that dies right after `step`'s intent; the clock then passes its lease."""
    dying = TestWorker(app, lease=LEASE, **kw)
    dying.crash_after_intent(step)
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    clock.advance(LEASE + 1)
    return dying


def worker_id(worker: TestWorker) -> str:
    assert worker.worker is not None
    return worker.worker.id


def dead_entry(app: perdure.App, run_id: str) -> dict[str, Any]:
    (entry,) = [e for e in app.journal(run_id) if e.kind == "run.dead"]
    return json.loads(entry.data or "{}")  # type: ignore[no-any-return]


def test_a_poison_run_becomes_dead_with_the_evidence(app: perdure.App, clock: TestClock) -> None:
    """After the first run and max_recoveries recoveries all crash, the next claim buries it."""
    job, calls = poisoned(app)
    handle = app.start(job)
    dying = [crash(app, clock, max_recoveries=2) for _ in range(3)]  # first run + 2 recoveries
    burier = TestWorker(app, lease=LEASE, max_recoveries=2)
    assert burier.run_until_idle() == 1
    run = app.get_run(handle.id)
    assert run.status == "dead"
    assert run.recoveries == 3 and run.lease_owner is None
    evidence = dead_entry(app, handle.id)
    assert evidence["recoveries"] == 2 and evidence["max_recoveries"] == 2
    assert evidence["workers"] == [worker_id(w) for w in dying]
    assert evidence["last"] == {"position": 0, "kind": "step.intent", "name": "poison"}
    assert calls == []  # the burying worker did not replay it again
    assert "perdure resume" in (run.error or "")


def test_recoveries_below_the_limit_are_replayed(app: perdure.App, clock: TestClock) -> None:
    """A run with fewer crashed recoveries than the limit is recovered and completes."""
    job, calls = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=2)
    crash(app, clock, max_recoveries=2)
    TestWorker(app, lease=LEASE, max_recoveries=2).run_until_idle()
    assert handle.result(timeout=5) == "ran 1"
    assert calls == [1]


def test_result_of_a_dead_run_raises_run_failed(app: perdure.App, clock: TestClock) -> None:
    """Waiting on a dead run ends: result() raises RunFailed with status dead."""
    job, _ = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=0)
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert info.value.status == "dead"
    assert "crashed their workers" in str(info.value)


def test_dead_runs_are_listed_by_status(app: perdure.App, clock: TestClock) -> None:
    """list_runs(statuses=['dead']) finds dead runs and only them."""
    job, _ = poisoned(app)
    handle = app.start(job)
    app.start(job, run_id="never-claimed")
    crash(app, clock, max_recoveries=0, concurrency=1)
    TestWorker(app, lease=LEASE, max_recoveries=0, concurrency=1).run_until_idle()
    dead = [r.id for r in app.list_runs(statuses=["dead"])]
    assert handle.id in dead and "never-claimed" not in dead


def test_resume_replays_a_dead_run_from_its_journal(app: perdure.App, clock: TestClock) -> None:
    """`resume` makes a dead run pending; it replays and completes once the cause is gone."""
    job, calls = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=0)
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert app.resume(handle.id) == "pending"
    run = app.get_run(handle.id)
    assert run.error is None
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert handle.result(timeout=5) == "ran 1"
    assert calls == [1]
    kinds = [e.kind for e in app.journal(handle.id)]
    assert kinds.index("run.dead") < kinds.index("run.resumed") < kinds.index("run.completed")


def test_a_resumed_dead_run_gets_a_fresh_count(app: perdure.App, clock: TestClock) -> None:
    """After resume, crashes before it no longer count: one new crash is one recovery, not more."""
    job, _ = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=1)
    crash(app, clock, max_recoveries=1)
    TestWorker(app, lease=LEASE, max_recoveries=1).run_until_idle()
    assert handle.status() == "dead"
    app.resume(handle.id)
    crash(app, clock, max_recoveries=1)
    TestWorker(app, lease=LEASE, max_recoveries=1).run_until_idle()
    assert handle.result(timeout=5) == "ran 1"


def test_cancel_ends_a_dead_run(app: perdure.App, clock: TestClock) -> None:
    """An operator may give up on a dead run: cancel makes it cancelled."""
    job, _ = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=0)
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert app.cancel(handle.id) == "cancelled"
    assert app.journal(handle.id)[-1].kind == "run.cancelled"


def test_progress_between_crashes_resets_the_count(app: perdure.App, clock: TestClock) -> None:
    """Recoveries that each move the run forward before crashing never make it dead."""
    done: list[str] = []

    def make(label: str) -> Any:
        @app.step(name=label, effect="idempotent")
        def step() -> str:
            done.append(label)
            return label

        return step

    a, b, c = make("a"), make("b"), make("c")

    @app.workflow(name="steps")
    def steps() -> str:
        return a() + b() + c()

    handle = app.start(steps)
    for label in ("a", "b", "c"):  # each recovery completes one more step, then dies
        crash(app, clock, label, max_recoveries=1)
    TestWorker(app, lease=LEASE, max_recoveries=1).run_until_idle()
    assert handle.result(timeout=5) == "abc"
    assert done == ["a", "b", "c"]


def test_released_leases_are_not_crashes(app: perdure.App, clock: TestClock) -> None:
    """Leases handed back by stopping workers do not count towards dead-lettering."""
    job, _ = poisoned(app)
    handle = app.start(job)
    for owner in ("stopping-1", "stopping-2", "stopping-3"):
        app.runtime.sync(app.runtime.store.claim(owner, clock.now(), LEASE, 10, ["job"]), "test")
        app.runtime.sync(app.runtime.store.release(owner, [handle.id]), "test")
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert handle.result(timeout=5) == "ran 1"
    recovered = [json.loads(e.data or "{}") for e in app.journal(handle.id)]
    assert [d.get("released") for d in recovered if "to" in d] == [True, True, True]


def test_expired_leases_count_as_crashes(app: perdure.App, clock: TestClock) -> None:
    """Leases that simply expired (the holder died before any step) do count."""
    job, calls = poisoned(app)
    handle = app.start(job)
    for owner in ("gone-1", "gone-2"):
        app.runtime.sync(app.runtime.store.claim(owner, clock.now(), LEASE, 10, ["job"]), "test")
        clock.advance(LEASE + 1)
    TestWorker(app, lease=LEASE, max_recoveries=1).run_until_idle()
    assert handle.status() == "dead"
    assert dead_entry(app, handle.id)["workers"] == ["gone-1", "gone-2"]
    assert calls == []


def test_no_limit_never_buries(app: perdure.App, clock: TestClock) -> None:
    """max_recoveries=None keeps recovering however often recoveries crash."""
    job, _ = poisoned(app)
    handle = app.start(job)
    for _ in range(4):
        crash(app, clock, max_recoveries=None)
    TestWorker(app, lease=LEASE, max_recoveries=None).run_until_idle()
    assert handle.result(timeout=5) == "ran 1"


def test_a_dead_child_ends_its_parents_wait(app: perdure.App, clock: TestClock) -> None:
    """A parent waiting on a child that becomes dead wakes and sees RunFailed with status dead."""
    job, _ = poisoned(app)

    @app.workflow(name="parent")
    def parent() -> str:
        try:
            return str(job())
        except perdure.RunFailed as exc:
            return f"child {exc.status}"

    handle = app.start(parent, run_id="p")
    crash(app, clock, max_recoveries=0)
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert app.get_run("p.0").status == "dead"
    assert handle.result(timeout=5) == "child dead"


def test_replay_check_includes_dead_runs(app: perdure.App, clock: TestClock) -> None:
    """replay-check replays dead runs too, since resume would replay them."""
    from perdure.engine.inspection import replay_check

    job, _ = poisoned(app)
    handle = app.start(job)
    crash(app, clock, max_recoveries=0)
    TestWorker(app, lease=LEASE, max_recoveries=0).run_until_idle()
    assert handle.status() == "dead"
    report = app.runtime.sync(replay_check(app.runtime), "test")
    assert report.checked == 1 and report.divergences == []
