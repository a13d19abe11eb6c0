"""The embedded SQLite store: one file, WAL, many processes, group commit.

The shared store thread (threaded.py) batches writes, so several active runs
share one fsync. `BEGIN IMMEDIATE` serialises writers across processes; a busy
database is waited for, never reported to the user as "database is locked".
SQLite cannot take the write lock from a holder that is frozen, so the wait is
made visible instead: the holder is recorded beside the file (lockholder.py), a
waiter warns after WARN_AFTER seconds naming it, and `perdure stuck` and
`/readyz` report a lock held longer than STALL_AFTER.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, StoreError, StoreUnavailable
from . import checkpoints, migrations, sqlops
from .base import Append
from .batching import Op
from .dialect import Db
from .lockholder import HolderFile, holder_path, process_state, read_holder
from .threaded import ThreadedStore

log = logging.getLogger("perdure.store")

LOCK_SLICE = 0.25  # seconds SQLite itself waits for a lock before Python looks again
WARN_AFTER = 3.0  # a writer waiting this long for the lock logs who holds it
WARN_EVERY = 30.0  # and again this often while it still waits
STALL_AFTER = 5.0  # `perdure stuck` and /readyz report a lock held longer than this


def _with_body(op: Op) -> Append | None:
    """The run's write an op of `run_sql` makes with a body in its transaction
    (sqlops.append_with_body, e.g. a transactional step's), for the lock-holder record."""
    fn = op.fn
    if isinstance(fn, functools.partial) and fn.func is sqlops.append_with_body:
        found = fn.keywords.get("append")
        return found if isinstance(found, Append) else None
    return None


def _busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class _LockWait:
    """One wait for the write lock: a warning naming the holder after WARN_AFTER seconds,
    again every WARN_EVERY, and a line when the lock came."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.started = time.monotonic()
        self.warned: float | None = None

    def waited(self) -> float:
        return time.monotonic() - self.started

    def waiting(self) -> None:
        now = time.monotonic()
        if now - self.started < WARN_AFTER:
            return
        if self.warned is not None and now - self.warned < WARN_EVERY:
            return
        self.warned = now
        log.warning(
            "sqlite store %s: waiting %.0fs for the write lock, held by %s; every writer of "
            "this store waits until that transaction ends (see docs/how-to/choosing-a-store.md)",
            self.store.path, now - self.started, self.store.who_holds(),
        )  # fmt: skip

    def done(self) -> None:
        if self.warned is not None:
            log.warning(
                "sqlite store %s: got the write lock after %.0fs",
                self.store.path, time.monotonic() - self.started,
            )  # fmt: skip


class SQLiteStore(ThreadedStore):
    """A Store on one SQLite file (or `:memory:` for a single process).

    `busy_timeout`: how long opening a locked file is retried, and how long `App.start`
    waits for the write lock unless given its own `timeout`; the worker's own writes wait
    for the lock as long as it takes (warning every WARN_EVERY seconds, naming the holder).
    """

    def __init__(self, path: str, *, synchronous: str = "FULL", busy_timeout: float = 60.0) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ConfigError(f"sqlite synchronous={synchronous!r}: use OFF, NORMAL, FULL or EXTRA")
        super().__init__()
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        self.url = f"sqlite:///{path}"
        self._holder = None if path == ":memory:" else HolderFile(path)
        self._holder_conn: Any = None  # the connection whose transaction the record names
        self._checkpoints = None if path == ":memory:" else checkpoints.Checkpointer(self._plain)

    thread_name = "perdure-sqlite"
    db_errors = (sqlite3.Error,)

    def _prepare(self) -> None:
        if self.path != ":memory:":
            parent = os.path.dirname(os.path.abspath(self.path))
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create store folder {parent!r}: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        """Open the file, check it is ours, set WAL; retried while another process holds a
        lock SQLite does not wait for itself (switching a new file to WAL while another
        process migrates it answers "locked" at once)."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.01
        wait = _LockWait(self)
        while True:
            try:
                conn = self._open_once()
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise ConfigError(
                        f"{self.path!r} is not a perdure SQLite store: {exc}"
                    ) from None
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"SQLite store {self.path!r} stayed locked for {self.busy_timeout:g}s "
                        f"by {self.who_holds()}"
                    ) from None
                wait.waiting()
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            else:
                wait.done()
                return conn

    def _open_once(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, timeout=LOCK_SLICE, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open SQLite store {self.path!r}: {exc}") from None
        conn.row_factory = sqlite3.Row
        try:
            self._check_foreign(conn)  # before any pragma: a refused file stays byte-identical
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            self._settings(conn)
        except sqlite3.OperationalError:
            conn.close()
            raise  # locked or busy: the caller retries
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise ConfigError(f"{self.path!r} is not a perdure SQLite store: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _settings(self, conn: sqlite3.Connection) -> None:
        """Per-connection settings: durability, no foreign keys, checkpoints left to the
        checkpoint thread (checkpoints.py) up to its backstop."""
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA foreign_keys=OFF")
        if self._checkpoints is not None:
            conn.execute(f"PRAGMA wal_autocheckpoint={checkpoints.BACKSTOP}")

    def _plain(self) -> sqlite3.Connection:
        """A connection for the checkpoint thread: never waits for a lock."""
        return sqlite3.connect(self.path, timeout=0, isolation_level=None)

    def _check_foreign(self, conn: sqlite3.Connection) -> None:
        """Refuse another program's database, or one written by a newer perdure, untouched."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return
        if "perdure_meta" not in tables:
            raise ConfigError(
                f"{self.path!r} is an SQLite database of another program, not a perdure store "
                "(choose another file with --db / PERDURE_DB)"
            )
        migrations.recorded_version(Db(conn), repr(self.path))

    def _begin(self, conn: sqlite3.Connection, wait: bool = True) -> bool:
        """BEGIN IMMEDIATE, waiting for the write lock as long as it takes (each attempt
        waits LOCK_SLICE inside SQLite), saying who holds it once the wait is long; a store
        being stopped gives up after WARN_AFTER, so a frozen holder cannot block stop().
        Without `wait` (the direct connection never waits): False if another holds it."""
        waited: _LockWait | None = None
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not wait:
                    return False  # another writer holds the lock: queue instead of waiting
                if not _busy(exc):
                    raise
                waited = waited or _LockWait(self)
                if self._thread is None and waited.waited() >= WARN_AFTER:  # stop() was called
                    raise StoreUnavailable(
                        f"store {self.url}: stopped while waiting for the write lock held by "
                        f"{self.who_holds()}; nothing was written"
                    ) from None
                waited.waiting()
                continue
            if waited is not None:
                waited.done()
            return True

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring the schema up to date; a store already current is not written at all, so
        opening it never waits for the write lock."""
        try:
            if migrations.recorded_version(Db(conn), repr(self.path)) == migrations.LATEST:
                return
        except sqlite3.OperationalError:
            pass  # no perdure_meta yet: a new store
        self._begin(conn)
        if self._holder is not None:
            self._holder_conn = conn
            self._holder.hold("migration")
        try:
            migrations.apply(Db(conn), repr(self.path))
            self._finish(conn, "COMMIT")
        except BaseException:
            self._finish(conn, "ROLLBACK")
            raise

    def _holding(self, conn: Any, ops: Sequence[Op]) -> None:
        if self._holder is None:
            return
        runs: list[str] = []
        step = None  # the first transactional step written, if any
        for op in ops:
            if op.append is not None:
                runs.append(op.append.run_id)
            elif _with_body(op) is not None:  # a body in the transaction (run_sql)
                append = _with_body(op)
                assert append is not None
                runs.append(append.run_id)
                step = step or next((e.name for e in append.entries if e.name), None)
        self._holder_conn = conn
        self._holder.hold("transactional step" if step else "write", runs, step)

    def _finish(self, conn: Any, verb: str) -> None:
        if self._holder is not None and conn is self._holder_conn:
            self._holder_conn = None
            self._holder.free()  # before the lock is given up: the next holder writes next
        conn.execute(verb)
        checkpointer = self._checkpoints
        if verb == "COMMIT" and checkpointer is not None:
            checkpointer.commits += 1
            if checkpointer.commits >= checkpoints.EVERY or checkpointer.catch_up:
                checkpointer.committed(conn)

    def stop(self) -> None:
        super().stop()
        if self._checkpoints is not None:
            self._checkpoints.stop()
        if self._holder is not None:
            self._holder.close()

    # -- who holds the write lock ----------------------------------------------------------

    def who_holds(self) -> str:
        """The holder of the write lock as far as can be known: its pid, host, worker,
        what it writes and since when, and whether the process is stopped."""
        holder = read_holder(holder_path(self.path)) if self._holder is not None else None
        workers = self._registered()
        if holder is not None:
            named = [w for w, host, pid in workers if (host, pid) == (holder.host, holder.pid)]
            return holder.describe(named[0] if named else None)
        text = "another process (pid unknown)"
        here = socket.gethostname()
        stopped = [
            f"pid {pid} (worker {w}) is {state}"
            for w, host, pid in workers
            if host == here and (state := process_state(pid)).startswith("stopped")
        ]
        return text + ("; of the registered workers, " + ", ".join(stopped) if stopped else "")

    def write_lock_stall(self, older_than: float = STALL_AFTER) -> str | None:
        """One line if the write lock has been held longer than `older_than` seconds, else
        None. Cheap when it is not: one read of the small holder record."""
        if self._holder is None:
            return None
        holder = read_holder(holder_path(self.path), older_than)
        if holder is None or not self._lock_taken():
            return None
        return (
            f"the SQLite write lock is held by {self.who_holds()}: every writer of the store "
            "waits until that transaction ends (SQLite has one writer at a time; PostgreSQL "
            "has no such lock)"
        )

    def _wait_error(self, seconds: float) -> StoreError:
        return StoreUnavailable(
            f"store {self.url}: the store is locked for more than {seconds:g}s by "
            f"{self.who_holds()}; nothing was written (try again later or pass a longer "
            "timeout; see docs/how-to/choosing-a-store.md)"
        )

    def _lock_taken(self) -> bool:
        """Whether some connection holds the write lock now (a probe that never waits)."""
        try:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        except sqlite3.Error:
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError as exc:
            return _busy(exc)
        finally:
            conn.close()

    def _registered(self) -> list[tuple[str, str, int]]:
        """(id, host, pid) of the workers registered on this store and not stopped."""
        try:
            conn = sqlite3.connect(self.path, timeout=LOCK_SLICE, isolation_level=None)
        except sqlite3.Error:
            return []
        try:
            rows = conn.execute(
                "SELECT id, host, pid FROM workers WHERE stopped_at IS NULL "
                "ORDER BY heartbeat_at DESC LIMIT 100"
            ).fetchall()
            return [(str(w), str(h), int(p)) for w, h, p in rows]
        except sqlite3.Error:
            return []  # not migrated yet
        finally:
            conn.close()

    def _direct_connect(self) -> sqlite3.Connection | None:
        """The callers' own connection; none for `:memory:` (a second one would be another
        database). It never waits for a lock: a busy database sends the call to the queue."""
        if self.path == ":memory:":
            return None
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            self._settings(conn)
        except sqlite3.OperationalError:  # locked right now: queue, try again next call
            conn.close()
            return None
        return conn

    def _read_busy(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and _busy(exc)
