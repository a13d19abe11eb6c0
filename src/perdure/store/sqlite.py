"""The embedded SQLite store: one file, WAL, many processes, group commit.

The shared store thread (threaded.py) batches writes, so several active runs
share one fsync. `BEGIN IMMEDIATE` with a busy timeout serialises writers across
processes; a busy database is waited for, never reported to the user as
"database is locked".
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time

from ..errors import ConfigError
from . import migrations
from .dialect import Db
from .threaded import ThreadedStore

log = logging.getLogger("perdure.store")


class SQLiteStore(ThreadedStore):
    """A Store on one SQLite file (or `:memory:` for a single process)."""

    def __init__(self, path: str, *, synchronous: str = "FULL", busy_timeout: float = 60.0) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ConfigError(f"sqlite synchronous={synchronous!r}: use OFF, NORMAL, FULL or EXTRA")
        super().__init__()
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        self.url = f"sqlite:///{path}"

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
        while True:
            try:
                return self._open_once()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise ConfigError(
                        f"{self.path!r} is not a perdure SQLite store: {exc}"
                    ) from None
                if time.monotonic() > deadline:
                    raise ConfigError(f"SQLite store {self.path!r} stayed locked: {exc}") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _open_once(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open SQLite store {self.path!r}: {exc}") from None
        conn.row_factory = sqlite3.Row
        try:
            self._check_foreign(conn)  # before any pragma: a refused file stays byte-identical
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
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

    def _begin(self, conn: sqlite3.Connection) -> None:
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                log.warning("sqlite store busy for %.0fs; still waiting", self.busy_timeout)
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        self._begin(conn)
        try:
            migrations.apply(Db(conn), repr(self.path))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _inline_connect(self) -> sqlite3.Connection | None:
        """The callers' own connection; none for `:memory:` (a second one would be another
        database). It never waits for a lock: a busy database sends the call to the queue."""
        if self.path == ":memory:":
            return None
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
        except sqlite3.OperationalError:  # locked right now: queue, try again next call
            conn.close()
            return None
        return conn

    def _busy(self, exc: BaseException) -> bool:
        text = str(exc)
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)

    def _inline_begin(self, conn: sqlite3.Connection) -> bool:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False  # another writer holds the lock: queue instead of waiting
        return True
