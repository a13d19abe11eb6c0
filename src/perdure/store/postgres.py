"""The PostgreSQL store: the same SQL as SQLite, through psycopg 3, in a schema of its own.

Each process runs one store thread with one connection (batched writes share a
commit, as on SQLite); claims use `FOR UPDATE SKIP LOCKED`, so workers on many
hosts never wait on each other's rows. Tables live in a configurable schema
(default `perdure`) so several apps can share one database.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError
from . import migrations
from .dialect import Db, PostgresDb
from .threaded import ThreadedStore

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def for_postgres(script: str) -> str:
    """A migration script written for SQLite, in PostgreSQL's types."""
    script = re.sub(r"\bREAL\b", "DOUBLE PRECISION", script)
    script = script.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
    return script.replace(") WITHOUT ROWID", ")")


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


_OPTIONS = ("schema", "pooler")


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """(psycopg conninfo, perdure's own options) from a URL: `?schema=`, `?pooler=`."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in _OPTIONS}
    rest = urlencode([(k, v) for k, v in query if k not in _OPTIONS])
    scheme = "postgresql" if parts.scheme == "postgres" else parts.scheme
    return urlunsplit((scheme, parts.netloc, parts.path, rest, parts.fragment)), options


class PostgresStore(ThreadedStore):
    """A Store in a PostgreSQL schema; `url` is a postgresql:// URL (`?schema=` optional)."""

    thread_name = "perdure-postgres"

    def __init__(self, url: str, *, schema: str | None = None) -> None:
        try:
            import psycopg
        except ImportError:
            raise ConfigError(
                "the PostgreSQL store needs psycopg: pip install 'perdure[postgres]'"
            ) from None
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
        self._listener: threading.Thread | None = None

    def _connect(self) -> Any:
        import psycopg

        try:
            conn = psycopg.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=10,
                prepare_threshold=self.prepare_threshold,
            )
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot connect to PostgreSQL at {self.url}: {first}") from None
        return conn

    def _broken(self, conn: Any) -> bool:
        return bool(conn.closed or conn.broken)

    def _db(self, conn: Any) -> Db:
        return PostgresDb(conn, self.schema)

    @property
    def channel(self) -> str:
        return f"perdure_{self.schema}"

    def start(self) -> None:
        """Start the store thread, then the listener for other processes' notifications."""
        super().start()
        with self._lock:
            if self._listener is None or not self._listener.is_alive():
                self._listener = threading.Thread(
                    target=self._listen, name="perdure-pg-listen", daemon=True
                )
                self._listener.start()

    def _listen(self) -> None:
        """LISTEN on the schema's channel; every notification wakes this process's workers."""
        import psycopg

        delay = 0.05
        while self._thread is not None:
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    delay = 0.05
                    self._heard()  # anything sent while we were not listening
                    while self._thread is not None:
                        for _ in conn.notifies(timeout=0.5):
                            self._heard()
            except psycopg.Error:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _migrate(self, conn: Any) -> None:
        db = self._db(conn)
        conn.execute("BEGIN")
        try:
            # one migrator at a time per schema, whichever host it runs on
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            migrations.apply(db, f"{self.url} (schema {self.schema})", for_postgres)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
