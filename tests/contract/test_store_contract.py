"""Store behaviour every store must have, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import pytest

import perdure
from perdure.store import sqlops
from perdure.store.base import (
    Append,
    Blob,
    Entry,
    NewRun,
    OperatorRequest,
    Store,
)

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def new(run_id: str, workflow: str = "wf", now: float = 100.0, **kw: Any) -> NewRun:
    return NewRun(id=run_id, workflow=workflow, input="{}", code_version="v", now=now, **kw)


def entry(
    kind: str,
    position: int | None = None,
    final: bool = False,
    data: str | None = None,
    name: str = "s",
) -> Entry:
    return Entry(kind=kind, name=name, position=position, final=final, data=data, at=1.0)


def test_create_run_is_idempotent(store: Store) -> None:
    """Creating an existing id returns the existing run and says it was not created."""
    first, created = run(store.create_run(new("r1")))
    again, created_again = run(store.create_run(new("r1", now=999.0)))
    assert (created, created_again) == (True, False)
    assert again.created_at == first.created_at == 100.0
    assert run(store.count_runs()) == {"pending": 1}


def test_stale_epoch_is_refused_and_writes_nothing(store: Store) -> None:
    """An append under an epoch that moved on raises LeaseLost; the journal is unchanged."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    stale = claim.run.lease_epoch
    run(store.append(Append("r1", stale, [entry("step.intent", 0)])))
    run(store.claim("w2", 200.0, 30.0, 10, ["wf"]))  # the lease expired: w2 takes over
    before = run(store.journal("r1"))
    with pytest.raises(perdure.LeaseLost):
        run(store.append(Append("r1", stale, [entry("step.outcome", 0, final=True)])))
    assert run(store.journal("r1")) == before


def test_journal_sequence_is_gap_free_across_writers(store: Store) -> None:
    """Worker and operator appends interleave into one gap-free sequence."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    for i in range(5):
        run(store.append(Append("r1", claim.run.lease_epoch, [entry("value.recorded", i, True)])))
        run(store.append(Append("r1", None, [entry("run.note")])))
    assert [e.seq for e in run(store.journal("r1"))] == list(range(10))


def test_one_final_entry_per_position_and_the_write_is_atomic(store: Store) -> None:
    """A second outcome for a position is refused, and nothing of that append lands."""
    run(store.create_run(new("r1")))
    run(store.append(Append("r1", None, [entry("step.outcome", 0, True)])))
    with pytest.raises(perdure.StoreError):
        run(
            store.append(
                Append(
                    "r1", None, [entry("value.recorded", 1, True), entry("step.outcome", 0, True)]
                )
            )
        )
    assert [(e.position, e.kind) for e in run(store.journal("r1"))] == [(0, "step.outcome")]


def test_claim_leases_heartbeats_and_takeover(store: Store) -> None:
    """A run is claimed once; a heartbeat keeps it; after expiry another worker takes it over."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    assert claim.recovered_from is None and claim.run.status == "running"
    assert run(store.claim("w2", 110.0, 30.0, 10, ["wf"])) == []
    [beat] = run(store.heartbeat("w1", ["r1"], 200.0))
    assert beat.run_id == "r1"
    assert run(store.claim("w2", 150.0, 30.0, 10, ["wf"])) == []  # lease now runs to 200
    [taken] = run(store.claim("w2", 201.0, 30.0, 10, ["wf"]))
    assert taken.recovered_from == "w1"
    assert taken.run.lease_epoch == claim.run.lease_epoch + 1
    assert run(store.journal("r1"))[-1].kind == "run.recovered"
    assert run(store.heartbeat("w1", ["r1"], 300.0)) == []  # w1 no longer holds it


def test_release_makes_a_run_claimable_at_once(store: Store) -> None:
    """A released lease can be claimed immediately by another worker."""
    run(store.create_run(new("r1")))
    run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    run(store.release("w1", ["r1"]))
    [claim] = run(store.claim("w2", 101.0, 30.0, 10, ["wf"]))
    assert claim.recovered_from == "w1"


def test_claim_filters_by_workflow_and_respects_timers(store: Store) -> None:
    """Only registered workflows are claimed, and a sleeping run only once its timer is due."""
    run(store.create_run(new("other", workflow="elsewhere")))
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    run(
        store.append(
            Append(
                "r1",
                claim.run.lease_epoch,
                [entry("sleep.until", 0, True)],
                status="sleeping",
                fields={"wake_at": 500.0, "lease_owner": None, "lease_until": None},
            )
        )
    )
    assert run(store.next_wake(["wf"])) == 500.0
    assert run(store.claim("w1", 499.0, 30.0, 10, ["wf"])) == []
    assert [c.run.id for c in run(store.claim("w1", 500.0, 30.0, 10, ["wf"]))] == ["r1"]


def _park(store: Store, run_id: str, epoch: int, wake_at: float) -> None:
    fields = {"wake_at": wake_at, "lease_owner": None, "lease_until": None}
    run(store.append(Append(run_id, epoch, [entry("sleep.until", 0, True)], status="sleeping",
                            fields=fields)))  # fmt: skip


def test_claim_order_spans_pending_expired_and_due_runs(store: Store) -> None:
    """Pending runs, runs whose lease expired and sleepers now due are claimed together in
    one order (priority, then due time); finished runs and sleepers not due never are."""
    for run_id, priority in (("sleeper", 5), ("expired", 3), ("late", 9), ("done", 9)):
        run(store.create_run(new(run_id, now=10.0, priority=priority)))
    claims = {c.run.id: c.run for c in run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))}
    _park(store, "sleeper", claims["sleeper"].lease_epoch, 150.0)
    _park(store, "late", claims["late"].lease_epoch, 900.0)
    run(store.append(Append("done", claims["done"].lease_epoch, [], status="completed")))
    run(store.create_run(new("low", now=20.0)))
    run(store.create_run(new("high", now=50.0, priority=7)))
    order = []
    while got := run(store.claim("w2", 200.0, 1000.0, 1, ["wf"])):
        order += [c.run.id for c in got]
    assert order == ["high", "sleeper", "expired", "low"]  # "expired": w1's lease ran out
    assert [c.run.id for c in run(store.claim("w3", 901.0, 30.0, 10, ["wf"]))] == ["late"]


def test_a_claim_says_whether_it_left_runnable_runs_behind(store: Store) -> None:
    """`more` is true when runnable runs were left for want of slots, false when the claim
    took every one (an idle worker then knows there is nothing else to run)."""
    for run_id in ("a", "b"):
        run(store.create_run(new(run_id)))
    first = run(store.claim("w", 100.0, 30.0, 1, ["wf"]))
    assert len(first) == 1 and first.more
    second = run(store.claim("w", 100.0, 30.0, 1, ["wf"]))
    assert len(second) == 1 and not second.more
    assert not run(store.claim("w", 100.0, 30.0, 5, ["wf"])).more


def test_events_are_kept_in_order_and_wake_a_waiting_run(store: Store) -> None:
    """Events sent before a wait are kept in order; one sent to a waiting run makes it pending."""
    run(store.create_run(new("r1")))
    first = run(store.send_event("r1", "ping", "1", 100.0))
    run(store.send_event("r1", "ping", "2", 101.0))
    nxt = run(store.next_event("r1", "ping"))
    assert nxt is not None and nxt.id == first and nxt.payload == "1"
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    run(
        store.append(
            Append(
                "r1", claim.run.lease_epoch, [entry("event.received", 0, True)], consume_event=first
            )
        )
    )
    nxt = run(store.next_event("r1", "pong"))
    assert nxt is None
    result = run(
        store.append(
            Append(
                "r1",
                claim.run.lease_epoch,
                [entry("event.wait", 1)],
                status="waiting",
                fields={"waiting_for": "event:pong"},
            )
        )
    )
    assert result.status == "waiting"
    run(store.send_event("r1", "pong", "3", 102.0))
    assert run(store.get_run("r1")).status == "pending"  # type: ignore[union-attr]


def test_waiting_for_an_event_already_sent_is_not_a_lost_wake_up(store: Store) -> None:
    """Parking to wait for an event that is already there leaves the run runnable."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    run(store.send_event("r1", "go", "1", 100.0))
    result = run(
        store.append(
            Append(
                "r1",
                claim.run.lease_epoch,
                [entry("event.wait", 0)],
                status="waiting",
                fields={"waiting_for": "event:go"},
            )
        )
    )
    assert result.status == "pending"


def test_events_to_unknown_or_finished_runs_are_refused(store: Store) -> None:
    """send_event names a missing run with RunNotFound and a finished one with StoreError."""
    with pytest.raises(perdure.RunNotFound):
        run(store.send_event("nope", "go", "1", 1.0))
    run(store.create_run(new("r1")))
    run(store.append(Append("r1", None, [entry("run.completed")], status="completed")))
    with pytest.raises(perdure.StoreError, match="completed"):
        run(store.send_event("r1", "go", "1", 1.0))


def test_cancel_reaches_parked_children_and_marks_held_runs_cancelling(store: Store) -> None:
    """Cancelling a held parent marks it cancelling and cancels its parked child at once."""
    run(store.create_run(new("parent")))
    run(store.claim("w1", 100.0, 30.0, 1, ["wf"]))
    run(store.create_run(new("child", parent_id="parent")))
    touched = run(store.cancel("parent", 110.0))
    assert set(touched) == {"parent", "child"}
    assert run(store.get_run("parent")).status == "cancelling"  # type: ignore[union-attr]
    assert run(store.get_run("child")).status == "cancelled"  # type: ignore[union-attr]


def test_operator_requests_refuse_a_guarded_write(store: Store) -> None:
    """With a cancel pending, an append that asks to stop on requests writes nothing."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    run(store.cancel("r1", 101.0))
    before = run(store.journal("r1"))
    with pytest.raises(OperatorRequest) as info:
        run(
            store.append(
                Append(
                    "r1", claim.run.lease_epoch, [entry("step.intent", 0)], stop_if_requested=True
                )
            )
        )
    assert info.value.cancel
    assert run(store.journal("r1")) == before


def test_transactional_body_commits_with_its_outcome_or_not_at_all(store: Store) -> None:
    """A body's writes commit with the outcome entry; a failing body leaves neither behind."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    epoch = claim.run.lease_epoch

    def create(conn: Any) -> str:
        conn.execute("CREATE TABLE IF NOT EXISTS credits (n INTEGER)")
        conn.execute("INSERT INTO credits VALUES (7)")
        return '{"value":7}'

    def fail(conn: Any) -> str:
        conn.execute("INSERT INTO credits VALUES (8)")
        raise ValueError("no")

    def with_body(write: Append, body: Any) -> Any:
        """A write with a body in its transaction: through the one generic entry."""
        return store.run_sql(
            functools.partial(sqlops.append_with_body, append=write, body=body), write=True
        )

    ok = run(with_body(Append("r1", epoch, [entry("step.outcome", 0, True)]), create))
    assert ok.tx_data == '{"value":7}' and ok.tx_error is None
    bad = run(with_body(Append("r1", epoch, [entry("step.outcome", 1, True)]), fail))
    assert isinstance(bad.tx_error, ValueError)
    assert [e.position for e in run(store.journal("r1"))] == [0]

    def count(conn: Any) -> str:
        return str(conn.execute("SELECT COUNT(*) FROM credits").fetchone()[0])

    probe = run(with_body(Append("r1", None, [entry("run.note")]), count))
    assert probe.tx_data == "1"
    run(store.append(Append("r1", epoch, [entry("step.intent", 2)])))
    assert [e.seq for e in run(store.journal("r1"))] == [0, 1, 2]  # the failed body's seq is reused


def test_blobs_round_trip(store: Store) -> None:
    """A stored blob reads back unchanged; a missing one is a StoreError."""
    run(store.create_run(new("r1", blobs=[Blob("k1", "x" * 100_000)])))
    assert run(store.get_blob("k1")) == "x" * 100_000
    with pytest.raises(perdure.StoreError):
        run(store.get_blob("missing"))


def test_list_runs_filters(store: Store) -> None:
    """list_runs filters by status, workflow and parent."""
    run(store.create_run(new("a")))
    run(store.create_run(new("b", workflow="other")))
    run(store.create_run(new("c", parent_id="a")))
    assert {r.id for r in run(store.list_runs(workflow="other"))} == {"b"}
    assert {r.id for r in run(store.list_runs(parent_id="a"))} == {"c"}
    assert {r.id for r in run(store.list_runs(statuses=["pending"]))} == {"a", "b", "c"}


def test_two_stores_never_claim_the_same_run(new_store: Callable[[], Store]) -> None:
    """Two processes' stores claiming concurrently split the runs between them, no overlap."""
    first, second = new_store(), new_store()
    for i in range(60):
        run(first.create_run(new(f"r{i}")))
    got: dict[str, list[str]] = {"a": [], "b": []}

    def claimer(name: str, store: Store) -> None:
        async def loop() -> None:
            while True:
                claims = await store.claim(name, 100.0, 30.0, 3, ["wf"])
                if not claims:
                    return
                got[name].extend(c.run.id for c in claims)

        asyncio.run(loop())

    threads = [
        threading.Thread(target=claimer, args=("a", first)),
        threading.Thread(target=claimer, args=("b", second)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == sorted(f"r{i}" for i in range(60))


def test_stuck_lists_runs_nobody_is_moving(store: Store) -> None:
    """Expired leases, long-due timers and long-pending runs are stuck; fresh ones are not."""
    run(store.create_run(new("held")))
    run(store.claim("w1", 100.0, 30.0, 1, ["wf"]))  # lease until 130
    run(store.create_run(new("waiting-long", now=100.0)))
    [claim] = run(store.claim("w2", 100.0, 30.0, 1, ["wf"]))
    run(
        store.append(
            Append(
                "waiting-long",
                claim.run.lease_epoch,
                [entry("sleep.until", 0, True)],
                status="sleeping",
                fields={"wake_at": 150.0, "lease_owner": None, "lease_until": None},
            )
        )
    )
    run(store.create_run(new("fresh", now=290.0)))
    late = {r.id for r in run(store.stuck(300.0, 60.0))}
    assert late == {"held", "waiting-long"}
    assert {r.id for r in run(store.stuck(300.0, 5.0))} == {"held", "waiting-long", "fresh"}


def test_a_plain_append_of_several_entries_keeps_the_sequence(store: Store) -> None:
    """Entries-only appends (one statement on PostgreSQL) land in order, gap-free, fenced."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    epoch = claim.run.lease_epoch
    run(store.append(Append("r1", epoch, [entry("step.intent", 0)])))
    batch = [entry("step.outcome", 0, True, '{"v":1}'), entry("step.intent", 1)]
    result = run(store.append(Append("r1", epoch, batch)))
    assert (result.status, result.cancel_requested, result.pause_requested) == (
        "running",
        False,
        False,
    )
    got = run(store.journal("r1"))
    assert [(e.seq, e.position, e.kind, e.data, e.epoch) for e in got] == [
        (0, 0, "step.intent", None, epoch),
        (1, 0, "step.outcome", '{"v":1}', epoch),
        (2, 1, "step.intent", None, epoch),
    ]
    with pytest.raises(perdure.RunNotFound):
        run(store.append(Append("nope", None, [entry("run.note")])))


def test_a_claim_says_whether_the_journal_is_empty(store: Store) -> None:
    """A first claim of a run with nothing recorded needs no journal read; a takeover does."""
    run(store.create_run(new("fresh")))
    run(store.create_run(new("noted")))
    run(store.append(Append("noted", None, [entry("run.note")])))
    claims = {c.run.id: c for c in run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))}
    assert claims["fresh"].empty_journal and not claims["noted"].empty_journal
    assert claims["fresh"].run.status == "running" and claims["fresh"].run.lease_owner == "w1"
    [taken, _] = sorted(run(store.claim("w2", 200.0, 30.0, 10, ["wf"])), key=lambda c: c.run.id)
    assert taken.run.id == "fresh" and taken.recovered_from == "w1"
    assert not taken.empty_journal  # the takeover itself recorded run.recovered
    assert (
        taken.run.recoveries == 1 and taken.run.lease_epoch == claims["fresh"].run.lease_epoch + 1
    )


def _batched(store: Store, appends: list[Append]) -> list[Any]:
    """Queue `appends` while the store thread is held, so they reach it as one batch."""

    async def main() -> list[Any]:
        gate = threading.Event()
        held = store.submit(lambda c: gate.wait(10), write=False)  # type: ignore[attr-defined]
        tasks = [asyncio.create_task(store.append(a)) for a in appends]
        await asyncio.sleep(0.1)  # every append is queued behind the held op
        gate.set()
        await asyncio.wrap_future(held)
        return await asyncio.gather(*tasks, return_exceptions=True)

    return run(main())


def _claimed(store: Store, ids: list[str]) -> dict[str, int]:
    for run_id in ids:
        run(store.create_run(new(run_id)))
    return {c.run.id: c.run.lease_epoch for c in run(store.claim("w1", 100.0, 30.0, 50, ["wf"]))}


def test_a_batch_of_step_writes_shares_one_commit(store: Store) -> None:
    """Plain appends of eight runs queued together commit together, each in its own journal."""
    epochs = _claimed(store, [f"r{i}" for i in range(8)])
    before = store.commits  # type: ignore[attr-defined]
    results = _batched(
        store,
        [
            Append(rid, epoch, [entry("step.intent", 0), entry("step.outcome", 0, True, "1")])
            for rid, epoch in epochs.items()
        ],
    )
    assert [r.status for r in results] == ["running"] * 8
    assert store.commits - before == 1  # type: ignore[attr-defined]
    for rid in epochs:
        assert [(e.seq, e.kind) for e in run(store.journal(rid))] == [
            (0, "step.intent"),
            (1, "step.outcome"),
        ]


def test_one_bad_write_in_a_batch_fails_alone(store: Store) -> None:
    """A duplicate outcome and a stale epoch in a batch fail on their own; the rest land,
    and two writes of one run keep their order."""
    epochs = _claimed(store, ["a", "dup", "stale", "twice", "z"])
    run(store.append(Append("dup", epochs["dup"], [entry("step.outcome", 0, True, "1")])))
    results = _batched(
        store,
        [
            Append("a", epochs["a"], [entry("step.outcome", 0, True, "1")]),
            Append("dup", epochs["dup"], [entry("step.outcome", 0, True, "2")]),
            Append("stale", epochs["stale"] - 1, [entry("step.outcome", 0, True, "1")]),
            Append("twice", epochs["twice"], [entry("step.intent", 0)]),
            Append("twice", epochs["twice"], [entry("step.outcome", 0, True, "1")]),
            Append("z", epochs["z"], [entry("step.outcome", 0, True, "1")]),
        ],
    )
    assert isinstance(results[1], perdure.StoreError) and "already has an outcome" in str(
        results[1]
    )
    assert isinstance(results[2], perdure.LeaseLost)
    assert [getattr(r, "status", None) for r in results] == [
        "running", None, None, "running", "running", "running",
    ]  # fmt: skip
    assert [e.data for e in run(store.journal("dup"))] == ["1"]
    assert run(store.journal("stale")) == []
    assert [e.kind for e in run(store.journal("twice"))] == ["step.intent", "step.outcome"]
    for rid in ("a", "z"):
        assert [e.kind for e in run(store.journal(rid))] == ["step.outcome"]


def test_a_duplicate_among_plain_writes_fails_alone(store: Store) -> None:
    """Plain step writes of distinct runs only (PostgreSQL: one shared statement): a
    duplicate outcome among them fails on its own, the others land once each."""
    epochs = _claimed(store, ["p1", "p2", "p3"])
    run(store.append(Append("p2", epochs["p2"], [entry("step.outcome", 0, True, "1")])))
    results = _batched(
        store,
        [Append(rid, epochs[rid], [entry("step.outcome", 0, True, "2")]) for rid in epochs],
    )
    assert isinstance(results[1], perdure.StoreError) and "already has an outcome" in str(
        results[1]
    )
    assert [getattr(r, "status", None) for r in results] == ["running", None, "running"]
    assert [[e.data for e in run(store.journal(rid))] for rid in epochs] == [["2"], ["1"], ["2"]]


def test_an_event_with_a_key_is_kept_once(store: Store) -> None:
    """A second delivery with the same key returns the first event's id and keeps nothing."""
    run(store.create_run(new("r1")))
    first = run(store.send_event("r1", "go", "1", 100.0, "k1"))
    again = run(store.send_event("r1", "go", "2", 101.0, "k1"))
    other = run(store.send_event("r1", "go", "3", 102.0, "k2"))
    unkeyed = [run(store.send_event("r1", "go", "4", 103.0)) for _ in range(2)]
    assert first == again and len({first, other, *unkeyed}) == 4
    event = run(store.next_event("r1", "go"))
    assert event is not None and (event.id, event.payload) == (first, "1")


def test_runs_and_journals_page_by_keyset(store: Store) -> None:
    """list_runs(after=) walks newest first, ties by id, each run once; journal(after, limit)
    returns the entries after a seq."""
    for i, at in enumerate([100.0, 200.0, 200.0, 200.0, 300.0]):
        run(store.create_run(new(f"r{i}", now=at)))
    seen: list[str] = []
    after = None
    while True:
        page = run(store.list_runs(limit=2, after=after))
        if not page:
            break
        seen += [r.id for r in page]
        after = (page[-1].created_at, page[-1].id)
    assert seen == ["r4", "r1", "r2", "r3", "r0"]
    run(store.append(Append("r0", None, [entry("run.note", data=str(i)) for i in range(5)])))
    assert [e.seq for e in run(store.journal("r0", after=1, limit=2))] == [2, 3]
    assert [e.seq for e in run(store.journal("r0", after=2))] == [3, 4]


def test_a_retried_write_that_landed_is_not_written_twice(store: Store) -> None:
    """A write sent again after a lost connection (`retry`, same `key`): if its first try
    landed, nothing more is written and the run's state is answered; if it did not, it
    lands now, once. Writes without a key never hide a keyed one."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    epoch = claim.run.lease_epoch
    first = Append("r1", epoch, [entry("step.outcome", 0, final=True)], key="k1")
    run(store.append(first))
    run(store.append(Append("r1", None, [entry("run.note")])))  # an operator's note between
    again = run(store.append(Append("r1", epoch, list(first.entries), key="k1", retry=True)))
    assert again.status == "running" and not again.cancel_requested
    assert [e.kind for e in run(store.journal("r1"))] == ["step.outcome", "run.note"]
    unlanded = Append("r1", epoch, [entry("step.outcome", 1, final=True)], key="k2", retry=True)
    run(store.append(unlanded))
    run(store.append(Append("r1", epoch, list(unlanded.entries), key="k2", retry=True)))
    outcomes = [e.position for e in run(store.journal("r1")) if e.kind == "step.outcome"]
    assert outcomes == [0, 1]


def test_two_writes_of_a_run_held_through_one_outage_land_once_each(store: Store) -> None:
    """Two writes of one run whose answers were both lost (a buffered outcome's flush and
    the run's end, sent together before the store went away): both landed, the second took
    the run's last key; retried in either order, neither is written twice."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    epoch = claim.run.lease_epoch
    step = Entry(kind="step.failed", name="s", position=0, final=True, at=101.5, worker="w1")
    end = Entry(kind="run.failed", name="wf", at=101.7, worker="w1")
    flush = Append("r1", epoch, [step], key="k1")
    ending = Append("r1", epoch, [end], status="failed", key="k2")
    run(store.append(flush))
    run(store.append(ending))
    for sent in (flush, ending):
        again = run(store.append(replace(sent, entries=list(sent.entries), retry=True)))
        assert again.status == "failed"
    assert [e.kind for e in run(store.journal("r1"))] == ["step.failed", "run.failed"]


def test_a_retried_sleep_that_landed_keeps_its_status(store: Store) -> None:
    """The retried write of a status change that landed answers the status it wrote."""
    run(store.create_run(new("r1")))
    [claim] = run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    sleep = Append("r1", claim.run.lease_epoch, [entry("sleep.started", 0)], status="sleeping",
                   fields={"wake_at": 500.0, "lease_owner": None}, key="k1")  # fmt: skip
    run(store.append(sleep))
    again = run(store.append(Append("r1", claim.run.lease_epoch, list(sleep.entries),
                                    status="sleeping", key="k1", retry=True)))  # fmt: skip
    assert again.status == "sleeping"
    assert len(run(store.journal("r1"))) == 1


def test_a_claimer_never_takes_a_run_it_still_executes(store: Store) -> None:
    """Its lease ran out (the store was away), but the claimer says it still executes the
    run: it does not claim it again; another worker may."""
    run(store.create_run(new("r1")))
    run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))
    assert run(store.claim("w1", 200.0, 30.0, 10, ["wf"], executing=["r1"])) == []
    [taken] = run(store.claim("w2", 200.0, 30.0, 10, ["wf"]))
    assert taken.recovered_from == "w1"


def test_a_claim_cut_off_unanswered_is_taken_up_again_at_once(store: Store) -> None:
    """A claim that landed but whose answer was lost leaves runs leased to a claimer that
    does not execute them: with `own` it takes them again at once, as fresh claims (no
    recovery counted or journaled); without, only after the lease expires."""
    run(store.create_run(new("r1")))
    run(store.claim("w1", 100.0, 30.0, 10, ["wf"]))  # its answer "lost"
    assert run(store.claim("w1", 101.0, 30.0, 10, ["wf"])) == []
    [again] = run(store.claim("w1", 102.0, 30.0, 10, ["wf"], own=True))
    assert again.recovered_from is None and again.run.recoveries == 0
    assert run(store.journal("r1")) == []
    assert run(store.claim("w2", 103.0, 30.0, 10, ["wf"], own=True)) == []  # not w2's
