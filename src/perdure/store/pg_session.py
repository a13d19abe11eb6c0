"""A PostgreSQL session lock a worker holds for its life, so others can see its session end.

The lock (`pg_advisory_lock` on the schema's namespace and a random key, recorded
in the worker registry) lives on a connection of its own, outside the pool,
watched by a thread. The server frees it the moment that session ends: the
process died (the kernel closes its socket) or the server cut the connection. A
frozen or partitioned process keeps its session open, so its lock stays held
and only its lease decides. When the connection is lost the thread takes a new
lock (a new key, so a stale one is never mistaken for it) as soon as the server
answers again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import threading
from typing import Any

from . import workers_sql
from .dialect import PostgresDb
from .workers_sql import WorkerRow

log = logging.getLogger("perdure.store")
PROBE = 5.0  # seconds between checks that the lock's connection is alive (it stays busy)


class SessionLock:
    """Holds the session lock of `worker`'s life in `schema` from `start()` until `stop()`."""

    def __init__(
        self, conninfo: str, kwargs: dict[str, Any], schema: str, worker: WorkerRow
    ) -> None:
        self.conninfo = conninfo
        self.kwargs = {
            **kwargs,
            "autocommit": True,
            "connect_timeout": 10,
            "application_name": f"perdure-lock:{schema}",
            # this side notices a dead link; the server's own keepalives are left alone,
            # so a partitioned worker keeps its lock (and its runs) until its lease ends
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        }
        self.schema = schema
        self.worker = worker
        self.key: int | None = None  # the key held now (None: not held)
        self.locked = threading.Event()  # set once the first lock is held
        self._wake = os.pipe()
        self._stopped = False
        self._thread = threading.Thread(target=self._hold, name="perdure-pg-session", daemon=True)

    def start(self, timeout: float) -> bool:
        """Start holding; True once the lock is held, False if not within `timeout`
        seconds (the thread keeps trying)."""
        self._thread.start()
        return self.locked.wait(timeout)

    def stop(self) -> None:
        """Let the lock go (its connection closes)."""
        self._stopped = True
        os.write(self._wake[1], b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            for fd in self._wake:
                os.close(fd)

    def _hold(self) -> None:
        import psycopg

        delay = 0.05
        while not self._stopped:
            conn = None
            try:
                conn = psycopg.connect(self.conninfo, **self.kwargs)
                self._lock(conn)
                delay = 0.05
                while not self._stopped:
                    # the socket turns readable when the server ends the session
                    select.select([conn.fileno(), self._wake[0]], [], [], PROBE)
                    if self._stopped:
                        break
                    conn.execute("SELECT 1")  # raises once the session is gone
            except psycopg.Error as exc:
                if self.key is not None:
                    log.warning("worker %s: session lock lost (%s); taking a new one",
                                self.worker.id, str(exc).strip().splitlines()[:1])  # fmt: skip
                self.key = None
                select.select([self._wake[0]], [], [], delay)
                delay = min(delay * 2, 1.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()  # the server frees the lock with the session
        self.key = None

    def _lock(self, conn: Any) -> None:
        db = PostgresDb(conn, self.schema)
        while True:  # a key taken already (another worker's) is simply not used
            key = 1 + secrets.randbelow(2**31 - 2)
            if workers_sql.take_lock(db, self.schema, self.worker, key):
                self.key = key
                self.locked.set()
                return
