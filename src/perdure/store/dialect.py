"""A connection plus its SQL dialect: the one way the store's shared SQL reaches a database.

The store's statements are written once, with `?` placeholders and the subset
of SQL that SQLite and PostgreSQL share (`RETURNING`, `ON CONFLICT`, partial
indexes); a dialect adapts placeholders, integrity errors and row locking.
"""

from __future__ import annotations

import re
import sqlite3
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


ENDED = "ended"  # the payload of a notification that a run ended and nothing else

_TABLES = re.compile(
    r"\b(runs|journal|events|blobs|perdure_meta|schedules|schedule_ticks|pauses|agent_usage|"
    r"agent_budgets|agent_memory|agent_notes|api_tokens|audit_log|workers|dashboard_sessions|"
    r"run_streams|agent_reservations|agent_budget_waits|agent_specs|budget_pools|"
    r"table_changes|dead_messages|agent_session_items)\b"
)


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

    def lock_queue(self, name: str) -> None:
        key = f"perdure-queue:{self.schema}:{name}"
        self.raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))

    def user_scope(self) -> None:
        # transaction-scoped, so it holds behind a transaction-mode pooler too
        self.raw.execute(f'SET LOCAL search_path TO "{self.schema}", public')
