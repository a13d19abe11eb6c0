"""The store's SQL, as functions of an open connection inside the caller's transaction.

Each function is one store operation; the SQLite store runs them on its thread,
inside a savepoint of a shared transaction. Statements use `?` placeholders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from ..errors import LeaseLost, RunNotFound, StoreError
from .base import (
    CANCELLED,
    CANCELLING,
    FINISHED,
    PAUSED,
    PENDING,
    RUNNING,
    SLEEPING,
    TERMINAL,
    WAITING,
    Append,
    AppendResult,
    Blob,
    Claim,
    Claims,
    Entry,
    EventRow,
    LeaseState,
    NewRun,
    OperatorRequest,
    QueueSpec,
    RunRow,
    TxBody,
)
from .blobs import blob_ref, in_row_or_blob
from .dialect import ENDED, Db
from .names import check, check_run_id
from .versions_sql import PARKED_FOR_VERSION, Routing, newer_live, routing_clause

Conn = Db

_RUN_COLUMNS = (
    "id, workflow, status, input, code_version, result, error, parent_id, created_at, "
    "updated_at, wake_at, deadline_at, waiting_for, lease_owner, lease_until, lease_epoch, "
    "recoveries, pause_requested, queue, priority, partition_key, started_at"
)  # next_seq is the store's own bookkeeping, not part of RunRow
_SETTABLE = frozenset(
    {
        "result",
        "error",
        "wake_at",
        "waiting_for",
        "lease_owner",
        "lease_until",
        "deadline_at",
        "pause_requested",
        "updated_at",
        "code_version",  # a run upgraded to the claimer's code (engine/versions.py)
        "version_checked",  # the version whose check found the run incompatible
    }
)
_RUN_FIELDS = tuple(name.strip() for name in _RUN_COLUMNS.split(","))


def _run(row: Any) -> RunRow:
    values = dict(zip(_RUN_FIELDS, tuple(row), strict=True))
    values["pause_requested"] = bool(values["pause_requested"])
    return RunRow(**values)


def _in(values: Sequence[str]) -> str:
    return ",".join("?" * len(values))


def get_run(conn: Conn, run_id: str) -> RunRow | None:
    row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
    return _run(row) if row else None


def _must_get(conn: Conn, run_id: str) -> RunRow:
    run = get_run(conn, run_id)
    if run is None:
        raise RunNotFound(run_id)
    return run


def list_runs(
    conn: Conn,
    *,
    statuses: Sequence[str] = (),
    workflow: str | None = None,
    parent_id: str | None = None,
    limit: int = 100,
    after: tuple[float, str] | None = None,
    ids: Sequence[str] = (),
) -> list[RunRow]:
    """Newest first (ties by id); `after` = (created_at, id) of the last run of a page;
    `ids` keeps only those runs."""
    where: list[str] = []
    params: list[Any] = []
    if ids:
        where.append(f"id IN ({_in(ids)})")
        params.extend(ids)
    if statuses:
        where.append(f"status IN ({_in(statuses)})")
        params.extend(statuses)
    if workflow:
        where.append("workflow = ?")
        params.append(workflow)
    if parent_id:
        where.append("parent_id = ?")
        params.append(parent_id)
    if after is not None:
        where.append("(created_at < ? OR (created_at = ? AND id > ?))")
        params.extend([after[0], after[0], after[1]])
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    params.append(limit)
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs {clause} ORDER BY created_at DESC, id LIMIT ?", params
    ).fetchall()
    return [_run(r) for r in rows]


def count_runs(conn: Conn) -> dict[str, int]:
    rows = conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
    return {r[0]: r[1] for r in rows}


def journal(conn: Conn, run_id: str, after: int = -1, limit: int = -1) -> list[Entry]:
    """A run's entries with seq above `after`, in order; at most `limit` (-1: all)."""
    bounded = " LIMIT ?" if limit >= 0 else ""
    rows = conn.execute(
        "SELECT seq, position, kind, name, data, attempt, final, at, epoch, worker "
        f"FROM journal WHERE run_id = ? AND seq > ? ORDER BY seq{bounded}",
        (run_id, after, limit) if limit >= 0 else (run_id, after),
    ).fetchall()
    # positional: a long journal is built three times faster than with keywords
    return [Entry(r[2], r[3], r[1], r[4], r[5], r[6] == 1, r[7], r[0], r[8], r[9]) for r in rows]


_NEXT_IN_JOURNAL = "(SELECT COALESCE(MAX(j.seq) + 1, 0) FROM journal AS j WHERE j.run_id = runs.id)"


def next_seq(conn: Conn) -> str:
    """SQL for the next journal seq of the run `runs` names in the statement (see
    `Db.tail_on_run`): its reservation on the row, or one past the journal's last entry."""
    return "runs.next_seq" if conn.tail_on_run else _NEXT_IN_JOURNAL


def _allocate(conn: Conn, run_id: str, count: int) -> int:
    """Reserve `count` journal sequence numbers for a run; return the first."""
    params: tuple[Any, ...]
    if conn.tail_on_run:  # the row names the seq after the reserved ones
        text, params, reserved = _RESERVE_SEQS, (count, run_id), count
    else:  # SQLite: its write lock keeps every other writer out until this one commits
        text, params, reserved = f"SELECT {next_seq(conn)} FROM runs WHERE id = ?", (run_id,), 0
    row = conn.execute(text, params).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    return int(row[0]) - reserved


_RESERVE_SEQS = "UPDATE runs SET next_seq = next_seq + ? WHERE id = ? RETURNING next_seq"
_ENTRY_COLUMNS = "run_id, seq, position, kind, name, data, attempt, final, at, epoch, worker"
_ENTRY_VALUES = _in(_ENTRY_COLUMNS.split(","))
_INSERT_ENTRIES = f"INSERT INTO journal ({_ENTRY_COLUMNS}) VALUES ({_ENTRY_VALUES})"
_INSERT_KEYED_ENTRIES = (  # SQLite: the last entry of a write names it (see _landed)
    f"INSERT INTO journal ({_ENTRY_COLUMNS}, write_key) VALUES ({_ENTRY_VALUES}, ?)"
)


def _insert_entries(
    conn: Conn,
    run_id: str,
    entries: Sequence[Entry],
    epoch: int | None,
    first_seq: int | None = None,
    key: str | None = None,
) -> None:
    """Append entries at the next sequence numbers (gap-free: see `next_seq`); on SQLite
    the last one keeps the write's `key` (see `_landed`)."""
    seq = (_allocate(conn, run_id, len(entries)) if first_seq is None else first_seq) - 1
    keyed = not conn.tail_on_run
    text, unkeyed = (_INSERT_KEYED_ENTRIES, (None,)) if keyed else (_INSERT_ENTRIES, ())
    params: list[tuple[Any, ...]] = []
    for e in entries:
        seq += 1
        params.append(
            (
                run_id,
                seq,
                e.position,
                e.kind,
                e.name,
                e.data,
                e.attempt,
                int(e.final),
                e.at,
                epoch if epoch is not None else e.epoch,
                e.worker,
                *unkeyed,
            )
        )
    if keyed and params:
        params[-1] = (*params[-1][:-1], key)
    try:
        conn.executemany(text, params)
    except conn.integrity_errors as exc:
        raise StoreError(
            f"run {run_id!r}: journal position already has an outcome ({exc})"
        ) from None


def _insert_blobs(conn: Conn, blobs: Sequence[Blob]) -> None:
    for blob in blobs:
        conn.execute(
            # an upsert, not DO NOTHING: it holds the row, so gc cannot delete a blob that
            # this transaction is about to name (retention.py skips held blobs)
            "INSERT INTO blobs (key, data) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET key = excluded.key",
            (blob.key, blob.data),
        )


_NEW_RUN_COLUMNS = (
    "id, workflow, status, input, code_version, parent_id, created_at, updated_at, deadline_at, "
    "queue, priority, partition_key, lease_owner, lease_until, lease_epoch, started_at"
)  # what a new run's INSERT sets (create_run and its one-statement form)
_NEW_RUN_FIELDS = tuple(name.strip() for name in _NEW_RUN_COLUMNS.split(","))  # RunRow's names


def create_run(conn: Conn, new: NewRun) -> tuple[RunRow, bool]:
    """Create the run, or find it (False: it existed). With `new.lease`, created claimed by
    that worker (epoch 1, as a first claim leaves it) unless it or the workflow is paused."""
    check_run_id(new.id), check(new.queue, "queue name")  # every run enters here
    if plain_create(new) and conn.fused_append:
        return _create_fused(conn, new)
    owner, until = new.lease if new.lease is not None else (None, None)
    if owner is not None:
        stopped, paused = _pauses(conn, owner)
        if stopped is not None or new.workflow in paused:
            owner = until = None  # pending: claimed once the pause is lifted
    row = _created_row(new, owner, until)
    cur = conn.execute(
        f"INSERT INTO runs ({_NEW_RUN_COLUMNS}) VALUES ({_in(_NEW_RUN_FIELDS)}) "
        "ON CONFLICT(id) DO NOTHING",
        tuple(getattr(row, name) for name in _NEW_RUN_FIELDS),
    )
    if cur.rowcount != 1:
        return _must_get(conn, new.id), False
    if owner is None:  # a run created claimed is nobody else's work
        conn.notify()
    if new.entries and conn.tail_on_run:
        conn.execute("UPDATE runs SET next_seq = ? WHERE id = ?", (len(new.entries), new.id))
    _insert_blobs(conn, new.blobs)
    if new.entries:
        _insert_entries(conn, new.id, new.entries, None, 0)
    return row, True


def _created_row(new: NewRun, owner: str | None, until: float | None) -> RunRow:
    """The row `create_run` inserts, as a read of it would return it (no read needed: a
    contract test holds the two equal); claimed by `owner` unless it is None."""
    return RunRow(
        id=new.id,
        workflow=new.workflow,
        status=PENDING if owner is None else RUNNING,
        input=new.input,
        code_version=new.code_version,
        parent_id=new.parent_id,
        created_at=new.now,
        updated_at=new.now,
        deadline_at=new.deadline_at,
        lease_owner=owner,
        lease_until=until,
        lease_epoch=0 if owner is None else 1,
        queue=new.queue,
        priority=new.priority,
        partition_key=new.partition_key,
        started_at=None if owner is None else new.now,
    )


def plain_create(new: NewRun) -> bool:
    """A run created with no journal entries or blobs: one statement where the store fuses."""
    return not new.entries and not new.blobs


_HELD = "CASE WHEN p.held THEN NULL ELSE CAST(? AS {}) END"


def _create_fused(conn: Conn, new: NewRun) -> tuple[RunRow, bool]:
    """PostgreSQL: `create_run` as one statement (the pause read, the INSERT and its NOTIFY),
    so a start on its own is one round trip in autocommit, not BEGIN, read, insert, COMMIT."""
    owner, until = new.lease if new.lease is not None else (None, None)
    row = conn.execute(
        "WITH p AS (SELECT CAST(? AS TEXT) IS NULL OR EXISTS (SELECT 1 FROM pauses WHERE "
        f"(scope = 'workflow' AND name = ?) OR {_WORKER_PAUSED}) AS held), "
        f"ins AS (INSERT INTO runs ({_NEW_RUN_COLUMNS}) SELECT CAST(? AS TEXT), CAST(? AS TEXT), "
        "CASE WHEN p.held THEN 'pending' ELSE 'running' END, CAST(? AS TEXT), CAST(? AS TEXT), "
        "CAST(? AS TEXT), CAST(? AS DOUBLE PRECISION), CAST(? AS DOUBLE PRECISION), "
        "CAST(? AS DOUBLE PRECISION), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS TEXT), "
        f"{_HELD.format('TEXT')}, {_HELD.format('DOUBLE PRECISION')}, "
        "CASE WHEN p.held THEN 0 ELSE 1 END, "
        f"{_HELD.format('DOUBLE PRECISION')} FROM p "
        f"ON CONFLICT (id) DO NOTHING RETURNING {_RUN_COLUMNS}) "
        f"SELECT {_RUN_COLUMNS}, CASE WHEN status = 'pending' THEN pg_notify(?, '') END FROM ins",
        (
            owner, new.workflow, *_worker_names(owner or ""),  # no owner: held, unread
            new.id, new.workflow, new.input, new.code_version, new.parent_id, new.now, new.now,
            new.deadline_at, new.queue, new.priority, new.partition_key,
            owner, until, new.now,
            conn.channel,
        ),
    ).fetchone()  # fmt: skip
    if row is None:  # it existed
        return _must_get(conn, new.id), False
    return _run(row[:-1]), True


def _wake_condition_met(conn: Conn, run_id: str, waiting_for: str | None) -> bool:
    """True when what a run is about to wait for has already happened (no lost wake-up)."""
    if not waiting_for:
        return False
    kind, _, name = waiting_for.partition(":")
    if kind == "event":
        row = conn.execute(
            "SELECT 1 FROM events WHERE run_id = ? AND name = ? AND consumed_at IS NULL LIMIT 1",
            (run_id, name),
        ).fetchone()
        return row is not None
    if kind == "child":
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (name,)).fetchone()
        return row is not None and row[0] in TERMINAL
    return False


class Fenced(NamedTuple):
    """A fenced run's state, and the run columns still to set with the write's own (SQLite:
    the seq reservation, in the one UPDATE)."""

    status: str
    pause_requested: bool
    parent_id: str | None
    first_seq: int
    later: dict[str, Any]
    partition_key: str | None


def _fence(conn: Conn, a: Append, fields: dict[str, Any]) -> Fenced:
    """Check the lease epoch and reserve journal seqs in one statement; the run's state.

    `updated_at` moves only with the status: an indexed column left alone lets
    PostgreSQL update the row in place (HOT) for every plain step append.
    """
    count = len(a.entries)
    stamp = fields.pop("updated_at", None)
    if a.status is None and not fields:
        stamp = None
    if not conn.tail_on_run:
        return _fence_sqlite(conn, a, stamp)
    row = conn.execute(
        "UPDATE runs SET next_seq = next_seq + ?, updated_at = COALESCE(?, updated_at), "
        "last_append = COALESCE(CAST(? AS TEXT), last_append) "
        "WHERE id = ? AND (CAST(? AS INTEGER) IS NULL OR lease_epoch = ?) "
        "AND NOT (CAST(? AS INTEGER) = 1 AND (status = 'cancelling' OR pause_requested > 0)) "
        "RETURNING status, pause_requested, parent_id, next_seq, partition_key",
        (
            count,
            stamp,
            a.key,
            a.run_id,
            a.epoch,
            a.epoch,
            int(a.stop_if_requested),
        ),
    ).fetchone()
    if row is None:
        _refuse(conn, a)
    return Fenced(row[0], bool(row[1]), row[2], int(row[3]) - count, {}, row[4])


def _fence_sqlite(conn: Conn, a: Append, stamp: float | None) -> Fenced:
    """SQLite's fence: a read; the columns that change are set later, in the write's one
    UPDATE of the run (none for a write with no status: its seqs and key are the journal's).

    The write lock is held from BEGIN IMMEDIATE, so reading first is as atomic as one
    statement, and ~5x cheaper: SQLite's RETURNING materialises its rows, and naming an
    indexed column in SET (updated_at, even set to itself) rewrites its index entries.
    """
    row = conn.execute(
        f"SELECT status, pause_requested, parent_id, {next_seq(conn)}, lease_epoch, "
        "partition_key FROM runs WHERE id = ?",
        (a.run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFound(a.run_id)
    status, pause_requested, parent_id, first, epoch, partition_key = row
    _check_fence(a, epoch, status, pause_requested)
    later: dict[str, Any] = {}
    if stamp is not None:
        later["updated_at"] = stamp
    return Fenced(status, bool(pause_requested), parent_id, int(first), later, partition_key)


def _check_fence(a: Append, epoch: int, status: str, pause_requested: int) -> None:
    """Refuse `a` if its lease was lost, or if it stops at an operator's cancel or pause."""
    if a.epoch is not None and epoch != a.epoch:
        raise LeaseLost(a.run_id, a.epoch)
    if a.stop_if_requested and (status == CANCELLING or pause_requested > 0):
        raise OperatorRequest(cancel=status == CANCELLING, pause=bool(pause_requested))


def _refuse(conn: Conn, a: Append) -> NoReturn:
    """Why the fence matched no row: no such run, a lost lease, or an operator request."""
    state = conn.execute(
        "SELECT lease_epoch, status, pause_requested FROM runs WHERE id = ?", (a.run_id,)
    ).fetchone()
    if state is None:
        raise RunNotFound(a.run_id)
    _check_fence(a, state[0], state[1], state[2])
    raise OperatorRequest(cancel=state[1] == CANCELLING, pause=bool(state[2]))


_STAMP = frozenset({"updated_at"})


def plain_append(a: Append) -> bool:
    """Entries only (no status, fields, runs, blobs, event or body): the common step write."""
    return (
        bool(a.entries)
        and a.status is None
        and a.fields.keys() <= _STAMP  # not stamped without a status
        and not a.new_runs
        and not a.blobs
        and a.consume_event is None
        and a.expect_status is None
        and not a.retry
    )


_RUN_ROW = (
    "(CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS INTEGER), CAST(? AS INTEGER), CAST(? AS TEXT))"
)
_ENTRY_ROW = (
    "(CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS INTEGER), CAST(? AS TEXT), "
    "CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS INTEGER), "
    "CAST(? AS DOUBLE PRECISION), CAST(? AS INTEGER), CAST(? AS TEXT))"
)


def append_plain(conn: Conn, appends: Sequence[Append]) -> list[AppendResult | Exception]:
    """Plain appends of distinct runs as one statement: fences, seq reservations, inserts.

    One statement is its own transaction, so a lone step write costs one round trip
    and a batch of many runs' step writes one more (PostgreSQL only: SQLite has no
    data-modifying CTEs). A run whose fence refuses gets its exception in its place;
    a unique violation fails the whole statement (the caller retries one by one).
    """
    params: list[Any] = []
    for a in appends:
        params += [a.run_id, len(a.entries), a.epoch, int(a.stop_if_requested), a.key]
    rows = []
    for a in appends:
        for i, e in enumerate(a.entries):
            epoch = a.epoch if a.epoch is not None else e.epoch
            params += [a.run_id, i, e.position, e.kind, e.name, e.data, e.attempt, int(e.final)]
            params += [e.at, epoch, e.worker]
            rows.append(_ENTRY_ROW)
    text = (
        "WITH v (run_id, n, epoch, stop, key) AS (VALUES "
        + ", ".join([_RUN_ROW] * len(appends))
        + "), f AS (UPDATE runs AS r SET next_seq = r.next_seq + v.n, "
        "last_append = COALESCE(v.key, r.last_append) FROM v "
        "WHERE r.id = v.run_id AND (v.epoch IS NULL OR r.lease_epoch = v.epoch) "
        "AND NOT (v.stop = 1 AND (r.status = 'cancelling' OR r.pause_requested > 0)) "
        "RETURNING r.id, r.status, r.pause_requested, r.next_seq - v.n AS first), "
        "e (run_id, i, position, kind, name, data, attempt, final, at, epoch, worker) AS (VALUES "
        + ", ".join(rows)
        + "), ins AS (INSERT INTO journal (run_id, seq, position, kind, name, data, attempt, "
        "final, at, epoch, worker) SELECT e.run_id, f.first + e.i, e.position, e.kind, e.name, "
        "e.data, e.attempt, e.final, e.at, e.epoch, e.worker FROM f JOIN e ON e.run_id = f.id) "
        "SELECT id, status, pause_requested FROM f"
    )
    try:
        found = {row[0]: row for row in conn.execute(text, params).fetchall()}
    except conn.integrity_errors as exc:
        names = ", ".join(repr(a.run_id) for a in appends)
        raise StoreError(f"run {names}: journal position already has an outcome ({exc})") from None
    results: list[AppendResult | Exception] = []
    for a in appends:
        row = found.get(a.run_id)
        if row is None:
            try:
                _refuse(conn, a)
            except Exception as exc:
                results.append(exc)
            continue
        results.append(
            AppendResult(
                status=row[1], cancel_requested=row[1] == CANCELLING, pause_requested=bool(row[2])
            )
        )
    return results


def _landed(conn: Conn, a: Append, body: bool = False) -> AppendResult | None:
    """A retried write whose first try landed (its key is the run's last, or on SQLite on
    an entry of its journal): what it found then, as far as the run still says (a
    transactional body's result from its entry)."""
    row = conn.execute(
        "SELECT last_append, status, pause_requested FROM runs WHERE id = ?", (a.run_id,)
    ).fetchone()
    if row is None:
        return None
    if row[0] != a.key and not (
        _entry_landed(conn, a) if conn.tail_on_run else _keyed_entry(conn, a)
    ):
        return None
    tx_data = None
    if body and a.entries:
        last = a.entries[-1]
        found = conn.execute(
            "SELECT data FROM journal WHERE run_id = ? AND position = ? "
            "AND kind = ? AND attempt = ? ORDER BY seq DESC LIMIT 1",
            (a.run_id, last.position, last.kind, last.attempt),
        ).fetchone()
        tx_data = found[0] if found else None
        key = blob_ref(tx_data)
        if key is not None:
            tx_data = get_blob(conn, key)
    return AppendResult(
        status=row[1],
        cancel_requested=row[1] == CANCELLING,
        pause_requested=bool(row[2]),
        tx_data=tx_data,
    )


def _entry_landed(conn: Conn, a: Append) -> bool:
    """PostgreSQL: the first entry of `a` is in the run's journal (so all of `a` landed, in
    one transaction), though a later write of the run took `last_append` (two writes of one
    run held through one outage). An entry is told by its kind, position, attempt, worker
    and time of writing."""
    if not a.entries:
        return False
    e = a.entries[0]
    found = conn.execute(
        "SELECT 1 FROM journal WHERE run_id = ? AND kind = ? AND at = ? AND attempt = ? "
        "AND position IS NOT DISTINCT FROM CAST(? AS INTEGER) "
        "AND worker IS NOT DISTINCT FROM CAST(? AS TEXT) LIMIT 1",
        (a.run_id, e.kind, e.at, e.attempt, e.position, e.worker),
    ).fetchone()
    return found is not None


def _keyed_entry(conn: Conn, a: Append) -> bool:
    """SQLite: an entry of the run's journal carries `a.key` (a scan of one run's journal
    from its end, done only for a write sent again after a lost connection)."""
    found = conn.execute(
        "SELECT 1 FROM journal WHERE run_id = ? AND write_key = ? ORDER BY seq DESC LIMIT 1",
        (a.run_id, a.key),
    ).fetchone()
    return found is not None


def append(conn: Conn, append: Append) -> AppendResult:
    """One run's write: its entries, status and fields, fenced by the lease epoch."""
    return _append(conn, append, None)


def append_with_body(conn: Conn, append: Append, body: TxBody) -> AppendResult:
    """`append` whose last entry is the outcome of `body`, run in the same transaction (a
    transactional step, continue_as_new's hand-over): `body(raw connection)` returns that
    entry's data (JSON text). A body that raises is undone, its entry left out and its error
    given back in the result (`tx_error`); the rest of the write lands. Reached through the
    store's one generic entry, `run_sql` (the store's methods take rows, not functions)."""
    return _append(conn, append, body)


def _append(conn: Conn, append: Append, body: TxBody | None) -> AppendResult:
    if append.retry and append.key is not None:
        landed = _landed(conn, append, body is not None)
        if landed is not None:
            return landed
    plain = body is None and plain_append(append)
    if plain and conn.fused_append:
        [result] = append_plain(conn, [append])
        if isinstance(result, Exception):
            raise result
        return result
    if plain and not conn.tail_on_run:
        return _append_entries(conn, append)
    fields = dict(append.fields)
    current, pause_requested, parent_id, first_seq, later, partition = _fence(conn, append, fields)
    if append.expect_status is not None and current not in append.expect_status:
        raise StoreError(
            f"run {append.run_id!r} is {current}; expected {' or '.join(append.expect_status)}"
        )
    status = append.status
    if status is not None:
        if current == CANCELLING and status not in TERMINAL and append.epoch is not None:
            status = CANCELLING
        elif status == WAITING and _wake_condition_met(
            conn, append.run_id, fields.get("waiting_for")
        ):
            status = PENDING
        if pause_requested and status in (SLEEPING, WAITING, PENDING) and append.epoch is not None:
            status = PAUSED
    _insert_blobs(conn, append.blobs)
    tx_data, tx_error = None, None
    entries = list(append.entries)
    if body is not None:
        conn.execute("SAVEPOINT tx_body")
        try:
            conn.user_scope()
            tx_data = body(conn.raw)
        except Exception as exc:  # the user's transaction failed: undo it, keep the rest
            conn.execute("ROLLBACK TO tx_body")
            tx_error = exc
            entries = entries[:-1]
            status = None
            if conn.tail_on_run:  # give back the seq its entry reserved
                conn.execute(
                    "UPDATE runs SET next_seq = next_seq - 1 WHERE id = ?", (append.run_id,)
                )
        else:
            stored = tx_data
            if append.blob_threshold is not None:
                stored, blob = in_row_or_blob(tx_data, append.blob_threshold)
                _insert_blobs(conn, [blob] if blob else [])
            entries[-1].data = stored
        conn.execute("RELEASE tx_body")
    if entries:
        _insert_entries(conn, append.run_id, entries, append.epoch, first_seq, append.key)
    elif append.key is not None and not conn.tail_on_run:
        later["last_append"] = append.key  # no entry to carry it
    if append.consume_event is not None:
        cur = conn.execute(
            "UPDATE events SET consumed_at = ? WHERE id = ? AND consumed_at IS NULL",
            (entries[-1].position if entries else -1, append.consume_event),
        )
        if cur.rowcount != 1:
            raise StoreError(
                f"run {append.run_id!r}: event {append.consume_event} was already consumed"
            )
    for new in append.new_runs:
        create_run(conn, new)
    sets = [f"{key} = ?" for key in later]
    params: list[Any] = list(later.values())
    if status is not None:
        sets.append("status = ?")
        params.append(status)
    for key, value in fields.items():
        if key not in _SETTABLE:
            raise StoreError(f"run field {key!r} cannot be set")
        sets.append(f"{key} = ?")
        params.append(value)
    # a worker may claim it (a parent woke, or a partition came free); else, for an end,
    # its result's waiters read it and there is nothing new to claim
    work = status == PENDING or (status in TERMINAL and bool(parent_id or partition))
    notice = "" if work else ENDED if status in TERMINAL else None
    if sets:
        params.append(append.run_id)
        told, told_params = ("", ()) if notice is None else conn.notifying(notice == ENDED)
        conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?{told}",
                     [*params, *told_params])  # fmt: skip
        if told:
            notice = None  # sent with the UPDATE (the fence found the run: it updates one row)
    if status in TERMINAL and parent_id:
        _wake_parent(conn, append.run_id, parent_id)
    if notice is not None:
        conn.notify(ended=notice == ENDED)
    final_status = status if status is not None else current
    return AppendResult(
        status=final_status,
        cancel_requested=current == CANCELLING or final_status == CANCELLING,
        pause_requested=pause_requested or bool(fields.get("pause_requested")),
        tx_data=tx_data,
        tx_error=tx_error,
    )


_TAIL_FENCE = (
    f"SELECT status, pause_requested, {_NEXT_IN_JOURNAL}, lease_epoch FROM runs WHERE id = ?"
)


def _append_entries(conn: Conn, a: Append) -> AppendResult:
    """SQLite's plain append (a step's write: entries only), the most common write: the
    fence read (which finds the next seq) and the inserts, the last naming the write. The
    run's row is not written: a step's commit changes the journal's pages only."""
    row = conn.execute(_TAIL_FENCE, (a.run_id,)).fetchone()
    if row is None:
        raise RunNotFound(a.run_id)
    status, pause_requested, first, epoch = row
    _check_fence(a, epoch, status, pause_requested)
    _insert_entries(conn, a.run_id, a.entries, a.epoch, first, a.key)
    return AppendResult(status, status == CANCELLING, bool(pause_requested))


def _wake_parent(conn: Conn, run_id: str, parent_id: str | None = None) -> None:
    """Make a parent waiting on this (now finished) child runnable again."""
    if parent_id is None:
        row = conn.execute("SELECT parent_id FROM runs WHERE id = ?", (run_id,)).fetchone()
        parent_id = row[0] if row else None
    if parent_id:
        conn.execute(
            "UPDATE runs SET status = ? WHERE id = ? AND status = ? AND waiting_for = ?",
            (PENDING, parent_id, WAITING, f"child:{run_id}"),
        )


def claim(
    conn: Conn,
    owner: str,
    now: float,
    lease_seconds: float,
    limit: int,
    workflows: Sequence[str],
    queues: Sequence[QueueSpec] = (),
    held: Mapping[str, int] | None = None,
    executing: Sequence[str] = (),
    own: bool = False,
    routing: Routing | None = None,
) -> Claims:
    """Claim up to `limit` runnable runs, highest priority first, within the queues' limits;
    also say whether runnable runs were left behind (`Claims.more`).

    `routing`: which runs of another code version this claimer may take, and which runs
    parked for a version it may take up again (versions_sql.py); None: any run.

    `executing`: runs the claimer still executes, never claimed again by it even once
    their lease has expired (it may be waiting for the store to come back to record an
    outcome it holds). `own`: the claimer's last claim was cut off unanswered, so runs
    leased to it that it does not execute may be ones that claim took: they are
    claimed again at once (as fresh claims, not takeovers) instead of after their lease.

    Only runs holding a live lease count against a queue or a partition key: parked
    runs hold no slot. Limited queues are locked first, so concurrent claimers on
    any host count the same running runs.
    """
    if not workflows:
        return Claims(more=False)
    stopped, paused = _pauses(conn, owner)
    workflows = [name for name in workflows if name not in paused]
    if stopped is not None or not workflows:
        return Claims(more=False)
    gate = _QueueGate(conn, now, queues, held or {})
    fetch = limit + 1 if gate.open else limit * 4 + 16  # one more: are any left behind?
    rows = _runnable(conn, owner if own else None, now, workflows, executing, fetch, routing)
    admitted: list[Any] = []
    more = len(rows) == fetch and not gate.open  # gated: candidates past the fetch unknown
    for row in rows:
        if gate.admit(row[4], row[5], row[6] is None):
            if len(admitted) == limit:
                more = True
                break
            admitted.append(row)
    if not admitted:
        return Claims(more=False)
    # one UPDATE for all of them (SET expressions read the row as it was before)
    ids = [row[0] for row in admitted]
    updated = {
        row[0]: row
        for row in conn.execute(
            "UPDATE runs SET status = CASE WHEN status = 'cancelling' THEN 'cancelling' "
            "ELSE 'running' END, lease_owner = ?, lease_until = ?, "
            "lease_epoch = lease_epoch + 1, recoveries = recoveries + CASE WHEN status IN "
            "('running', 'cancelling') AND COALESCE(lease_owner, '') <> ? THEN 1 ELSE 0 END, "
            "updated_at = ?, error = CASE WHEN status = 'needs_attention' THEN NULL ELSE error "
            f"END, started_at = COALESCE(started_at, ?) WHERE id IN ({_in(ids)}) "
            f"RETURNING {_RUN_COLUMNS}, {next_seq(conn)}",
            (owner, now + lease_seconds, owner if own else "", now, now, *ids),
        ).fetchall()
    }
    claims = Claims(more=more)
    for run_id, status, previous, lease_until, *_ in admitted:
        row = updated[run_id]
        run = _run(row[:-1])
        takeover = status in (RUNNING, CANCELLING) and not (own and previous == owner)
        if takeover:
            taken: dict[str, Any] = {"from": previous, "to": owner, "epoch": run.lease_epoch}
            if lease_until == 0:  # handed back by a stopping worker, not lost in a crash
                taken["released"] = True
            data = json.dumps(taken)
            _insert_entries(
                conn,
                run_id,
                [Entry(kind="run.recovered", data=data, at=now, worker=owner)],
                run.lease_epoch,
            )
        claims.append(
            Claim(
                run=run,
                recovered_from=previous if takeover else None,
                empty_journal=row[-1] == 0 and not takeover,
            )
        )
    return claims


_CANDIDATE = "id, status, lease_owner, lease_until, queue, partition_key, started_at"
_DUE = "ORDER BY priority DESC, COALESCE(wake_at, created_at) LIMIT ?"


def _runnable(
    conn: Conn,
    own: str | None,
    now: float,
    workflows: Sequence[str],
    executing: Sequence[str],
    limit: int,
    routing: Routing | None = None,
) -> list[Any]:
    """The first `limit` runnable runs of `workflows` (none paused) in claim order (`own`:
    the claimer whose runs leased to it are runnable too); rows start with `_CANDIDATE`.

    On SQLite each way of being runnable is a statement of its own, so each is an index
    range over live runs: one statement with OR can only scan the workflow's runs,
    finished ones included, so a claim grew with the run history (0.36 ms at 2,000 runs;
    the three as one UNION ALL cost 0.19 ms, the three apart 0.03). On PostgreSQL the
    planner ORs the index ranges itself, and FOR UPDATE SKIP LOCKED (which UNION cannot
    carry) lets concurrent claimers pass each other's rows.
    """
    expired = "lease_until IS NULL OR lease_until < ?" + (" OR lease_owner = ?" if own else "")
    ways: list[tuple[str, list[Any]]] = [
        ("status = 'pending'", []),
        (f"status IN ('running', 'cancelling') AND ({expired})", [now, *([own] if own else [])]),
        ("status IN ('sleeping', 'waiting') AND wake_at <= ?", [now]),
    ]
    where = f"workflow IN ({_in(workflows)})" + (
        f" AND id NOT IN ({_in(executing)})" if executing else ""
    )
    common: list[Any] = [*workflows, *executing]
    if routing is not None:  # by code version (versions_sql.py)
        newer = newer_live(conn, routing)
        clause, clause_params = routing_clause(routing, workflows, parked=False, newer=newer)
        parked, parked_params = routing_clause(routing, workflows, parked=True)
        ways = [(f"({way}) AND {clause}", [*ps, *clause_params]) for way, ps in ways]
        if parked != "1 = 0":
            ways.append((f"{PARKED_FOR_VERSION} AND {parked}", parked_params))
    if conn.dialect != "sqlite":
        text = " OR ".join(f"({way})" for way, _ in ways)
        return conn.execute(
            f"SELECT {_CANDIDATE} FROM runs WHERE ({text}) AND {where} {_DUE}{conn.claim_lock}",
            (*[p for _, ps in ways for p in ps], *common, limit),
        ).fetchall()
    rows: list[Any] = []
    for way, params in ways:
        rows += conn.execute(
            f"SELECT {_CANDIDATE}, -priority, COALESCE(wake_at, created_at) FROM runs "
            f"WHERE {way} AND {where} {_DUE}",
            (*params, *common, limit),
        ).fetchall()
    if len(rows) > 1:
        rows.sort(key=lambda row: (row[-2], row[-1]))
    return rows[:limit]


class _QueueGate:
    """What one claim may still admit: queue slots, per-worker slots, rate, partitions."""

    def __init__(
        self, conn: Conn, now: float, queues: Sequence[QueueSpec], held: Mapping[str, int]
    ) -> None:
        self.limits = {q.name: q for q in queues}
        self.held = dict(held)
        for name in sorted(self.limits):
            conn.lock_queue(name)
        live = "status IN ('running', 'cancelling') AND lease_until >= ?"
        self.running: dict[str, int] = {}
        self.started: dict[str, int] = {}
        if self.limits:
            names = sorted(self.limits)
            for queue, count in conn.execute(
                f"SELECT queue, COUNT(*) FROM runs WHERE {live} AND queue IN ({_in(names)}) "
                "GROUP BY queue",
                (now, *names),
            ).fetchall():
                self.running[queue] = int(count)
            for spec in self.limits.values():
                if spec.rate is not None:
                    row = conn.execute(
                        "SELECT COUNT(*) FROM runs WHERE queue = ? AND started_at > ?",
                        (spec.name, now - spec.period),
                    ).fetchone()
                    self.started[spec.name] = int(row[0])
        self.partitions = {
            (queue, key)
            for queue, key in conn.execute(
                f"SELECT DISTINCT queue, partition_key FROM runs WHERE {live} "
                "AND partition_key IS NOT NULL",
                (now,),
            ).fetchall()
        }
        self.open = not self.limits and not self.partitions

    def admit(self, queue: str, partition: str | None, first_start: bool) -> bool:
        spec = self.limits.get(queue)
        if spec is not None:
            if spec.concurrency is not None and self.running.get(queue, 0) >= spec.concurrency:
                return False
            if spec.per_worker is not None and self.held.get(queue, 0) >= spec.per_worker:
                return False
            if spec.rate is not None and first_start and self.started.get(queue, 0) >= spec.rate:
                return False
        if partition is not None and (queue, partition) in self.partitions:
            return False
        self.running[queue] = self.running.get(queue, 0) + 1
        self.held[queue] = self.held.get(queue, 0) + 1
        if first_start:
            self.started[queue] = self.started.get(queue, 0) + 1
        if partition is not None:
            self.partitions.add((queue, partition))
        return True


def heartbeat(
    conn: Conn, owner: str, run_ids: Sequence[str], lease_until: float
) -> list[LeaseState]:
    """Renew leases; each held run's state: cancelled, pause asked (2: with `now`), held by
    a paused workflow or worker (`abort`: paused with `now`)."""
    states: list[LeaseState] = []
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start : start + 500]
        rows = conn.execute(
            f"UPDATE runs SET lease_until = ? WHERE lease_owner = ? AND id IN ({_in(chunk)}) "
            f"AND status IN ('running', 'cancelling') RETURNING id, status, pause_requested",
            (lease_until, owner, *chunk),
        ).fetchall()
        states.extend(LeaseState(r[0], r[1], bool(r[2]), abort=int(r[2]) == 2) for r in rows)
    if states:
        stopped, paused = _pauses(conn, owner)
        if stopped is not None or paused:
            ids = [s.run_id for s in states]
            workflows: dict[str, str] = dict(
                conn.execute(
                    f"SELECT id, workflow FROM runs WHERE id IN ({_in(ids)})", ids
                ).fetchall()
            )
            for state in states:
                workflow = workflows.get(state.run_id, "")
                state.hold = stopped is not None or workflow in paused
                state.abort = state.abort or bool(stopped) or paused.get(workflow, False)
    return states


# a `pauses` row that pauses a worker: by its id or its host (ids are host:pid:random, or
# chosen: then the worker registry knows the host); parameters from `_worker_names`
_WORKER_PAUSED = (
    "(scope = 'worker' AND (name IN (?, ?) OR name IN (SELECT host FROM workers WHERE id = ?)))"
)


def _worker_names(owner: str) -> tuple[str, str, str]:
    """`_WORKER_PAUSED`'s parameters for worker `owner`."""
    return owner, owner.split(":", 1)[0], owner


def _pauses(conn: Conn, owner: str) -> tuple[bool | None, dict[str, bool]]:
    """In one read: how this worker is paused, by its id or by its host (ids are
    host:pid:random, or chosen: then the worker registry knows the host; None: not, True:
    with `now`), and the paused workflows (name: with `now`)."""
    rows = conn.execute(
        f"SELECT scope, name, abort FROM pauses WHERE scope = 'workflow' OR {_WORKER_PAUSED}",
        _worker_names(owner),
    ).fetchall()
    stopped = [bool(abort) for scope, _, abort in rows if scope == "worker"]
    paused = {name: bool(abort) for scope, name, abort in rows if scope == "workflow"}
    return (max(stopped) if stopped else None), paused


def set_pause(
    conn: Conn, scope: str, name: str, paused: bool, now: float, abort: bool = False
) -> bool:
    """Pause or resume a workflow or a worker (id or host) everywhere; False if no change.
    `abort`: paused with `now` (a pause without it does not take that back)."""
    if paused:
        cur = conn.execute(
            "INSERT INTO pauses (scope, name, at, abort) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (scope, name) DO UPDATE SET abort = 1 WHERE excluded.abort = 1 "
            "AND pauses.abort = 0",
            (scope, name, now, int(abort)),
        )
    else:
        cur = conn.execute("DELETE FROM pauses WHERE scope = ? AND name = ?", (scope, name))
        conn.notify()  # held runs are claimable again
    return cur.rowcount == 1


def list_pauses(conn: Conn) -> list[tuple[str, str, float]]:
    rows = conn.execute("SELECT scope, name, at FROM pauses ORDER BY scope, name").fetchall()
    return [(r[0], r[1], float(r[2])) for r in rows]


def release(conn: Conn, owner: str, run_ids: Sequence[str]) -> None:
    for start in range(0, len(run_ids), 500):
        chunk = run_ids[start : start + 500]
        conn.execute(
            f"UPDATE runs SET lease_until = 0 WHERE lease_owner = ? AND id IN ({_in(chunk)}) "
            "AND status IN ('running', 'cancelling')",
            (owner, *chunk),
        )
    conn.notify()  # released runs are claimable at once


def next_wake(conn: Conn, workflows: Sequence[str]) -> float | None:
    if not workflows:
        return None
    marks = _in(workflows)
    row = conn.execute(
        f"SELECT MIN(t) FROM ("
        f" SELECT MIN(wake_at) AS t FROM runs WHERE status IN ('sleeping', 'waiting') "
        f"  AND wake_at IS NOT NULL AND workflow IN ({marks})"
        f" UNION ALL SELECT MIN(lease_until) FROM runs WHERE status IN ('running', 'cancelling')"
        f"  AND workflow IN ({marks})) AS wakes",
        (*workflows, *workflows),
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def send_event(
    conn: Conn, run_id: str, name: str, payload: str, now: float, key: str | None = None
) -> int:
    """Keep an event for a run and wake it if it waits for it; an event whose `key` the
    run already has is not kept again (its id is returned)."""
    if key is not None:
        seen = conn.execute(
            "SELECT id FROM events WHERE run_id = ? AND dedup_key = ?", (run_id, key)
        ).fetchone()
        if seen is not None:
            return int(seen[0])
    # Wake a run waiting for this event; the write also holds the run's row, so gc cannot
    # delete the run under an event that is being delivered to it.
    row = conn.execute(
        "UPDATE runs SET status = CASE WHEN status = ? AND waiting_for = ? THEN ? ELSE status END "
        "WHERE id = ? RETURNING status",
        (WAITING, f"event:{name}", PENDING, run_id),
    ).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    if row[0] in FINISHED:  # a dead run keeps its events for when it is resumed
        raise StoreError(f"run {run_id!r} is {row[0]}; event {name!r} was not delivered")
    event_id = conn.execute(
        "INSERT INTO events (run_id, name, payload, sent_at, dedup_key) VALUES (?, ?, ?, ?, ?) "
        "RETURNING id",
        (run_id, name, payload, now, key),
    ).fetchone()[0]
    conn.notify()
    return int(event_id)


def next_event(conn: Conn, run_id: str, name: str) -> EventRow | None:
    row = conn.execute(
        "SELECT id, run_id, name, payload, sent_at, consumed_at FROM events "
        "WHERE run_id = ? AND name = ? AND consumed_at IS NULL ORDER BY id LIMIT 1",
        (run_id, name),
    ).fetchone()
    return EventRow(*tuple(row)) if row else None


def get_blob(conn: Conn, key: str) -> str:
    row = conn.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise StoreError(f"blob {key!r} is missing from the store")
    return str(row[0])


def cancel_tree(conn: Conn, run_id: str, now: float) -> list[str]:
    """Mark a run and its unfinished descendants cancelled or cancelling; return touched ids."""
    touched: list[str] = []
    stack = [run_id]
    while stack:
        rid = stack.pop()
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (rid,)).fetchone()
        if row is None or row[0] in FINISHED:
            continue
        # A run a worker holds finishes its own cancellation; one parked anywhere ends now.
        held = row[0] in (RUNNING, CANCELLING)
        status = CANCELLING if held else CANCELLED
        conn.execute(
            "UPDATE runs SET status = ?, updated_at = ?, wake_at = NULL WHERE id = ?",
            (status, now, rid),
        )
        kind = "run.cancel_requested" if held else "run.cancelled"
        _insert_entries(conn, rid, [Entry(kind=kind, at=now)], None)
        touched.append(rid)
        if not held:
            _wake_parent(conn, rid)
        children = conn.execute("SELECT id FROM runs WHERE parent_id = ?", (rid,)).fetchall()
        stack.extend(r[0] for r in children)
    if touched:
        conn.notify()
    return touched


def stuck(conn: Conn, now: float, grace: float, limit: int = 1000) -> list[RunRow]:
    """Runs that should be moving but nobody has taken for `grace` seconds past their time."""
    cutoff = now - grace
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE "
        "(status IN ('running', 'cancelling') AND lease_until IS NOT NULL AND lease_until < ?)"
        " OR (status IN ('sleeping', 'waiting') AND wake_at IS NOT NULL AND wake_at < ?)"
        " OR (status = 'pending' AND updated_at < ?) "
        "ORDER BY updated_at LIMIT ?",
        (cutoff, cutoff, cutoff, limit),
    ).fetchall()
    return [_run(r) for r in rows]
