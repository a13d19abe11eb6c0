"""The schedules' store extension: their rows, tables, migrations, SQL (shared by SQLite
and PostgreSQL) and methods (`Schedules(store)`).

A scheduler step is a compare-and-set on `next_fire`: whichever worker moves it
first records the ticks and creates their runs in the same transaction; the
others see it moved and do nothing. A tick's run id is unique in `runs`, so
even a step applied twice could not start a tick twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import StoreError
from ..store.base import TERMINAL, NewRun, RunRow
from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes
from ..store.names import check
from ..store.sqlops import _RUN_COLUMNS, _run, cancel_tree, create_run


@dataclass(slots=True)
class ScheduleRow:
    """A schedule as stored: what it starts, when, its policies, and its next due tick."""

    name: str
    workflow: str
    cron: str | None = None  # a cron expression in `tz`, or None with `every`
    every: float | None = None  # seconds between ticks (aligned to the Unix epoch)
    tz: str = "UTC"
    input: str = '{"args":[],"kwargs":{}}'  # the task spec every run receives (JSON)
    catchup: str = "latest"  # skip | latest | all
    catchup_limit: int = 10  # `all` fires at most this many missed ticks
    overlap: str = "skip"  # skip | queue | allow | cancel_previous
    jitter: float = 0.0  # seconds; each tick fires within [t, t + jitter)
    grace: float = 60.0  # a tick handled this late is still on time; later ones are missed
    paused: bool = False
    next_fire: float | None = None  # the first tick not handled yet
    source: str = "code"  # code (declared in the app) | api (added by CLI or API)
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(slots=True)
class TickRow:
    """What became of one tick: fired (run_id), skipped, missed or queued, and why."""

    schedule: str
    fire_at: float
    status: str
    run_id: str | None = None
    reason: str | None = None
    at: float = 0.0


@dataclass(slots=True)
class ScheduleAdvance:
    """One scheduler step for one schedule, applied only if `next_fire` is still `expected`
    (so among many workers exactly one handles each tick): record ticks, start runs,
    cancel runs, move `next_fire` on."""

    name: str
    expected: float | None
    next_fire: float | None
    now: float
    ticks: list[TickRow] = field(default_factory=list)
    new_runs: list[NewRun] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)


SCHEDULES = Extension(
    "schedules",
    [
        # 1: schedules and their ticks (each tick fired, skipped, missed or queued, with why)
        """
        CREATE TABLE schedules (
            name          TEXT PRIMARY KEY,
            workflow      TEXT NOT NULL,
            cron          TEXT,
            every         REAL,
            tz            TEXT NOT NULL DEFAULT 'UTC',
            input         TEXT NOT NULL DEFAULT '{"args":[],"kwargs":{}}',
            catchup       TEXT NOT NULL DEFAULT 'latest',
            catchup_limit INTEGER NOT NULL DEFAULT 10,
            overlap       TEXT NOT NULL DEFAULT 'skip',
            jitter        REAL NOT NULL DEFAULT 0,
            grace         REAL NOT NULL DEFAULT 60,
            paused        INTEGER NOT NULL DEFAULT 0,
            next_fire     REAL,
            source        TEXT NOT NULL DEFAULT 'code',
            created_at    REAL NOT NULL,
            updated_at    REAL NOT NULL
        );
        CREATE INDEX schedules_due ON schedules (next_fire) WHERE paused = 0;
        CREATE TABLE schedule_ticks (
            schedule  TEXT NOT NULL,
            fire_at   REAL NOT NULL,
            status    TEXT NOT NULL,
            run_id    TEXT,
            reason    TEXT,
            at        REAL NOT NULL,
            PRIMARY KEY (schedule, fire_at)
        );
        CREATE INDEX schedule_ticks_queued ON schedule_ticks (schedule, fire_at)
            WHERE status = 'queued'
        """,
    ],
    tables=("schedules", "schedule_ticks"),
    legacy=(4,),  # made by the core's script 4 before
    at_open=True,
)

_COLUMNS = (
    "name, workflow, cron, every, tz, input, catchup, catchup_limit, overlap, jitter, grace, "
    "paused, next_fire, source, created_at, updated_at"
)
_FIELDS = tuple(c.strip() for c in _COLUMNS.split(","))
_DEFINITION = (
    "workflow", "cron", "every", "tz", "input", "catchup", "catchup_limit", "overlap",
    "jitter", "grace", "source", "updated_at",
)  # fmt: skip
_TICK_COLUMNS = "schedule, fire_at, status, run_id, reason, at"


def _schedule(row: Any) -> ScheduleRow:
    values = dict(zip(_FIELDS, tuple(row), strict=True))
    values["paused"] = bool(values["paused"])
    return ScheduleRow(**values)


def _tick(row: Any) -> TickRow:
    return TickRow(*row)


def get_schedule(conn: Db, name: str) -> ScheduleRow | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)).fetchone()
    return _schedule(row) if row else None


def put_schedule(conn: Db, row: ScheduleRow, *, replace_state: bool) -> ScheduleRow:
    """Insert a schedule, or update its definition keeping `paused`; `next_fire` is reset
    only if the stored timing differs (decided in the statement, so workers storing the
    same declaration at once never move a tick another already handled) or if
    `replace_state` forces it."""
    check(row.name, "schedule name")
    values = [getattr(row, f) for f in _FIELDS]
    values[_FIELDS.index("paused")] = int(row.paused)
    updates = [f"{c} = excluded.{c}" for c in _DEFINITION]
    same_timing = (
        "COALESCE(schedules.cron, '') = COALESCE(excluded.cron, '') "
        "AND COALESCE(schedules.every, -1) = COALESCE(excluded.every, -1) "
        "AND schedules.tz = excluded.tz"
    )
    updates.append(
        f"next_fire = CASE WHEN CAST(? AS INTEGER) = 0 AND {same_timing} "
        "THEN schedules.next_fire ELSE excluded.next_fire END"
    )
    conn.execute(
        f"INSERT INTO schedules ({_COLUMNS}) VALUES ({', '.join('?' * len(_FIELDS))}) "
        f"ON CONFLICT (name) DO UPDATE SET {', '.join(updates)}",
        (*values, int(replace_state)),
    )
    conn.notify()  # schedulers in other processes recompute their next wake-up
    stored = get_schedule(conn, row.name)
    assert stored is not None
    return stored


def list_schedules(conn: Db) -> list[ScheduleRow]:
    return [
        _schedule(r)
        for r in conn.execute(f"SELECT {_COLUMNS} FROM schedules ORDER BY name").fetchall()
    ]


def due_schedules(conn: Db, now: float) -> list[ScheduleRow]:
    """Unpaused schedules with a tick due (jitter is applied by the scheduler) or queued."""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM schedules WHERE paused = 0 AND (next_fire <= ? "
        "OR name IN (SELECT schedule FROM schedule_ticks WHERE status = 'queued')) "
        "ORDER BY next_fire",
        (now,),
    ).fetchall()
    return [_schedule(r) for r in rows]


def next_schedule_fire(conn: Db) -> float | None:
    row = conn.execute("SELECT MIN(next_fire + jitter) FROM schedules WHERE paused = 0").fetchone()
    return float(row[0]) if row and row[0] is not None else None


def advance(conn: Db, advance: ScheduleAdvance) -> bool:
    """Apply one scheduler step if `next_fire` is still what the scheduler read."""
    cur = conn.execute(
        "UPDATE schedules SET next_fire = ?, updated_at = ? WHERE name = ? AND paused = 0 "
        "AND (next_fire = ? OR (next_fire IS NULL AND CAST(? AS REAL) IS NULL))",
        (advance.next_fire, advance.now, advance.name, advance.expected, advance.expected),
    )
    if cur.rowcount != 1:
        return False
    for t in advance.ticks:
        conn.execute(
            f"INSERT INTO schedule_ticks ({_TICK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (schedule, fire_at) DO UPDATE SET status = excluded.status, "
            "run_id = excluded.run_id, reason = excluded.reason, at = excluded.at",
            (t.schedule, t.fire_at, t.status, t.run_id, t.reason, t.at),
        )
    for new in advance.new_runs:
        create_run(conn, new)
    for run_id in advance.cancel:
        cancel_tree(conn, run_id, advance.now)
    return True


def ticks(conn: Db, name: str, *, statuses: Sequence[str] = (), limit: int = 50) -> list[TickRow]:
    where = "schedule = ?"
    params: list[Any] = [name]
    if statuses:
        where += f" AND status IN ({', '.join('?' * len(statuses))})"
        params += list(statuses)
    rows = conn.execute(
        f"SELECT {_TICK_COLUMNS} FROM schedule_ticks WHERE {where} ORDER BY fire_at DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [_tick(r) for r in rows]


def set_paused(
    conn: Db, name: str, paused: bool, now: float, next_fire: float | None
) -> ScheduleRow:
    """Pause, or resume with `next_fire` (the scheduler's first tick after now)."""
    cur = conn.execute(
        "UPDATE schedules SET paused = ?, updated_at = ?, "
        "next_fire = COALESCE(?, next_fire) WHERE name = ?",
        (int(paused), now, next_fire, name),
    )
    if cur.rowcount != 1:
        raise StoreError(f"no schedule named {name!r}")
    if not paused:
        conn.notify()
    stored = get_schedule(conn, name)
    assert stored is not None
    return stored


def delete(conn: Db, name: str) -> bool:
    cur = conn.execute("DELETE FROM schedules WHERE name = ?", (name,))
    conn.execute("DELETE FROM schedule_ticks WHERE schedule = ?", (name,))
    return cur.rowcount == 1


def active_runs(conn: Db, id_prefix: str) -> list[RunRow]:
    """Unfinished runs whose id starts with `id_prefix` (a range scan of the primary key)."""
    end = id_prefix[:-1] + chr(ord(id_prefix[-1]) + 1)
    done = ", ".join(f"'{s}'" for s in sorted(TERMINAL))
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE id >= ? AND id < ? AND status NOT IN ({done}) "
        "ORDER BY created_at",
        (id_prefix, end),
    ).fetchall()
    return [_run(r) for r in rows]


class Schedules(Methods):
    """The schedules' methods over one store: perdure.triggers.schedules decides, these
    apply (a scheduler step atomically)."""

    extension = SCHEDULES
    put_schedule = writes(put_schedule)
    get_schedule = reads(get_schedule)
    list_schedules = reads(list_schedules)
    due_schedules = reads(due_schedules)
    next_schedule_fire = reads(next_schedule_fire)
    advance_schedule = writes(advance)
    schedule_ticks = reads(ticks)
    set_schedule_paused = writes(set_paused)
    delete_schedule = writes(delete)
    active_runs = reads(active_runs)
