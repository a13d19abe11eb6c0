"""A frozen ("zombie") worker that lost its lease can never write to the run again."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perdure.errors import LeaseLost
from perdure.store.base import Append, Entry
from waits import wait_for

LEASE = 1.5


def _journal_summary(entries: list[Entry]) -> str:
    return "\n".join(
        f"  seq={e.seq} pos={e.position} {e.kind} {e.name} epoch={e.epoch} worker={e.worker} "
        f"final={e.final} data={e.data}"
        for e in entries
    )


@pytest.mark.slow
def test_sigstopped_worker_is_fenced_after_takeover(
    tmp_path: Path, chaos_app: ModuleType, worker_pool: Any
) -> None:
    """Worker A, frozen mid-step past its lease, is replaced by B and nothing it writes lands."""
    workdir = tmp_path / "zombie"
    chaos_app.prepare(workdir)
    app = chaos_app.build_app(workdir)
    pool = worker_pool(workdir, concurrency=2, lease=LEASE)
    run_id = "zombie-1"

    def ledger(step: str, what: str, role: str) -> list[dict[str, Any]]:
        return [
            r
            for r in chaos_app.read_ledger(workdir)
            if r["run"] == run_id and r["step"] == step and r["what"] == what and r["role"] == role
        ]

    try:
        a = pool.spawn("A")
        app.start("zombie", run_id=run_id)
        wait_for(
            "worker A to enter its step", lambda: ledger("zombie_block", "enter", "A"), timeout=30
        )

        # A holds the run and is inside zombie_block; freeze it there.
        freeze_outside_transaction(a.pid, workdir / chaos_app.STORE_DB)
        stopped_at = time.monotonic()
        before = app.journal(run_id)
        a_entries = [e for e in before if e.worker is not None]
        assert a_entries, "A's work before the freeze should be durable:\n" + _journal_summary(
            before
        )
        a_worker = a_entries[0].worker
        a_epoch = a_entries[0].epoch
        assert a_worker is not None and f":{a.pid}:" in a_worker
        assert a_epoch is not None
        assert {(e.worker, e.epoch) for e in a_entries} == {(a_worker, a_epoch)}
        assert app.get_run(run_id).lease_owner == a_worker

        # B starts; it may claim the run only once A's lease has expired.
        b = pool.spawn("B")
        wait_for("worker B to take over", lambda: ledger("zombie_hold", "enter", "B"), timeout=30)
        took_over_after = time.monotonic() - stopped_at
        assert took_over_after >= LEASE * 0.5, f"B took over after only {took_over_after:.2f}s"
        mid = app.journal(run_id)
        recovered = [e for e in mid if e.kind == "run.recovered"]
        assert len(recovered) == 1, _journal_summary(mid)
        rec = recovered[0]
        rec_data = json.loads(rec.data or "{}")
        b_worker = rec_data["to"]
        assert f":{b.pid}:" in b_worker
        assert rec_data["from"] == a_worker
        assert rec.epoch == rec_data["epoch"] == a_epoch + 1
        run = app.get_run(run_id)
        assert (run.lease_owner, run.lease_epoch, run.recoveries) == (b_worker, a_epoch + 1, 1)
        assert ledger("zombie_block", "return", "B"), "B should have re-run zombie_block itself"

        # Wake A while B still holds the run with its own zombie_block outcome not yet flushed:
        # A's finished step now tries to record "A:<pid>" at the same position.
        (workdir / "release_a").touch()
        os.kill(a.pid, signal.SIGCONT)
        wait_for("A's step to return", lambda: ledger("zombie_block", "return", "A"), timeout=30)
        refusal = wait_for(
            "worker A to log that its write or lease was refused",
            lambda: _refusal_line(pool.log_text(a), run_id),
            timeout=30,
        )
        # Let A do anything else it would do (claim loop, heartbeat) before looking again.
        time.sleep(LEASE)
        after_wake = app.journal(run_id)
        late = [
            e
            for e in after_wake
            if e.seq > rec.seq and (e.worker == a_worker or e.epoch == a_epoch)
        ]
        assert not late, "zombie A wrote after the takeover:\n" + _journal_summary(late)
        assert app.get_run(run_id).lease_owner == b_worker
        assert a.poll() is None, "A should survive losing its lease, not crash"

        # B finishes the run.
        (workdir / "release_b").touch()
        result = app.handle(run_id).result(timeout=30)
        assert result["block"] == f"B:{b.pid}", result
        assert result["hold"] == f"B:{b.pid}", result
        assert (result["finish"]["role"], result["finish"]["pid"]) == ("B", b.pid)
        assert (result["prep"]["role"], result["prep"]["pid"]) == ("A", a.pid)

        final = app.journal(run_id)
        assert [e.seq for e in final] == list(range(len(final))), _journal_summary(final)
        after = [e for e in final if e.seq > rec.seq]
        assert all(e.epoch == a_epoch + 1 and e.worker == b_worker for e in after), (
            _journal_summary(after)
        )
        block_outcomes = [e for e in final if e.name == "zombie_block" and e.final]
        assert len(block_outcomes) == 1
        assert json.loads(block_outcomes[0].data or "{}")["value"] == f"B:{b.pid}"
        assert block_outcomes[0].worker == b_worker

        # The user table holds A's pre-takeover row and B's final row, and nothing else.
        rows = chaos_app_rows(workdir, chaos_app, run_id)
        assert rows == [("zombie_prep", "A", a.pid), ("zombie_finish", "B", b.pid)], rows

        # Fencing at the store: a write under A's epoch is refused even now.
        probe = Append(
            run_id=run_id,
            epoch=a_epoch,
            entries=[Entry(kind="zombie.probe", worker=a_worker, at=time.time())],
        )
        with pytest.raises(LeaseLost):
            app.runtime.sync(app.runtime.store.append(probe), "probe")
        assert all(e.kind != "zombie.probe" for e in app.journal(run_id))

        assert pool.stop(a) == 0, pool.log_text(a)
        assert pool.stop(b) == 0, pool.log_text(b)
        a_log = pool.log_text(a)
        assert "Traceback" not in a_log, a_log
        print(
            f"\nzombie: B took over {took_over_after:.2f}s after A froze "
            f"(lease {LEASE}s); A's refusal: {refusal.strip()}"
        )
    finally:
        pool.reap()  # first: a frozen worker holding the write lock would block close()
        app.close()


def freeze_outside_transaction(pid: int, db: Path) -> None:
    """SIGSTOP `pid` at a moment it does not hold SQLite's write lock (B must be able to write)."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        conn = sqlite3.connect(db, timeout=0.5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)  # froze mid-commit (a heartbeat): try again
            time.sleep(0.05)
        finally:
            conn.close()
    pytest.fail("could not freeze worker A outside a store transaction")


def _refusal_line(log: str, run_id: str) -> str | None:
    for line in log.splitlines():
        if run_id in line and ("lost the lease" in line or "refused" in line):
            return line
    return None


def chaos_app_rows(workdir: Path, chaos_app: ModuleType, run_id: str) -> list[tuple[str, str, int]]:
    with sqlite3.connect(workdir / chaos_app.STORE_DB) as conn:
        by_pos = {
            row[0]: row[1:]
            for row in conn.execute(
                f"SELECT id, pos, role, pid FROM {chaos_app.TX_TABLE} WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
        }
    names = {0: "zombie_prep", 4: "zombie_finish"}
    return [(names.get(pos, f"pos{pos}"), role, pid) for pos, role, pid in by_pos.values()]
