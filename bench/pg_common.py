"""PostgreSQL bench plumbing: the psycopg floor, throwaway schemas, commit counting, percentiles."""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .common import ROOT, Config, child_command

T = TypeVar("T")

PG_URL = os.environ.get("PERDURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA_PREFIX = "perdure_bench_"  # the only schemas these benchmarks create or drop


# -- schemas ---------------------------------------------------------------------------------


def connect(schema: str | None = None, *, autocommit: bool = True) -> Any:
    """A psycopg connection to the bench database, its search_path set to `schema`."""
    import psycopg

    conn = psycopg.connect(PG_URL, autocommit=autocommit, connect_timeout=10)
    if schema is not None:
        conn.execute(f'SET search_path TO "{schema}"')
        if not autocommit:
            conn.commit()
    return conn


def new_schema(tag: str) -> str:
    """A schema name no other measurement (or other user of the database) uses."""
    return f"{SCHEMA_PREFIX}{tag}_{os.getpid()}_{secrets.token_hex(3)}"


def app_url(schema: str) -> str:
    """The perdure store URL of `schema`."""
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"


def drop_schema(schema: str) -> None:
    if not schema.startswith(SCHEMA_PREFIX):
        raise ValueError(f"refusing to drop schema {schema!r}: not one of the bench's own")
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            with connect() as conn:
                conn.execute("SET lock_timeout = '30s'")  # a killed worker's backend may linger
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            return
        except psycopg.OperationalError:  # e.g. the server is restarting: try again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextmanager
def fresh_schema(tag: str) -> Iterator[str]:
    """A new schema name for one measurement; the schema is dropped afterwards, whatever happens."""
    schema = new_schema(tag)
    try:
        yield schema
    finally:
        drop_schema(schema)


def _server_started() -> float:
    """When the server last started; waits (up to a minute) for a server that is restarting."""
    import psycopg

    deadline = time.monotonic() + 60
    while True:
        try:
            with connect() as conn:
                row = conn.execute("SELECT extract(epoch FROM pg_postmaster_start_time())")
                return float(row.fetchone()[0])
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def same_server(measure: Callable[[], T], what: str, attempts: int = 3) -> T:
    """`measure()`, taken again if the server restarted meanwhile (other users of a shared
    server may restart it); the measurement's own errors are raised as usual."""
    for _ in range(attempts):
        started = _server_started()
        try:
            result = measure()
        except Exception:
            if _server_started() == started:
                raise
        else:
            if _server_started() == started:
                return result
        print(f"[{what}: the server restarted meanwhile; measuring again]", file=sys.stderr)
    raise RuntimeError(f"{what}: the server restarted during each of {attempts} attempts")


def server_info() -> str:
    """PostgreSQL version and the settings that decide what a commit costs."""
    with connect() as conn:
        version = conn.execute("SHOW server_version").fetchone()[0].split()[0]
        names = ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay")
        settings = [f"{n}={conn.execute(f'SHOW {n}').fetchone()[0]}" for n in names]
    return f"PostgreSQL {version} ({', '.join(settings)})"


def next_xid(conn: Any) -> int:
    """The next transaction id the server will assign (every writing transaction takes one)."""
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    return int(row[0])


# -- the floor -----------------------------------------------------------------------------


class PgFloor:
    """psycopg 3: one small JSON row INSERTed and COMMITted per step, in its own schema."""

    def __init__(self, schema: str) -> None:
        self.conn = connect(autocommit=True)
        self.conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        self.conn.execute(f'SET search_path TO "{schema}"')
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS rows "
            "(run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT, PRIMARY KEY (run_id, seq))"
        )
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id BIGINT PRIMARY KEY, status TEXT NOT NULL, "
            "done_at DOUBLE PRECISION)"
        )
        self.conn.autocommit = False

    def step(self, run_id: str, seq: int, value: Any) -> None:
        self.conn.execute(
            "INSERT INTO rows (run_id, seq, data) VALUES (%s, %s, %s)",
            (run_id, seq, json.dumps(value)),
        )
        self.conn.commit()

    def enqueue(self, job: int) -> None:
        """One job row (the floor's "start a run"), committed on its own."""
        self.conn.execute("INSERT INTO jobs (id, status) VALUES (%s, 'pending')", (job,))
        self.conn.commit()

    def take(self) -> int | None:
        """Claim the oldest pending job (`FOR UPDATE SKIP LOCKED`), committed; None if none."""
        row = self.conn.execute(
            "SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1 "
            "FOR UPDATE SKIP LOCKED"
        ).fetchone()
        if row is None:
            self.conn.commit()
            return None
        self.conn.execute("UPDATE jobs SET status = 'running' WHERE id = %s", (row[0],))
        self.conn.commit()
        return int(row[0])

    def finish_step(self, job: int, seq: int, value: Any, *, last: bool) -> None:
        """A step's INSERT+COMMIT; the last one also marks the job done (same commit)."""
        self.conn.execute(
            "INSERT INTO rows (run_id, seq, data) VALUES (%s, %s, %s)",
            (f"job{job}", seq, json.dumps(value)),
        )
        if last:
            self.conn.execute(
                "UPDATE jobs SET status = 'done', done_at = %s WHERE id = %s", (time.time(), job)
            )
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


# -- counting what a process sends ---------------------------------------------------------------


@dataclass
class SqlCount:
    """Statements (each one client/server round trip, executemany counted once) and write
    transactions: COMMITs, plus writing statements sent outside a transaction (autocommit,
    each its own transaction)."""

    statements: int = 0
    commits: int = 0


SENT = SqlCount()
_WRITES = ("INSERT", "UPDATE", "DELETE", "WITH")  # WITH: perdure's one-statement append
_installed = False
_count_lock = threading.Lock()


def count_sql() -> None:
    """Count every statement and COMMIT this process sends through psycopg (any connection).

    Wraps psycopg's Cursor.execute/executemany, Connection.commit and the BEGIN psycopg sends
    by itself outside autocommit; perdure's store sends `BEGIN`/`COMMIT` as statements, the
    floor lets psycopg begin and calls commit(): both are counted the same way.
    """
    global _installed
    import psycopg

    if _installed:
        return
    _installed = True
    execute, executemany, commit = (
        psycopg.Cursor.execute,
        psycopg.Cursor.executemany,
        psycopg.Connection.commit,
    )

    def counted(cursor: Any, query: Any) -> None:
        text = query.strip().upper() if isinstance(query, str) else ""
        conn = cursor.connection
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        alone = conn.autocommit and idle
        with _count_lock:
            SENT.statements += 1
            if text == "COMMIT" or (alone and text.startswith(_WRITES)):
                SENT.commits += 1

    def execute_counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counted(self, query)
        return execute(self, query, *args, **kwargs)

    def executemany_counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counted(self, query)
        return executemany(self, query, *args, **kwargs)

    def commit_counted(self: Any) -> None:
        with _count_lock:
            SENT.statements += 1
            SENT.commits += 1
        commit(self)

    begin = getattr(psycopg.Connection, "_get_tx_start_command", None)
    if begin is not None:  # psycopg's own BEGIN, sent before a non-autocommit statement

        def begin_counted(self: Any) -> Any:
            with _count_lock:
                SENT.statements += 1
            return begin(self)

        psycopg.Connection._get_tx_start_command = begin_counted  # type: ignore[method-assign]
    psycopg.Cursor.execute = execute_counted  # type: ignore[method-assign]
    psycopg.Cursor.executemany = executemany_counted  # type: ignore[method-assign]
    psycopg.Connection.commit = commit_counted  # type: ignore[method-assign]


def sent() -> tuple[int, int]:
    with _count_lock:
        return SENT.statements, SENT.commits


# -- processes and waiting -----------------------------------------------------------------------


def spawn(module: str, cfg: Config, log: str) -> subprocess.Popen[bytes]:
    """Start `module --child cfg` in the background, its output going to the file `log`."""
    out = open(log, "wb")  # noqa: SIM115 - lives as long as the child
    return subprocess.Popen(child_command(module, cfg), cwd=ROOT, stdout=out, stderr=out)


def stop(proc: subprocess.Popen[bytes], sig: int, timeout: float = 30.0) -> None:
    """Signal a child we started and reap it (SIGKILL if it does not exit in time)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log_tail(path: str, chars: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def last_json(log: str) -> Config:
    """The last JSON line a child wrote to its log (its result), or {} if none."""
    lines = [ln for ln in Path(log).read_text(errors="replace").splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def wait_for(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def wait_gate(gate: str, every: float = 0.001) -> None:
    """In a child: block until the parent creates the file `gate`."""
    while not os.path.exists(gate):
        time.sleep(every)


# -- numbers -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of `values`."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
