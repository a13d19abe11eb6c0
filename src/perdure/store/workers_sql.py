"""The SQL of the worker registry: each worker's host, pid, start, last sign of life, load.

Leases say which worker holds which run; this says which workers exist at all,
idle ones included, so an operator sees a worker that died (its heartbeat stops)
before any run of it is found stuck. It also keeps what proves a worker dead
before its leases end: its process identity, and on PostgreSQL the key of the
session lock it holds for its life.
"""

from __future__ import annotations

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
    proc: str | None = None  # "boot id/pid namespace/start ticks" of its process (None: unknown)
    lock_key: int | None = None  # its PostgreSQL session lock (None: none held, or SQLite)


_COLUMNS = (
    "id, host, pid, started_at, heartbeat_at, concurrency, running, stopped_at, clock_offset, "
    "proc, lock_key"
)
# the server's start, as recorded with a lock: a restart frees every lock, proving nothing
_SERVER_LIFE = "CAST(EXTRACT(EPOCH FROM pg_postmaster_start_time()) AS DOUBLE PRECISION)"


def beat(conn: Db, row: WorkerRow) -> None:
    """Register a worker, or record that it is alive and how many runs it holds, or (with
    `row.stopped_at`) that it stopped."""
    if row.stopped_at is not None:
        conn.execute(
            "UPDATE workers SET stopped_at = ?, running = 0 WHERE id = ?", (row.stopped_at, row.id)
        )
        return
    conn.execute(
        "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, concurrency, running, "
        "clock_offset, proc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
        "heartbeat_at = excluded.heartbeat_at, running = excluded.running, stopped_at = NULL, "
        "clock_offset = excluded.clock_offset",
        (
            row.id,
            row.host,
            row.pid,
            row.started_at,
            row.heartbeat_at,
            row.concurrency,
            row.running,
            row.clock_offset,
            row.proc,
        ),
    )


def register(conn: Db, row: WorkerRow, replaces: WorkerRow | None = None) -> WorkerRow | None:
    """Register a starting worker under its id; None once registered. If a worker is
    registered under that id already, it is replaced only if it is still the life
    `replaces` describes (the caller judged that one stopped or dead: same pid, start,
    last beat and stop); else that worker's row is returned and nothing changes.

    The existing row is locked (PostgreSQL) so two workers starting under one id at once
    cannot both take it; SQLite writes one transaction at a time anyway.
    """
    cur = conn.execute(
        "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, concurrency, running, "
        "proc) VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT (id) DO NOTHING",
        (row.id, row.host, row.pid, row.started_at, row.heartbeat_at, row.concurrency, row.proc),
    )
    if cur.rowcount == 1:
        return None
    lock = " FOR UPDATE" if conn.dialect == "postgres" else ""
    found = conn.execute(
        f"SELECT {_COLUMNS} FROM workers WHERE id = ?{lock}",
        (row.id,),
    ).fetchone()
    if found is not None and not _same_life(WorkerRow(*found), replaces):
        return WorkerRow(*found)
    conn.execute(
        "UPDATE workers SET host = ?, pid = ?, started_at = ?, heartbeat_at = ?, "
        "concurrency = ?, running = 0, stopped_at = NULL, proc = ?, lock_key = NULL, "
        "lock_server = NULL WHERE id = ?",
        (row.host, row.pid, row.started_at, row.heartbeat_at, row.concurrency, row.proc, row.id),
    )
    return None


def _same_life(found: WorkerRow, seen: WorkerRow | None) -> bool:
    """Whether the registered `found` is still the worker's life the caller saw (`seen`)."""
    if seen is None:
        return False
    life = ("host", "pid", "started_at", "heartbeat_at", "stopped_at")
    return all(getattr(found, f) == getattr(seen, f) for f in life)


def list_workers(conn: Db, since: float) -> list[WorkerRow]:
    """Workers alive or stopped since `since` (older rows are history), newest first."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM workers WHERE heartbeat_at >= ? OR stopped_at >= ? "
        "ORDER BY started_at DESC",
        (since, since),
    ).fetchall()
    return [WorkerRow(*r) for r in rows]


def release_worker(conn: Db, row: WorkerRow, now: float) -> int:
    """Hand back every live lease of the dead worker `row`, for immediate recovery; how many.

    Only while the registry still describes the same life of that worker (pid, start and
    session lock): a new worker that took its id since, or a live one that took a new
    lock after its session was cut, keeps its runs.
    """
    cur = conn.execute(
        "UPDATE runs SET lease_until = 0 WHERE lease_owner = ? AND lease_until > ? "
        "AND status IN ('running', 'cancelling') AND EXISTS (SELECT 1 FROM workers "
        "WHERE id = ? AND pid = ? AND started_at = ? AND COALESCE(lock_key, -1) = ?)",
        (
            row.id,
            now,
            row.id,
            row.pid,
            row.started_at,
            -1 if row.lock_key is None else row.lock_key,
        ),
    )
    if cur.rowcount:
        conn.notify()  # claimable at once, by any worker
    return int(cur.rowcount)


def lock_namespace(schema: str) -> str:
    """What names a schema's worker session locks (hashed by the server: its first key)."""
    return f"perdure-worker:{schema}"


def take_lock(conn: Db, schema: str, w: WorkerRow, key: int) -> bool:
    """PostgreSQL: take session lock `key` on this connection for the worker `w` and record
    it (with the server's start) in the registry, unless another life of that id registered
    since; False if that key is someone else's."""
    got = conn.execute(
        "SELECT pg_try_advisory_lock(hashtext(?), ?)", (lock_namespace(schema), key)
    ).fetchone()
    if not got or not got[0]:
        return False
    conn.execute(
        f"UPDATE workers SET lock_key = ?, lock_server = {_SERVER_LIFE} "
        "WHERE id = ? AND pid = ? AND started_at = ?",
        (key, w.id, w.pid, w.started_at),
    )
    return True


def sessions_gone(conn: Db, schema: str, me: str, since: float) -> list[WorkerRow]:
    """PostgreSQL: the unstopped workers (but `me`) seen since `since` whose session lock, taken
    since the server last started, nobody holds now: their session ended (the process
    died, or the server cut its connection). The probe takes each lock for a moment only
    (transaction-scoped)."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM (SELECT {_COLUMNS} FROM workers WHERE id <> ? "
        "AND heartbeat_at >= ? AND stopped_at IS NULL AND lock_key IS NOT NULL "
        f"AND lock_server = {_SERVER_LIFE} OFFSET 0) AS held "
        "WHERE pg_try_advisory_xact_lock(hashtext(?), lock_key)",
        (me, since, lock_namespace(schema)),
    ).fetchall()
    return [WorkerRow(*r) for r in rows]
