"""The PostgreSQL store: the same SQL as SQLite, through psycopg 3, in a schema of its own.

Each process has one bounded connection pool (`?pool_size=`, default 4) that
everything in it draws from: the store thread (batched writes share a commit,
as on SQLite), the LISTEN thread, and the direct path of a run alone in its
process. Steps never hold a connection while they execute. Claims use
`FOR UPDATE SKIP LOCKED`, so workers on many hosts never wait on each other's
rows. Tables live in a configurable schema (default `perdure`) so several apps
can share one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError, StoreError, StoreUnavailable
from ..extras import require_extra
from . import migrations
from .batching import Op
from .dialect import ENDED, Db, PostgresDb
from .pg_session import SessionLock
from .roles import Listener
from .threaded import ThreadedStore
from .workers_sql import WorkerRow, sessions_gone

T = TypeVar("T")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


_OPTIONS = ("schema", "pooler", "pool_size")
POOL_SIZE = 4  # store thread, listener, direct path, and one to spare
RECONNECT_WAIT = 0.25  # seconds one reconnect attempt of the store thread waits for the pool


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """(psycopg conninfo, perdure's own options): `?schema=`, `?pooler=`, `?pool_size=`."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in _OPTIONS}
    rest = urlencode([(k, v) for k, v in query if k not in _OPTIONS])
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, rest, parts.fragment)), options


class PostgresStore(ThreadedStore):
    """A Store in a PostgreSQL schema; `url` is a postgresql:// URL (`?schema=` optional)."""

    thread_name = "perdure-postgres"
    fused_appends = True

    def __init__(self, url: str, *, schema: str | None = None) -> None:
        require_extra("postgres", "the PostgreSQL store")
        import psycopg

        super().__init__()
        self.conninfo, options = split_url(url)
        self.schema = schema or options.get("schema", "perdure")
        pooler = options.get("pooler", "session")
        if pooler not in ("session", "transaction"):
            raise ConfigError(f"pooler={pooler!r}: use session (default) or transaction")
        # behind a transaction-mode pooler a connection may change between statements:
        # no server-side prepared statements then (the SQL names its schema, no search_path)
        self.prepare_threshold: int | None = None if pooler == "transaction" else 5
        if not _IDENTIFIER.match(self.schema):
            raise ConfigError(
                f"schema {self.schema!r}: use lower-case letters, digits and underscores"
            )
        self.url = redact(url)
        self.db_errors = (psycopg.Error,)
        self.pooler = pooler
        size = options.get("pool_size", str(POOL_SIZE))
        if not (size.isascii() and size.isdigit()) or int(size) < 1:
            raise ConfigError(f"pool_size={size!r}: use a whole number of connections, 1 or more")
        # 1: the store thread only (workers poll); 2: and LISTEN; 3 or more: and direct writes
        self.pool_size = int(size)
        self._pool: Any = None
        self._direct_retry_at = 0.0
        self._listener: threading.Thread | None = None
        self._wake_listener: tuple[int, int] | None = None  # stop() writes a byte to it
        self._sessions: dict[str, SessionLock] = {}  # worker id -> its session lock
        self._listeners: list[Listener] = []
        self._change_listeners: list[Callable[[str | None], None]] = []

    def _connection_kwargs(self) -> dict[str, Any]:
        from psycopg.conninfo import conninfo_to_dict

        kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": self.prepare_threshold}
        if "application_name" not in conninfo_to_dict(self.conninfo):
            kwargs["application_name"] = f"perdure:{self.schema}"  # seen in pg_stat_activity
        return kwargs

    def _open_pool(self) -> Any:
        """The process's pool, opened on first use; a clear one-line error if unreachable."""
        import psycopg
        from psycopg_pool import ConnectionPool

        with self._lock:
            if self._pool is not None:
                return self._pool
            if self._thread is None:
                raise ConfigError(f"the store at {self.url} is closed")
            try:  # one direct attempt first: the pool would only report a timeout
                psycopg.connect(self.conninfo, connect_timeout=10).close()
            except psycopg.Error as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise ConfigError(f"cannot connect to PostgreSQL at {self.url}: {first}") from None
            self._pool = ConnectionPool(
                self.conninfo,
                min_size=1,
                max_size=self.pool_size,
                kwargs={**self._connection_kwargs(), "connect_timeout": 10},
                name=f"perdure-{self.schema}",
                open=True,
                timeout=10.0,
                # a lost connection is replaced on demand; the store's own loop keeps
                # retrying with a short backoff, so the pool need not (its waits grow to minutes)
                reconnect_timeout=0,
            )
            return self._pool

    def _connect(self, timeout: float = 2.0) -> Any:
        from psycopg_pool import PoolTimeout

        pool = self._open_pool()
        try:
            return pool.getconn(timeout=timeout)
        except PoolTimeout:
            raise StoreUnavailable(
                f"store {self.url} unreachable: no connection within {timeout:g} s"
            ) from None

    def _connect_again(self) -> Any:
        """A short wait: the pool tries once and gives up on a refused connection
        (`reconnect_timeout=0`), so a longer wait here only outlasts an outage the
        server is already back from; the store's loop retries with its own backoff."""
        return self._connect(timeout=RECONNECT_WAIT)

    def _disconnect(self, conn: Any) -> None:
        pool = self._pool
        if pool is None or pool.closed:
            conn.close()
        else:
            pool.putconn(conn)  # a broken connection is discarded and replaced by the pool

    def _direct_connect(self) -> Any | None:
        """A pool connection for the direct path; never waits long on the caller's thread."""
        if self.pool_size < 3 or time.monotonic() < self._direct_retry_at:
            return None
        try:
            return self._connect(timeout=0.05)
        except (ConfigError, StoreUnavailable):
            self._direct_retry_at = time.monotonic() + 5.0
            return None

    def _broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def _connection_lost(self, conn: Any, exc: BaseException) -> bool:
        """Operational and interface errors are the server or the link failing (a
        restart's AdminShutdown, "cannot exit pipeline mode while busy", a COMMIT cut
        off, a serialization failure): the store is unavailable for now, whatever the
        connection's flags say yet; never an error of the workflow."""
        import psycopg

        lost = (psycopg.OperationalError, psycopg.InterfaceError)
        return isinstance(exc, lost) or super()._connection_lost(conn, exc)

    def _start_failure(self, exc: BaseException, *, lost: bool) -> BaseException:
        """The server lost during start-up, after the first connection worked (a restart
        begins): the same one-line error as a server never reached, so a worker fails fast
        (`perdure worker` exits 2) and its supervisor starts another, instead of a raw
        driver error and a traceback."""
        if isinstance(exc, StoreUnavailable) or (lost and isinstance(exc, self.db_errors)):
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return ConfigError(
                f"cannot connect to PostgreSQL at {self.url}: lost during start-up ({first})"
            )
        return exc

    def _db(self, conn: Any) -> Db:
        return PostgresDb(conn, self.schema)

    @property
    def channel(self) -> str:
        return f"perdure_{self.schema}"

    @property
    def changes_channel(self) -> str:
        """Where the triggers on users' tables NOTIFY (the trigger's name as payload)."""
        return f"perdure_{self.schema}_changes"

    def listen(self, listener: Listener) -> None:
        """roles.Notices: wake `listener` (from the LISTEN thread) when another process may
        have made work runnable, or ended a run and nothing else (its result's waiters care;
        a claim finds nothing new)."""
        self._listeners.append(listener)

    def _heard(self, ended: bool = False) -> None:
        for listener in list(self._listeners):
            try:
                listener.ended_elsewhere() if ended else listener.notify()
            except Exception:  # a listener must never stop the notifications
                logging.getLogger("perdure.store").exception("store listener failed")

    def subscribe_changes(self, listener: Callable[[str | None], None]) -> None:
        """Call `listener` (from the listener thread) with a trigger's name when a change
        it recorded commits, and with None when notifications may have been missed."""
        self._change_listeners.append(listener)

    def _changed(self, trigger: str | None) -> None:
        for listener in list(self._change_listeners):
            try:
                listener(trigger)
            except Exception:  # a listener must never stop the notifications
                logging.getLogger("perdure.store").exception("change listener failed")

    # -- run_sql(apart=True): on a connection of its own, never the store thread's

    async def _apart(self, fn: Callable[[Db], T], write: bool) -> T:
        """Run `fn` on a pool connection in a thread, in a transaction of its own if it
        writes: it may wait for a user's table (a trigger's DDL), and must not hold up the
        store thread's commits meanwhile."""
        import psycopg

        def call() -> T:
            conn = self._connect()
            try:
                if not write:
                    return fn(self._db(conn))
                with conn.transaction():
                    return fn(self._db(conn))
            finally:
                self._disconnect(conn)

        try:
            return await asyncio.to_thread(call)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(f"store {self.url} unreachable ({exc})") from None
        except psycopg.Error as exc:
            raise StoreError(f"store {self.url}: {exc}") from None

    def start(self) -> None:
        """Start the store thread, then the listener for other processes' notifications.

        Behind a transaction-mode pooler LISTEN cannot work (it is session state):
        workers fall back to their one consolidated poll.
        """
        super().start()
        if self.pool_size < 2 or self.pooler == "transaction":
            return
        with self._lock:
            if self._wake_listener is None:
                pipe = self._wake_listener = os.pipe()
                self._listener = threading.Thread(
                    target=self._listen, args=(pipe,), name="perdure-pg-listen", daemon=True
                )
                self._listener.start()

    def _listen(self, pipe: tuple[int, int]) -> None:
        """LISTEN on the schema's channel; every notification wakes this process's workers.

        Runs until stop() replaces `pipe` and writes a byte to it.
        """
        import psycopg

        delay = 0.05
        wake = pipe[0]
        while self._wake_listener is pipe:
            conn = None
            try:
                conn = self._connect()
                conn.execute(f'LISTEN "{self.channel}"')
                conn.execute(f'LISTEN "{self.changes_channel}"')
                delay = 0.05
                self._heard()  # anything sent while we were not listening
                self._changed(None)
                while self._wake_listener is pipe:
                    # the socket or stop()'s byte on the pipe, whichever comes first
                    select.select([conn.fileno(), wake], [], [], 5.0)
                    for note in conn.notifies(timeout=0.0):
                        if note.channel == self.changes_channel:
                            self._changed(note.payload)
                        else:
                            self._heard(ended=note.payload == ENDED)
                conn.execute("UNLISTEN *")  # back to the pool as it came
            except (psycopg.Error, ConfigError, StoreUnavailable):
                select.select([wake], [], [], delay)
                delay = min(delay * 2, 2.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        self._disconnect(conn)

    # -- worker sessions: a lock held for a worker's life proves its session still lives --

    async def worker_session(self, row: WorkerRow) -> bool:
        """Hold a session lock for `row`'s worker until it stops or this store closes;
        waits up to a few seconds for the first lock (the thread keeps trying). Behind a
        transaction-mode pooler a session is no proof of anything: False."""
        if self.pooler == "transaction":
            return False
        with self._lock:
            if row.id in self._sessions:
                return True
            holder = self._sessions[row.id] = SessionLock(
                self.conninfo, self._connection_kwargs(), self.schema, row
            )
        await asyncio.to_thread(holder.start, 5.0)
        return True

    async def sessions_gone(self, me: str, since: float) -> list[WorkerRow]:
        if self.pooler == "transaction":
            return []
        gone: list[WorkerRow] = await self.perform(
            Op(sessions_gone, (self.schema, me, since), {}, False), True
        )
        return gone

    async def worker_beat(self, row: WorkerRow) -> None:
        await super().worker_beat(row)
        if row.stopped_at is None:
            return
        with self._lock:  # a worker stopped: its session ends with it
            holder = self._sessions.pop(row.id, None)
        if holder is not None:
            holder.stop()

    def stop(self) -> None:
        """Stop the store thread, then close the pool (a listener's connection closes on return)."""
        with self._lock:
            holders, self._sessions = list(self._sessions.values()), {}
        for holder in holders:  # a store closed under a live worker ends its sessions too
            holder.stop()
        super().stop()
        listener = self._listener
        with self._lock:
            pipe, self._wake_listener = self._wake_listener, None
        if pipe is not None:
            os.write(pipe[1], b"x")  # the listener returns at once
            if listener is not None and listener is not threading.current_thread():
                listener.join(timeout=2.0)  # its connection goes back before the pool closes
            if listener is None or not listener.is_alive():
                for fd in pipe:
                    os.close(fd)
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=1.0)

    def _migrate(self, conn: Any) -> None:
        db = self._db(conn)
        conn.execute("BEGIN")
        try:
            # one migrator at a time per schema, whichever host it runs on
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            migrations.apply(db, f"{self.url} (schema {self.schema})")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):  # a lost connection: the error that lost it
                conn.execute("ROLLBACK")
            raise
