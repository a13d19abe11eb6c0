"""The trigger health store extension: what each worker's message trigger is doing (consuming,
paused, refused by its broker, unable to reach it), with the broker's own words and since
when, one row per (trigger, worker), so `perdure triggers`, `perdure stuck`, `/readyz` and
the dashboard read one truth whatever process asks (`TriggerHealth(store)`).

A worker writes its row when the state or the error changes; whether the row still counts
is the worker registry's to say (a stopped, dead or silent worker's row is history; a
stopped worker's is dropped at the next write).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

if TYPE_CHECKING:
    from ..store.roles import Store

HEALTH = Extension(
    "trigger_health",
    [
        # 1: the state of each worker's consumer of each message trigger
        """
        CREATE TABLE trigger_health (
            trigger  TEXT NOT NULL,
            worker   TEXT NOT NULL,
            kind     TEXT NOT NULL,
            state    TEXT NOT NULL,
            since    REAL NOT NULL,
            error    TEXT,
            at       REAL NOT NULL,
            PRIMARY KEY (trigger, worker)
        )
        """,
    ],
    tables=("trigger_health",),
    at_open=True,
)

FAILING = ("refused", "down")  # states of a consumer that is not consuming because of an error


@dataclass(frozen=True, slots=True)
class HealthRow:
    """One worker's consumer of one message trigger: its state (`connecting`, `consuming`,
    `paused (...)`, `backpressure`, `refused`, `down`), since when, the broker's words when
    it failed, and when the worker wrote this."""

    trigger: str
    worker: str
    kind: str
    state: str
    since: float
    error: str | None
    at: float

    @property
    def failing(self) -> bool:
        return self.state in FAILING

    def as_dict(self) -> dict[str, object]:
        return {"worker": self.worker, "state": self.state, "since": self.since,
                "error": self.error}  # fmt: skip

    def as_consumer(self) -> dict[str, object]:
        """This row as one of its worker's consumers (the workers views)."""
        return {"trigger": self.trigger, "kind": self.kind, "state": self.state,
                "since": self.since, "error": self.error, "failing": self.failing}  # fmt: skip


def put_health(conn: Db, row: HealthRow) -> None:
    """Record (or replace) a worker's state of one trigger; the rows of workers that have
    stopped since go (a worker restarted under its id writes its row anew)."""
    conn.execute(
        "DELETE FROM trigger_health WHERE worker IN (SELECT id FROM workers WHERE "
        "stopped_at IS NOT NULL) AND worker <> ?",
        (row.worker,),
    )
    conn.execute(
        "INSERT INTO trigger_health (trigger, worker, kind, state, since, error, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (trigger, worker) DO UPDATE SET "
        "kind = excluded.kind, state = excluded.state, since = excluded.since, "
        "error = excluded.error, at = excluded.at",
        (row.trigger, row.worker, row.kind, row.state, row.since, row.error, row.at),
    )


def list_health(conn: Db, trigger: str | None = None) -> list[HealthRow]:
    """Every recorded row, of one trigger or all, by trigger then worker."""
    where, args = ("WHERE trigger = ? ", (trigger,)) if trigger is not None else ("", ())
    rows = conn.execute(
        "SELECT trigger, worker, kind, state, since, error, at FROM trigger_health "
        f"{where}ORDER BY trigger, worker",
        args,
    ).fetchall()
    return [HealthRow(*row) for row in rows]


class TriggerHealth(Methods):
    """The trigger health methods over one store."""

    extension = HEALTH
    record_health = writes(put_health)
    trigger_health = reads(list_health)


async def consumers_by_worker(store: Store, workers: Collection[str]) -> dict[str, list[HealthRow]]:
    """What each of `workers` recorded of its message-trigger consumers, by worker (a worker
    with no consumer is absent). The caller passes the live workers: the rows of a stopped,
    dead or silent worker are history, not a state."""
    if not workers:
        return {}
    found: dict[str, list[HealthRow]] = {}
    for row in await TriggerHealth(store).trigger_health(None):
        if row.worker in workers:
            found.setdefault(row.worker, []).append(row)
    return found


def consumers_said(rows: Collection[HealthRow]) -> str:
    """A worker's consumers in one phrase, the same in every workers view:
    `orders consuming, audit refused` (`-`: none)."""
    return ", ".join(f"{r.trigger} {r.state}" for r in rows) or "-"
