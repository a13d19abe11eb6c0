"""SQLite WAL checkpoints off the write path, on a thread of their own.

A checkpoint copies the WAL back into the database file and syncs it. Left to
SQLite, it is done by whichever COMMIT finds the WAL past 1,000 pages: on a run's
path, one commit in ~45 then took up to 15 ms, ~60 us per commit on average. Here
the store's connections checkpoint themselves only past BACKSTOP pages (this
thread is behind, or gone), and a thread started at the first EVERY commits runs
a PASSIVE checkpoint, which never waits for a lock nor blocks a writer, every
EVERY commits. Racing writers, it never finds the whole WAL copied, and SQLite
restarts the WAL only then: so the first commit after it checkpoints once more
itself (the few frames since), and the next writer starts the WAL over.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable

log = logging.getLogger("perdure.store")

EVERY = 400  # commits between checkpoints (a run's commit dirties ~3-8 pages)
BACKSTOP = 10_000  # WAL pages past which a committing connection checkpoints itself


class Checkpointer:
    """Checkpoints one SQLite file's WAL every EVERY commits, on its own thread."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        # commits since the last wake-up, counted by the store (racy increments only delay
        # one a little)
        self.commits = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.catch_up = False  # the thread checkpointed: the next committer finishes it
        self.done = 0  # checkpoints run, for tests and benchmarks

    def committed(self, conn: sqlite3.Connection) -> None:
        """`conn` committed (called on the committing thread, outside a transaction) and
        `commits` reached EVERY or `catch_up` is set: the store counts its commits in
        `commits` itself, so most commits make no call here."""
        if self.catch_up:
            self.catch_up = False
            with contextlib.suppress(sqlite3.Error):  # the next checkpoint tries again
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if self.commits < EVERY:
            return
        self.commits = 0
        with self._lock:
            if self._stopping:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="perdure-checkpoint", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()
        with self._lock:  # a store may be started again
            self._thread, self._stopping = None, False

    def _serve(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    conn = conn or self._connect()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.done += 1
                    self.catch_up = True
                except sqlite3.Error as exc:  # e.g. the file is gone: the backstop remains
                    log.debug("checkpoint failed: %s", exc)
                    if conn is not None:
                        with contextlib.suppress(sqlite3.Error):
                            conn.close()
                    conn = None
        finally:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
