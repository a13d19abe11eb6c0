"""The SQLite store's invariants: fencing, gap-free journal, one outcome per position, leases."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.store import SQLiteStore
from perdure.store.base import Append, Entry, NewRun

WF = "wf"
LEASE = 30.0


def new_run(run_id: str, *, parent_id: str | None = None, now: float = 0.0) -> NewRun:
    return NewRun(
        id=run_id,
        workflow=WF,
        input='{"args":[],"kwargs":{}}',
        code_version="v1",
        now=now,
        parent_id=parent_id,
    )


def entry(kind: str = "value.recorded", position: int | None = None, **kw: Any) -> Entry:
    return Entry(kind=kind, name=kw.pop("name", "x"), position=position, at=1.0, **kw)


def seqs(call: Any, store: SQLiteStore, run_id: str) -> list[int]:
    return [e.seq for e in call(store.journal(run_id))]


def test_create_run_is_idempotent(call: Any, store: SQLiteStore) -> None:
    """Creating an existing run id returns the existing row, created=False, and changes nothing."""
    row, created = call(store.create_run(new_run("r")))
    assert created and row.status == "pending" and row.lease_epoch == 0
    other = NewRun(id="r", workflow=WF, input='{"args":[1]}', code_version="v2", now=5.0)
    again, created_again = call(store.create_run(other))
    assert not created_again
    assert again == row


def test_claim_sets_a_lease_and_bumps_the_epoch(call: Any, store: SQLiteStore) -> None:
    """A claim marks the run running under the owner, with lease_until and a new epoch."""
    call(store.create_run(new_run("r")))
    (claim,) = call(store.claim("w1", 100.0, LEASE, 10, [WF]))
    assert claim.recovered_from is None
    assert claim.run.status == "running"
    assert claim.run.lease_owner == "w1"
    assert claim.run.lease_until == 100.0 + LEASE
    assert claim.run.lease_epoch == 1
    assert call(store.claim("w2", 100.0 + LEASE - 1, LEASE, 10, [WF])) == []


def test_claim_only_takes_registered_workflows(call: Any, store: SQLiteStore) -> None:
    """A worker claims only runs of the workflows it names."""
    call(store.create_run(new_run("r")))
    assert call(store.claim("w1", 1.0, LEASE, 10, ["other"])) == []
    assert call(store.claim("w1", 1.0, LEASE, 10, [])) == []
    assert len(call(store.claim("w1", 1.0, LEASE, 10, [WF]))) == 1


def test_expired_lease_is_taken_over_with_a_recovered_entry(call: Any, store: SQLiteStore) -> None:
    """After lease_until, another owner claims the run; the journal records `run.recovered`."""
    call(store.create_run(new_run("r")))
    call(store.claim("w1", 0.0, LEASE, 10, [WF]))
    (claim,) = call(store.claim("w2", LEASE + 1, LEASE, 10, [WF]))
    assert claim.recovered_from == "w1"
    assert claim.run.lease_epoch == 2
    assert claim.run.recoveries == 1
    (recovered,) = call(store.journal("r"))
    assert recovered.kind == "run.recovered"
    assert recovered.epoch == 2


def test_append_with_a_stale_epoch_raises_lease_lost_and_writes_nothing(
    call: Any, store: SQLiteStore
) -> None:
    """An append carrying an epoch that was taken over raises LeaseLost and changes no row."""
    call(store.create_run(new_run("r")))
    call(store.claim("w1", 0.0, LEASE, 10, [WF]))
    call(store.claim("w2", LEASE + 1, LEASE, 10, [WF]))  # epoch 2
    journal_before = call(store.journal("r"))
    run_before = call(store.get_run("r"))
    stale = Append(
        run_id="r",
        epoch=1,
        entries=[entry(position=0, final=True)],
        status="completed",
        fields={"result": "1", "updated_at": 99.0},
    )
    with pytest.raises(perdure.LeaseLost) as info:
        call(store.append(stale))
    assert info.value.run_id == "r" and info.value.epoch == 1
    assert isinstance(info.value, perdure.StoreError)
    assert call(store.journal("r")) == journal_before
    assert call(store.get_run("r")) == run_before
    # the current holder's next write follows on without a gap
    call(store.append(Append(run_id="r", epoch=2, entries=[entry(position=0, final=True)])))
    assert seqs(call, store, "r") == [0, 1]


def test_append_with_the_current_epoch_writes_entries_and_status(
    call: Any, store: SQLiteStore
) -> None:
    """An append under the current epoch stores entries (stamped with the epoch) and the status."""
    call(store.create_run(new_run("r")))
    (claim,) = call(store.claim("w1", 0.0, LEASE, 10, [WF]))
    result = call(
        store.append(
            Append(
                run_id="r",
                epoch=claim.run.lease_epoch,
                entries=[entry(position=0, final=True, data="5"), entry("run.completed")],
                status="completed",
                fields={"result": "5", "lease_owner": None},
            )
        )
    )
    assert result.status == "completed"
    run = call(store.get_run("r"))
    assert (run.status, run.result, run.lease_owner) == ("completed", "5", None)
    journal = call(store.journal("r"))
    assert [(e.kind, e.seq, e.epoch) for e in journal] == [
        ("value.recorded", 0, 1),
        ("run.completed", 1, 1),
    ]


def test_operator_append_is_not_fenced(call: Any, store: SQLiteStore) -> None:
    """An append with epoch=None (operator/client) is accepted whatever the epoch is."""
    call(store.create_run(new_run("r")))
    call(store.claim("w1", 0.0, LEASE, 10, [WF]))
    call(store.append(Append(run_id="r", epoch=None, entries=[entry("run.pause_requested")])))
    assert [e.kind for e in call(store.journal("r"))] == ["run.pause_requested"]


def test_append_to_unknown_run_raises_run_not_found(call: Any, store: SQLiteStore) -> None:
    """Appending to a run id that does not exist raises RunNotFound."""
    with pytest.raises(perdure.RunNotFound):
        call(store.append(Append(run_id="nope", epoch=None, entries=[entry()])))
    with pytest.raises(perdure.RunNotFound):
        call(store.append(Append(run_id="nope", epoch=3, entries=[entry()])))


def test_journal_seq_is_gap_free_under_concurrent_appends(call: Any, store: SQLiteStore) -> None:
    """Many concurrent appends (grouped commits) get seqs 0..n-1, each append contiguous."""
    call(store.create_run(new_run("r")))

    async def many() -> None:
        await asyncio.gather(
            *(
                store.append(
                    Append(
                        run_id="r",
                        epoch=None,
                        entries=[entry(name=f"a{i}", data=str(k)) for k in range(1 + i % 3)],
                    )
                )
                for i in range(60)
            )
        )

    call(many())
    journal = call(store.journal("r"))
    assert [e.seq for e in journal] == list(range(len(journal)))
    assert len(journal) == sum(1 + i % 3 for i in range(60))
    for i in range(60):  # the entries of one append are contiguous and in order
        mine = [e for e in journal if e.name == f"a{i}"]
        assert [e.data for e in mine] == [str(k) for k in range(1 + i % 3)]
        assert mine[-1].seq - mine[0].seq == len(mine) - 1


def test_second_final_entry_for_a_position_is_refused(call: Any, store: SQLiteStore) -> None:
    """A second final entry at a position is refused: the append is undone, seq stays gap-free."""
    call(store.create_run(new_run("r")))
    call(store.append(Append(run_id="r", epoch=None, entries=[entry(position=0, final=True)])))
    twice = Append(
        run_id="r",
        epoch=None,
        status="completed",
        entries=[entry("step.intent", position=1), entry(position=0, final=True, data="2")],
    )
    with pytest.raises(perdure.StoreError, match="already has an outcome"):
        call(store.append(twice))
    assert [(e.kind, e.position) for e in call(store.journal("r"))] == [("value.recorded", 0)]
    assert call(store.get_run("r")).status == "pending"
    # non-final entries may share a position; a later good append continues the sequence
    call(store.append(Append(run_id="r", epoch=None, entries=[entry("step.intent", position=1)])))
    call(store.append(Append(run_id="r", epoch=None, entries=[entry("step.intent", position=1)])))
    assert seqs(call, store, "r") == [0, 1, 2]


def test_refused_write_does_not_undo_others_in_the_same_batch(
    call: Any, store: SQLiteStore
) -> None:
    """In one group commit, a refused append fails alone; the others are committed."""
    for rid in ("a", "b", "c"):
        call(store.create_run(new_run(rid)))
    call(store.append(Append(run_id="b", epoch=None, entries=[entry(position=0, final=True)])))

    async def batch() -> list[Any]:
        return await asyncio.gather(
            store.append(Append(run_id="a", epoch=None, entries=[entry(position=0, final=True)])),
            store.append(Append(run_id="b", epoch=None, entries=[entry(position=0, final=True)])),
            store.append(Append(run_id="c", epoch=None, entries=[entry(position=0, final=True)])),
            store.append(Append(run_id="missing", epoch=None, entries=[entry()])),
            return_exceptions=True,
        )

    results = call(batch())
    assert isinstance(results[1], perdure.StoreError)
    assert isinstance(results[3], perdure.RunNotFound)
    assert not isinstance(results[0], BaseException)
    assert not isinstance(results[2], BaseException)
    assert seqs(call, store, "a") == [0]
    assert seqs(call, store, "b") == [0]
    assert seqs(call, store, "c") == [0]


def test_expect_status_refuses_a_changed_run(call: Any, store: SQLiteStore) -> None:
    """An append expecting another status is refused and writes nothing."""
    call(store.create_run(new_run("r")))
    guarded = Append(
        run_id="r",
        epoch=None,
        entries=[entry("run.resumed")],
        status="pending",
        expect_status=("paused",),
    )
    with pytest.raises(perdure.StoreError, match="expected paused"):
        call(store.append(guarded))
    assert call(store.journal("r")) == []


def test_unknown_run_field_is_refused(call: Any, store: SQLiteStore) -> None:
    """Setting a run column that is not settable is refused and nothing of the append stays."""
    call(store.create_run(new_run("r")))
    bad = Append(run_id="r", epoch=None, entries=[entry()], fields={"lease_epoch": 99})
    with pytest.raises(perdure.StoreError, match="lease_epoch"):
        call(store.append(bad))
    assert call(store.journal("r")) == []
    assert call(store.get_run("r")).lease_epoch == 0


def test_events_are_kept_in_order_and_consumed_once(call: Any, store: SQLiteStore) -> None:
    """Events of one name come back oldest first; consuming one twice is refused."""
    call(store.create_run(new_run("r")))
    first = call(store.send_event("r", "e", '"one"', 1.0))
    call(store.send_event("r", "e", '"two"', 2.0))
    call(store.send_event("r", "other", '"x"', 3.0))
    event = call(store.next_event("r", "e"))
    assert event is not None and (event.id, event.payload) == (first, '"one"')
    consume = Append(
        run_id="r",
        epoch=None,
        entries=[entry("event.received", position=0, final=True)],
        consume_event=first,
    )
    call(store.append(consume))
    following = call(store.next_event("r", "e"))
    assert following is not None and following.payload == '"two"'
    again = Append(
        run_id="r",
        epoch=None,
        entries=[entry("event.received", position=1, final=True)],
        consume_event=first,
    )
    with pytest.raises(perdure.StoreError, match="already consumed"):
        call(store.append(again))
    assert seqs(call, store, "r") == [0]


def test_send_event_wakes_only_a_run_waiting_for_that_name(call: Any, store: SQLiteStore) -> None:
    """An event makes a run waiting for it pending; a run waiting for another name stays waiting."""
    for rid in ("a", "b"):
        call(store.create_run(new_run(rid)))
        (claim,) = call(store.claim("w", 0.0, LEASE, 1, [WF]))
        call(
            store.append(
                Append(
                    run_id=claim.run.id,
                    epoch=claim.run.lease_epoch,
                    status="waiting",
                    fields={"waiting_for": "event:go", "lease_owner": None},
                )
            )
        )
    call(store.send_event("a", "go", "1", 1.0))
    call(store.send_event("b", "stop", "1", 1.0))
    assert call(store.get_run("a")).status == "pending"
    assert call(store.get_run("b")).status == "waiting"


def test_waiting_for_an_event_already_sent_stays_runnable(call: Any, store: SQLiteStore) -> None:
    """Parking to wait for an event that is already there leaves the run pending (no lost wake)."""
    call(store.create_run(new_run("r")))
    (claim,) = call(store.claim("w", 0.0, LEASE, 1, [WF]))
    call(store.send_event("r", "go", "1", 1.0))
    result = call(
        store.append(
            Append(
                run_id="r",
                epoch=claim.run.lease_epoch,
                status="waiting",
                fields={"waiting_for": "event:go"},
            )
        )
    )
    assert result.status == "pending"
    assert call(store.get_run("r")).status == "pending"


def test_send_event_to_finished_or_unknown_run(call: Any, store: SQLiteStore) -> None:
    """Events to an unknown run raise RunNotFound; to a finished run, a StoreError."""
    with pytest.raises(perdure.RunNotFound):
        call(store.send_event("nope", "e", "1", 0.0))
    call(store.create_run(new_run("r")))
    call(store.append(Append(run_id="r", epoch=None, status="completed")))
    with pytest.raises(perdure.StoreError, match="completed"):
        call(store.send_event("r", "e", "1", 0.0))
    assert call(store.next_event("r", "e")) is None


def test_cancel_tree(call: Any, store: SQLiteStore) -> None:
    """Cancel ends parked runs at once, marks held ones `cancelling`, and reaches descendants."""
    call(store.create_run(new_run("p")))
    call(store.create_run(new_run("p.0", parent_id="p")))
    call(store.create_run(new_run("p.0.0", parent_id="p.0")))
    call(store.create_run(new_run("p.1", parent_id="p")))
    call(store.append(Append(run_id="p.1", epoch=None, status="completed")))
    call(store.claim("w", 0.0, LEASE, 10, [WF]))  # p, p.0 and p.0.0 are now running
    call(store.append(Append(run_id="p", epoch=None, status="waiting")))
    touched = call(store.cancel("p", 5.0))
    assert sorted(touched) == ["p", "p.0", "p.0.0"]
    statuses = {rid: call(store.get_run(rid)).status for rid in ("p", "p.0", "p.0.0", "p.1")}
    assert statuses == {
        "p": "cancelled",
        "p.0": "cancelling",
        "p.0.0": "cancelling",
        "p.1": "completed",
    }
    assert call(store.journal("p"))[-1].kind == "run.cancelled"
    assert call(store.journal("p.0"))[-1].kind == "run.cancel_requested"


def test_heartbeat_and_release(call: Any, store: SQLiteStore) -> None:
    """Heartbeats extend only the owner's leases; release hands a lease back at once."""
    call(store.create_run(new_run("a")))
    call(store.create_run(new_run("b")))
    call(store.claim("w1", 0.0, LEASE, 1, [WF]))
    call(store.claim("w2", 0.0, LEASE, 1, [WF]))
    owned = {rid: call(store.get_run(rid)).lease_owner for rid in ("a", "b")}
    mine = next(rid for rid, owner in owned.items() if owner == "w1")
    theirs = next(rid for rid, owner in owned.items() if owner == "w2")
    states = call(store.heartbeat("w1", [mine, theirs], 500.0))
    assert [s.run_id for s in states] == [mine]
    assert call(store.get_run(mine)).lease_until == 500.0
    assert call(store.get_run(theirs)).lease_until == LEASE
    call(store.release("w1", [mine, theirs]))
    assert call(store.get_run(theirs)).lease_until == LEASE
    (claim,) = call(store.claim("w3", 1.0, LEASE, 10, [WF]))
    assert claim.run.id == mine and claim.recovered_from == "w1"


def test_next_wake_and_timers(call: Any, store: SQLiteStore) -> None:
    """next_wake is the earliest timer; a sleeping run is claimable only from its wake_at."""
    for rid, wake in (("a", 50.0), ("b", 20.0)):
        call(store.create_run(new_run(rid)))
        (claim,) = call(store.claim("w", 0.0, LEASE, 1, [WF]))
        call(
            store.append(
                Append(
                    run_id=claim.run.id,
                    epoch=claim.run.lease_epoch,
                    status="sleeping",
                    fields={"wake_at": wake, "lease_owner": None, "lease_until": None},
                )
            )
        )
    assert call(store.next_wake([WF])) == 20.0
    assert call(store.claim("w", 19.9, LEASE, 10, [WF])) == []
    (claim,) = call(store.claim("w", 20.0, LEASE, 10, [WF]))
    assert claim.run.id == "b"


WRITER = textwrap.dedent(
    """
    import asyncio, glob, pathlib, sys, time
    from perdure.store import SQLiteStore
    from perdure.store.base import Append, Entry, NewRun

    path, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

    async def main() -> None:
        store = SQLiteStore(path)
        await store.open()
        # start writing together: each says it is ready, then waits for the other
        pathlib.Path(f"{path}.{me}.ready").touch()
        give_up = time.monotonic() + 60
        while len(glob.glob(f"{path}.*.ready")) < 2:
            if time.monotonic() > give_up:
                sys.exit("the other writer never became ready")
            await asyncio.sleep(0.005)
        for rid in ("shared", me):
            await store.create_run(NewRun(id=rid, workflow="wf", input="{}", code_version="",
                                          now=0.0))
        for i in range(count):
            target = "shared" if i % 2 == 0 else me
            await store.append(Append(run_id=target, epoch=None, entries=[
                Entry(kind="value.recorded", name=me, data=str(i), at=float(i))]))
            await store.get_run("shared")
        await store.close()
        print("ok")

    asyncio.run(main())
    """
)


def test_two_processes_writing_one_database_never_see_locked(db_path: Path) -> None:
    """Two processes making many small appends to one file succeed, gap-free, never 'locked'."""
    count = 1000
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db_path), name, str(count)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("p1", "p2")
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:  # never leave a writer behind, whatever failed
            if p.poll() is None:
                p.kill()
                p.wait()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == "ok"
        assert "locked" not in err.lower()

    async def check() -> None:
        store = SQLiteStore(str(db_path))
        await store.open()
        try:
            shared = await store.journal("shared")
            assert [e.seq for e in shared] == list(range(count))
            for name in ("p1", "p2"):
                mine = [int(e.data or "-1") for e in shared if e.name == name]
                assert mine == list(range(0, count, 2))
                own = await store.journal(name)
                assert [e.seq for e in own] == list(range(count // 2))
        finally:
            await store.close()

    asyncio.run(check())


def test_wal_checkpoints_run_on_their_own_thread(
    call: Any, store: SQLiteStore, db_path: Path
) -> None:
    """Commits leave checkpoints to the checkpoint thread: the WAL is copied back into the
    file every EVERY commits (not by a commit past SQLite's 1,000 pages), the WAL starts
    over instead of growing, nothing is lost, and stopping the store stops the thread."""
    import os
    import sqlite3
    import threading

    from perdure.store import checkpoints

    call(store.create_run(new_run("r")))
    (claim,) = call(store.claim("w", 1.0, LEASE, 1, [WF]))
    epoch = claim.run.lease_epoch
    writes = checkpoints.EVERY * 10
    for position in range(writes):
        call(store.append(Append("r", epoch, [entry("step.intent", position)])))
    wal_pages = os.path.getsize(f"{db_path}-wal") // 4096
    assert wal_pages < writes  # restarted after a checkpoint (each write dirties ~2 pages)
    assert store._checkpoints is not None
    for _ in range(100):
        if store._checkpoints.done >= 2:
            break
        threading.Event().wait(0.05)
    assert store._checkpoints.done >= 2
    assert "perdure-checkpoint" in {t.name for t in threading.enumerate()}
    assert store._direct_db is not None
    backstop = store._direct_db.raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    assert backstop == checkpoints.BACKSTOP
    store.stop()
    assert "perdure-checkpoint" not in {t.name for t in threading.enumerate()}
    with sqlite3.connect(db_path) as conn:
        written = conn.execute("SELECT COUNT(*) FROM journal WHERE run_id = 'r'").fetchone()[0]
    assert written == writes
