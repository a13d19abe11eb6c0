"""The SQL of the worker registry: each worker's host, pid, start, last sign of life, load.

Leases say which worker holds which run; this says which workers exist at all,
idle ones included, so an operator sees a worker that died (its heartbeat stops)
before any run of it is found stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .dialect import Db


@dataclass(slots=True)
class WorkerRow:
    """A worker as last reported: where it runs, since when, how busy, when last alive."""

    id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    concurrency: int
    running: int
    stopped_at: float | None = None
    clock_offset: float | None = None  # the store server's clock minus the host's (None: no server)


def beat(conn: Db, w: WorkerRow) -> None:
    """Register a worker, or record that it is alive and how many runs it holds."""
    conn.execute(
        "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, concurrency, running, "
        "clock_offset) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
        "heartbeat_at = excluded.heartbeat_at, running = excluded.running, stopped_at = NULL, "
        "clock_offset = excluded.clock_offset",
        (
            w.id,
            w.host,
            w.pid,
            w.started_at,
            w.heartbeat_at,
            w.concurrency,
            w.running,
            w.clock_offset,
        ),
    )


def register(conn: Db, w: WorkerRow, reusable: Callable[[WorkerRow], bool]) -> WorkerRow | None:
    """Register a starting worker under its id, unless the worker already registered under
    that id is not `reusable` (alive, as far as can be told): then return that one.

    The existing row is locked (PostgreSQL) so two workers starting under one id at once
    cannot both take it; SQLite writes one transaction at a time anyway.
    """
    cur = conn.execute(
        "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, concurrency, running) "
        "VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING",
        (w.id, w.host, w.pid, w.started_at, w.heartbeat_at, w.concurrency),
    )
    if cur.rowcount == 1:
        return None
    lock = " FOR UPDATE" if conn.dialect == "postgres" else ""
    row = conn.execute(
        "SELECT id, host, pid, started_at, heartbeat_at, concurrency, running, stopped_at "
        f"FROM workers WHERE id = ?{lock}",
        (w.id,),
    ).fetchone()
    if row is not None and not reusable(WorkerRow(*row)):
        return WorkerRow(*row)
    conn.execute(
        "UPDATE workers SET host = ?, pid = ?, started_at = ?, heartbeat_at = ?, "
        "concurrency = ?, running = 0, stopped_at = NULL WHERE id = ?",
        (w.host, w.pid, w.started_at, w.heartbeat_at, w.concurrency, w.id),
    )
    return None


def stopped(conn: Db, worker_id: str, now: float) -> None:
    conn.execute("UPDATE workers SET stopped_at = ?, running = 0 WHERE id = ?", (now, worker_id))


def list_workers(conn: Db, since: float) -> list[WorkerRow]:
    """Workers alive or stopped since `since` (older rows are history), newest first."""
    rows = conn.execute(
        "SELECT id, host, pid, started_at, heartbeat_at, concurrency, running, stopped_at, "
        "clock_offset FROM workers WHERE heartbeat_at >= ? OR stopped_at >= ? "
        "ORDER BY started_at DESC",
        (since, since),
    ).fetchall()
    return [WorkerRow(*r) for r in rows]
