"""A connection plus its SQL dialect: the one way the store's shared SQL reaches a database.

The store's statements are written once, with `?` placeholders and the subset
of SQL that SQLite and PostgreSQL share (`RETURNING`, `ON CONFLICT`, partial
indexes); a dialect adapts placeholders, integrity errors, row locking and the
column types of migration scripts. On PostgreSQL every table is named with its
schema: the core's below, an extension's once it declares them (`add_tables`).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, Protocol


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Db:
    """A DB-API connection and its dialect (the SQLite one by default)."""

    integrity_errors: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)
    dialect = "sqlite"
    claim_lock = ""  # appended to the claim SELECT: PostgreSQL skips rows other workers lock
    fused_append = False  # a plain append as one data-modifying CTE (PostgreSQL)
    # Where a run's next journal seq and its last write's key are kept: on the run row
    # (PostgreSQL: the fence's UPDATE locks that row anyway), or (SQLite) read from the
    # journal itself, so a step's write changes no page of the runs table.
    tail_on_run = False
    channel = ""  # the NOTIFY channel (PostgreSQL)
    schema = "main"  # where the store's tables are (SQLite: the store's own file)

    def __init__(self, conn: Any) -> None:
        self.raw = conn  # handed to transactional steps as `current_step().db`
        # SQLite runs the store's SQL as written: its connection's own methods, no call between
        self.execute: Callable[..., Cursor] = conn.execute
        self.executemany: Callable[[str, Iterable[Sequence[Any]]], Any] = conn.executemany

    def sql(self, text: str) -> str:
        return text

    def notify(self, ended: bool = False) -> None:
        """Tell other processes, when this transaction commits, that work may be runnable
        (`ended`: only that a run ended, freeing nothing a claim counts)."""

    def notifying(self, ended: bool = False) -> tuple[str, tuple[str, ...]]:
        """`notify` as a RETURNING clause of an UPDATE of one row, saving its own statement
        (a round trip on PostgreSQL); with its parameters. Empty where notify is a no-op."""
        return "", ()

    def user_scope(self) -> None:
        """Before a transactional step's body: let its unqualified names mean the app's tables."""

    def lock_queue(self, name: str) -> None:
        """Serialise claims that count a limited queue (SQLite's BEGIN IMMEDIATE already does)."""

    def lock_schema(self) -> None:
        """Serialise migrations of the store's schema, whichever process runs them, until the
        transaction ends (SQLite's BEGIN IMMEDIATE already does)."""

    def statements(self, script: str) -> list[str]:
        """A migration script's statements for this database: split on `;`, each marked
        `/*sqlite*/` or `/*postgres*/` kept for that database only."""
        kept = (
            _for_dialect(part.strip(), self.dialect) for part in self.translate(script).split(";")
        )
        return [text for text in kept if text]

    def translate(self, script: str) -> str:
        """A migration script (written for SQLite) in this database's column types."""
        return script

    def server_time(self) -> float | None:
        """The database server's clock in epoch seconds; None where there is no server
        (SQLite: a file, on one host)."""
        return None


def server_time(db: Db) -> float | None:
    """`db.server_time()`, as a function of the connection (`Store.run_sql(server_time, ...)`)."""
    return db.server_time()


def _for_dialect(statement: str, dialect: str) -> str:
    """A statement marked `/*sqlite*/` or `/*postgres*/` runs on that database only."""
    for name in ("sqlite", "postgres"):
        tag = f"/*{name}*/"
        if statement.startswith(tag):
            return statement[len(tag) :].strip() if name == dialect else ""
    return statement


def for_postgres(script: str) -> str:
    """A migration script written for SQLite, in PostgreSQL's types."""
    script = re.sub(r"\bREAL\b", "DOUBLE PRECISION", script)
    script = script.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
    return script.replace(") WITHOUT ROWID", ")")


ENDED = "ended"  # the payload of a notification that a run ended and nothing else

_names = ["runs", "journal", "events", "blobs", "perdure_meta", "pauses", "workers", "run_streams",
          "worker_versions", "code_versions"]  # fmt: skip
_TABLES = re.compile(rf"\b({'|'.join(_names)})\b")
_adding = threading.Lock()
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def add_tables(names: Iterable[str]) -> None:
    """Name these tables (an extension's) with the store's schema on PostgreSQL as well."""
    global _TABLES
    with _adding:
        new = [n for n in names if n not in _names]
        if not new:
            return
        for name in new:
            if not _IDENTIFIER.fullmatch(name):
                raise ValueError(
                    f"table name {name!r}: use lower-case letters, digits, underscores"
                )
        _names.extend(new)
        _TABLES = re.compile(rf"\b({'|'.join(_names)})\b")
        _pyformat.cache_clear()


@lru_cache(maxsize=1024)
def _pyformat(text: str, schema: str) -> str:
    """`?` to `%s`, and every table named with its schema (no session search_path needed)."""
    text = _TABLES.sub(lambda m: f'"{schema}".{m.group(1)}', text)
    return text.replace("%", "%%").replace("?", "%s")


@lru_cache(maxsize=1)
def _pg_integrity_errors() -> tuple[type[Exception], ...]:
    import psycopg

    return (psycopg.errors.IntegrityError,)


class PostgresDb(Db):
    """psycopg 3: `%s` placeholders, UniqueViolation, `FOR UPDATE SKIP LOCKED` claims."""

    dialect = "postgres"
    claim_lock = " FOR UPDATE SKIP LOCKED"
    fused_append = True
    tail_on_run = True

    def __init__(self, conn: Any, schema: str = "perdure") -> None:
        self.raw = conn
        self.schema = schema
        self.channel = f"perdure_{schema}"
        self.integrity_errors = _pg_integrity_errors()
        self.execute = self._execute
        self.executemany = self._executemany

    def sql(self, text: str) -> str:
        return _pyformat(text, self.schema)

    def _execute(self, text: str, params: Sequence[Any] = ()) -> Cursor:
        return self.raw.execute(self.sql(text), params)  # type: ignore[no-any-return]

    def _executemany(self, text: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(self.sql(text), list(rows))

    def notify(self, ended: bool = False) -> None:
        self.raw.execute("SELECT pg_notify(%s, %s)", (self.channel, ENDED if ended else ""))

    def notifying(self, ended: bool = False) -> tuple[str, tuple[str, ...]]:
        return " RETURNING pg_notify(?, ?)", (self.channel, ENDED if ended else "")

    def lock_schema(self) -> None:
        # the key the store's own migration takes too (postgres.py)
        self.raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))

    def translate(self, script: str) -> str:
        return for_postgres(script)

    def server_time(self) -> float | None:
        row = self.raw.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()
        return float(row[0])

    def lock_queue(self, name: str) -> None:
        key = f"perdure-queue:{self.schema}:{name}"
        self.raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))

    def user_scope(self) -> None:
        # transaction-scoped, so it holds behind a transaction-mode pooler too
        self.raw.execute(f'SET LOCAL search_path TO "{self.schema}", public')
