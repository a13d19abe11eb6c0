"""The store protocol, split by role: type against the role a caller needs.

`Store` is every role together, what a store implements. Each role is small and
moves rows, ids and bytes only, never a Python callable; every method is safe
across processes. The SQL stores implement them with the tables of methods.py
(tests/store checks that each table's SQL function takes exactly its role's
parameters). An extension's tables are not here: it reaches them through
`Store.run_sql`, the one method that takes a function (store/extensions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

if TYPE_CHECKING:
    from .base import (
        Append,
        AppendResult,
        Claims,
        Entry,
        EventRow,
        GcBatch,
        GcRule,
        LeaseState,
        NewRun,
        QueueSpec,
        RunRow,
    )
    from .dialect import Db
    from .extensions import Extension
    from .stream_sql import StreamRow
    from .versions_sql import Routing
    from .workers_sql import WorkerRow


class Runs(Protocol):
    """Runs and their journals: created, read, appended to (fenced by lease epoch),
    sent events, cancelled, and deleted once finished and past their retention."""

    async def create_run(self, new: NewRun) -> tuple[RunRow, bool]: ...
    async def get_run(self, run_id: str) -> RunRow | None: ...
    async def list_runs(
        self,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
        after: tuple[float, str] | None = None,  # keyset: the last (created_at, id) seen
        ids: Sequence[str] = (),  # only these runs (unknown ids are left out)
    ) -> list[RunRow]: ...
    async def count_runs(self) -> dict[str, int]: ...
    async def journal(self, run_id: str, after: int = -1, limit: int = -1) -> list[Entry]: ...
    async def append(self, append: Append) -> AppendResult: ...
    async def send_event(
        self, run_id: str, name: str, payload: str, now: float, key: str | None = None
    ) -> int: ...
    async def next_event(self, run_id: str, name: str) -> EventRow | None: ...
    async def cancel(self, run_id: str, now: float) -> list[str]: ...
    async def stuck(self, now: float, grace: float, limit: int = 1000) -> list[RunRow]: ...
    async def get_blob(self, key: str) -> str: ...
    async def gc(
        self, rule: GcRule, after: tuple[float, str] | None = None, limit: int = 500
    ) -> GcBatch: ...


class Streams(Protocol):
    """A run's stream: what steps write while they run (never needed for replay)."""

    async def append_stream(
        self, run_id: str, rows: Sequence[tuple[str, str, str | None, float]], keep: int
    ) -> int: ...
    async def read_stream(
        self, run_id: str, after: int = -1, limit: int = 500
    ) -> list[StreamRow]: ...
    async def stream_last(self, run_id: str) -> int: ...


class Leases(Protocol):
    """Who runs what: claims under a fresh epoch, heartbeats, hand-backs, pauses that hold
    runs, and the clock hosts agree on."""

    async def claim(
        self,
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
    ) -> Claims: ...
    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_until: float
    ) -> list[LeaseState]: ...
    async def release(self, owner: str, run_ids: Sequence[str]) -> None: ...
    async def next_wake(self, workflows: Sequence[str]) -> float | None: ...
    async def set_pause(
        self, scope: str, name: str, paused: bool, now: float, abort: bool = False
    ) -> bool: ...
    async def list_pauses(self) -> list[tuple[str, str, float]]: ...


class Workers(Protocol):
    """The worker registry: who and where workers are, when last alive, and proof of death."""

    # alive now with `row.running` runs, or (`row.stopped_at` set) stopped
    async def worker_beat(self, row: WorkerRow) -> None: ...
    # `row` under its id, unless a worker holds it: that one's row (None: registered); the
    # holder is replaced only if it is still the life `replaces` describes (one the caller
    # judged stopped or dead)
    async def worker_register(
        self, row: WorkerRow, replaces: WorkerRow | None = None
    ) -> WorkerRow | None: ...
    async def list_workers(self, since: float) -> list[WorkerRow]: ...
    # proof of death: leases of a dead worker's life handed back (if the registry still
    # shows that life); a session lock held for a worker's life, and the workers whose
    # session lock is free (PostgreSQL; elsewhere False and [])
    async def release_worker(self, row: WorkerRow, now: float) -> int: ...
    async def worker_session(self, row: WorkerRow) -> bool: ...
    async def sessions_gone(self, me: str, since: float) -> list[WorkerRow]: ...


ROLES = (Runs, Streams, Leases, Workers)


class Store(Runs, Streams, Leases, Workers, Protocol):
    """Where runs, their journals and streams, leases and workers live: every role, and the
    one generic entry through which an extension (store/extensions.py) reaches its own
    tables: schedules, agents' budgets and memory, access tokens, table changes, ..."""

    url: str

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def run_sql(
        self,
        fn: Callable[[Db], T],
        *,
        write: bool,
        extension: Extension | None = None,
        apart: bool = False,
    ) -> T:
        """`fn(db)` on the store's connection, answered once durable: with `write`, inside a
        write transaction it may share with other writes (a savepoint of its own), else a
        read (on the caller's thread when the store thread is idle). `extension`: its
        tables are brought up to date first (once per opened store). `apart`: in a
        transaction of its own, off the store thread where the store can (PostgreSQL: a
        connection of its own), for statements that may wait on other sessions' locks
        without holding up the store's commits (DDL on a user's table)."""
        ...


# -- what only some stores have: a caller asks `isinstance(store, Role)` ------------------------


class Listener(Protocol):
    """What a store's notices wake: the engine's runtime."""

    def notify(self) -> None:
        """Another process may have made work runnable."""

    def ended_elsewhere(self) -> None:
        """Another process ended a run, and nothing else (its result's waiters care)."""


@runtime_checkable
class Notices(Protocol):
    """A store whose other processes wake this one (PostgreSQL's LISTEN/NOTIFY); without
    it, workers poll."""

    def listen(self, listener: Listener) -> None:
        """Wake `listener` (from the store's own thread) on every notice from now on."""


@runtime_checkable
class WriteLock(Protocol):
    """A store with one write lock for every process (SQLite): how long a caller waits for
    it by default, and who has held it too long."""

    busy_timeout: float

    def write_lock_stall(self, older_than: float = ...) -> str | None:
        """One line naming the holder if the lock was held longer than `older_than`
        seconds, else None."""
