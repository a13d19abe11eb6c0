"""Retention and dead runs on every store: what gc deletes and keeps, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from tests_contract_support import PG_URL, drop_schema

import perdure
from perdure.store.base import Append, Blob, Entry, GcBatch, GcRule, NewRun, Store
from perdure.store.blobs import BLOB_KEY
from perdure.testing import SimulatedCrash, TestClock, TestWorker

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make(
    store: Store,
    run_id: str,
    status: str = "completed",
    at: float = 100.0,
    *,
    workflow: str = "wf",
    parent: str | None = None,
    blobs: list[Blob] | None = None,
) -> None:
    """A run with one step outcome and one event, then moved to `status` at time `at`."""
    run(
        store.create_run(
            NewRun(
                id=run_id,
                workflow=workflow,
                input="{}",
                code_version="v",
                now=at,
                parent_id=parent,
            )
        )
    )
    run(store.send_event(run_id, "ping", "1", at))
    outcome = Entry(kind="step.outcome", name="s", position=0, final=True, data="1", at=at)
    run(
        store.append(
            Append(
                run_id,
                None,
                [outcome],
                status=status,
                fields={"updated_at": at},
                blobs=blobs or [],
            )
        )
    )


def gc_all(store: Store, rule: GcRule, limit: int = 500) -> GcBatch:
    """Run gc batches until the cursor says done; the summed counts."""
    total, cursor, rounds = GcBatch(), None, 0
    while True:
        batch = run(store.gc(rule, cursor, limit))
        total.runs += batch.runs
        total.entries += batch.entries
        total.events += batch.events
        total.blobs += batch.blobs
        rounds += 1
        assert rounds < 100, "gc kept asking for another batch"
        if batch.cursor is None:
            return total
        cursor = batch.cursor


def ids(store: Store) -> set[str]:
    return {r.id for r in run(store.list_runs(limit=1000))}


def test_keep_last_keeps_the_newest_finished_runs(store: Store) -> None:
    """keep_last=2 deletes all but the two most recently finished runs, with journal and events."""
    for i in range(5):
        make(store, f"r{i}", at=100.0 + i)
    done = gc_all(store, GcRule("wf", keep_last=2))
    assert ids(store) == {"r3", "r4"}
    assert (done.runs, done.entries, done.events) == (3, 3, 3)
    assert run(store.journal("r0")) == []
    assert run(store.next_event("r0", "ping")) is None
    assert run(store.next_event("r4", "ping")) is not None


def test_keep_since_deletes_only_runs_finished_before_it(store: Store) -> None:
    """keep_since keeps every run finished at or after it and deletes the older ones."""
    for i in range(4):
        make(store, f"r{i}", at=100.0 + i * 10)
    gc_all(store, GcRule("wf", keep_since=120.0))
    assert ids(store) == {"r2", "r3"}


def test_a_run_is_kept_if_either_rule_keeps_it(store: Store) -> None:
    """With both rules, only runs older than keep_since and beyond keep_last are deleted."""
    for i in range(5):
        make(store, f"r{i}", at=100.0 + i * 10)
    gc_all(store, GcRule("wf", keep_since=135.0, keep_last=3))  # days keep r4; last keeps r2-r4
    assert ids(store) == {"r2", "r3", "r4"}
    gc_all(store, GcRule("wf", keep_since=125.0, keep_last=1))  # days keep r3, r4
    assert ids(store) == {"r3", "r4"}


def test_unfinished_runs_are_never_deleted(store: Store) -> None:
    """Pending, running, parked and needs_attention runs survive gc however old they are."""
    statuses = ["running", "sleeping", "waiting", "paused", "needs_attention", "cancelling"]
    for status in statuses:
        make(store, status, status=status, at=1.0)
    run(store.create_run(NewRun(id="pending", workflow="wf", input="{}", code_version="", now=1.0)))
    for status in ("completed", "failed", "cancelled", "dead"):
        make(store, status, status=status, at=1.0)
    done = gc_all(store, GcRule("wf", keep_last=0))
    assert ids(store) == {*statuses, "pending"}
    assert done.runs == 4


def test_gc_touches_only_the_rule_workflow(store: Store) -> None:
    """A rule for one workflow leaves every other workflow's runs alone."""
    make(store, "mine", at=1.0)
    make(store, "theirs", at=1.0, workflow="other")
    gc_all(store, GcRule("wf", keep_last=0))
    assert ids(store) == {"theirs"}


def test_a_finished_child_of_an_unfinished_parent_is_kept(store: Store) -> None:
    """A child whose parent still runs (or is dead, so may be resumed) is never deleted."""
    make(store, "p1", status="waiting", at=1.0, workflow="parent")
    make(store, "p1.0", at=1.0, parent="p1")
    make(store, "p2", status="dead", at=1.0, workflow="parent")
    make(store, "p2.0", at=1.0, parent="p2")
    gc_all(store, GcRule("wf", keep_last=0))
    assert {"p1.0", "p2.0"} <= ids(store)


def test_a_finished_parent_with_an_unfinished_child_is_kept(store: Store) -> None:
    """A parent goes only with its whole family, so an unfinished grandchild keeps it."""
    make(store, "p", at=1.0)
    make(store, "p.0", at=1.0, parent="p", workflow="child")
    make(store, "p.0.0", status="running", at=1.0, parent="p.0", workflow="child")
    gc_all(store, GcRule("wf", keep_last=0))
    assert ids(store) == {"p", "p.0", "p.0.0"}


def test_a_parent_goes_with_its_finished_children(store: Store) -> None:
    """Deleting a parent deletes its finished descendants too, whatever their workflow."""
    make(store, "p", at=1.0)
    make(store, "p.0", status="failed", at=1.0, parent="p", workflow="child")
    make(store, "p.0.0", status="dead", at=1.0, parent="p.0", workflow="child")
    make(store, "q", at=500.0)
    done = gc_all(store, GcRule("wf", keep_last=1))
    assert ids(store) == {"q"}
    assert done.runs == 3
    assert run(store.journal("p.0.0")) == []


def test_a_child_of_a_final_parent_goes_by_its_own_rule(store: Store) -> None:
    """A child whose parent can never run again is deleted by its own workflow's rule."""
    make(store, "p", at=1.0)
    make(store, "p.0", at=1.0, parent="p", workflow="child")
    gc_all(store, GcRule("child", keep_last=0))
    assert ids(store) == {"p"}


def test_a_reused_id_starts_with_an_empty_journal_and_no_events(store: Store) -> None:
    """After gc, creating a run with the same id gives a fresh run: no entries, no events."""
    make(store, "r1", at=1.0)
    gc_all(store, GcRule("wf", keep_last=0))
    fresh, created = run(
        store.create_run(NewRun(id="r1", workflow="wf", input="{}", code_version="", now=2.0))
    )
    assert created and fresh.status == "pending" and fresh.result is None
    assert run(store.journal("r1")) == []
    assert run(store.next_event("r1", "ping")) is None


def test_blobs_go_when_no_kept_row_names_them(store: Store) -> None:
    """A blob only deleted runs named is deleted; one a kept run still names stays."""
    shared, own = Blob("k-shared", "S" * 10), Blob("k-own", "O" * 10)

    def ref(key: str) -> str:
        return json.dumps({BLOB_KEY: key})

    make(store, "old", at=1.0, blobs=[shared, own])
    run(store.append(Append("old", None, [Entry(kind="note", data=ref("k-own"), at=1.0)])))
    run(store.append(Append("old", None, [Entry(kind="note", data=ref("k-shared"), at=1.0)])))
    make(store, "new", at=9.0, blobs=[shared])
    run(store.append(Append("new", None, [Entry(kind="note", data=ref("k-shared"), at=9.0)])))
    done = gc_all(store, GcRule("wf", keep_last=1))
    assert ids(store) == {"new"}
    assert done.blobs == 1
    assert run(store.get_blob("k-shared")) == "S" * 10
    with pytest.raises(Exception, match="missing"):
        run(store.get_blob("k-own"))


def test_blob_named_by_a_run_input_is_kept(store: Store) -> None:
    """A blob referenced only from a kept run's input is not deleted."""
    blob = Blob("k-in", "I" * 10)
    make(store, "old", at=1.0, blobs=[blob])
    run(
        store.append(Append("old", None, [Entry(kind="note", data=json.dumps({BLOB_KEY: "k-in"}))]))
    )
    new = NewRun(
        id="keeper",
        workflow="other",
        input=json.dumps({BLOB_KEY: "k-in"}),
        code_version="",
        now=1.0,
        blobs=[blob],
    )
    run(store.create_run(new))
    gc_all(store, GcRule("wf", keep_last=0))
    assert run(store.get_blob("k-in")) == "I" * 10


def test_batches_walk_every_candidate_once(store: Store) -> None:
    """Small batches delete everything eligible and step over runs that must stay."""
    for i in range(7):
        make(store, f"r{i}", at=100.0 + i)
    make(store, "r0.0", status="running", at=100.0, parent="r0", workflow="child")
    make(store, "r3.0", status="waiting", at=100.0, parent="r3", workflow="child")
    done = gc_all(store, GcRule("wf", keep_last=0), limit=2)
    assert ids(store) == {"r0", "r0.0", "r3", "r3.0"}
    assert done.runs == 5


def test_a_deleted_run_refuses_new_events(store: Store) -> None:
    """Once gc deleted a run, sending it an event names the missing run instead of storing it."""
    make(store, "r1", at=1.0)
    gc_all(store, GcRule("wf", keep_last=0))
    with pytest.raises(Exception, match="no run"):
        run(store.send_event("r1", "ping", "2", 3.0))


def test_a_dead_run_keeps_events_a_final_one_refuses_them(store: Store) -> None:
    """A dead run may be resumed, so it accepts events; a completed run refuses them."""
    make(store, "dead", status="dead", at=1.0)
    make(store, "done", at=1.0)
    run(store.send_event("dead", "later", "1", 2.0))
    assert run(store.next_event("dead", "later")) is not None
    with pytest.raises(Exception, match="not delivered"):
        run(store.send_event("done", "later", "1", 2.0))


@pytest.mark.postgres
def test_postgres_gc_skips_rows_another_transaction_holds() -> None:
    """On PostgreSQL gc never waits: a run row or blob row locked elsewhere is simply kept."""
    import psycopg

    from perdure.store.postgres import PostgresStore

    schema = f"t_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(f"{PG_URL}?schema={schema}")
    store.start()
    try:
        _gc_skips_held_rows(store, schema, psycopg)
    finally:
        store.stop()
        drop_schema(schema)


def _gc_skips_held_rows(store: Store, schema: str, psycopg: Any) -> None:
    blob = Blob("k-held", "H" * 10)
    make(store, "held", at=1.0)
    make(store, "free", at=1.0, blobs=[blob])
    run(
        store.append(Append("free", None, [Entry(kind="n", data=json.dumps({BLOB_KEY: "k-held"}))]))
    )
    with psycopg.connect(PG_URL) as other:
        other.execute(f'SELECT 1 FROM "{schema}".runs WHERE id = %s FOR UPDATE', ("held",))
        other.execute(f'SELECT 1 FROM "{schema}".blobs WHERE key = %s FOR UPDATE', ("k-held",))
        finished = threading.Event()
        result: list[GcBatch] = []

        def collect() -> None:
            result.append(gc_all(store, GcRule("wf", keep_last=0)))
            finished.set()

        threading.Thread(target=collect, daemon=True).start()
        assert finished.wait(10), "gc waited for a lock another transaction holds"
        other.rollback()
    assert ids(store) == {"held"}
    assert result[0].runs == 1 and result[0].blobs == 0
    assert run(store.get_blob("k-held")) == "H" * 10


def test_engine_reused_id_after_gc_executes_its_steps(any_app: perdure.App) -> None:
    """Through the engine on each store: after gc a reused id runs its steps anew."""
    app = any_app
    calls: list[str] = []

    @app.step(name="work", effect="idempotent")
    def work(tag: str) -> str:
        calls.append(tag)
        return tag

    @app.workflow(name="job", retention=perdure.Retention(keep_last=0))
    def job(tag: str) -> str:
        return work(tag)

    app.start(job, "first", run_id="same")
    TestWorker(app).run_until_idle()
    assert app.gc().runs == 1
    handle = app.start(job, "second", run_id="same")
    assert app.journal("same") == []
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "second"
    assert calls == ["first", "second"]


def test_engine_poison_run_becomes_dead_and_resumes(any_app: perdure.App) -> None:
    """Through the engine on each store: crashed recoveries make a run dead; resume revives it."""
    app = any_app
    clock = app.clock
    assert isinstance(clock, TestClock)

    @app.step(name="poison", effect="idempotent")
    def poison() -> str:
        return "ok"

    @app.workflow(name="job")
    def job() -> str:
        return poison()

    handle = app.start(job)
    for _ in range(2):
        dying = TestWorker(app, max_recoveries=1)
        dying.crash_after_intent("poison")
        with pytest.raises(SimulatedCrash):
            dying.run_until_idle()
        clock.advance(dying.lease + 1)
    TestWorker(app, max_recoveries=1).run_until_idle()
    assert [r.id for r in app.list_runs(statuses=["dead"])] == [handle.id]
    with pytest.raises(perdure.RunFailed, match="dead"):
        handle.result(timeout=5)
    app.resume(handle.id)
    TestWorker(app, max_recoveries=1).run_until_idle()
    assert handle.result(timeout=5) == "ok"
