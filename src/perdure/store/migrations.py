"""Schema migrations of the core tables: an ordered list of scripts and the version recorded
in the store.

Version N of the schema is what the first N scripts build. A store whose
recorded version is above `LATEST` was written by a newer perdure: opening it
raises `SchemaVersionError` and changes nothing. An extension's tables have
migrations and a version row of their own (extensions.py); the scripts that once
made them here are left empty, so the numbers keep their meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import SchemaVersionError
from .dialect import Db

MOVED = ""  # a script whose tables an extension now makes (its `legacy` names the number)

MIGRATIONS: list[str] = [
    # 1: runs, journal, events, blobs
    """
    CREATE TABLE runs (
        id              TEXT PRIMARY KEY,
        workflow        TEXT NOT NULL,
        status          TEXT NOT NULL,
        input           TEXT NOT NULL,
        code_version    TEXT NOT NULL DEFAULT '',
        result          TEXT,
        error           TEXT,
        parent_id       TEXT,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        wake_at         REAL,
        deadline_at     REAL,
        waiting_for     TEXT,
        lease_owner     TEXT,
        lease_until     REAL,
        lease_epoch     INTEGER NOT NULL DEFAULT 0,
        recoveries      INTEGER NOT NULL DEFAULT 0,
        pause_requested INTEGER NOT NULL DEFAULT 0,
        next_seq        INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_by_status ON runs (status, wake_at);
    CREATE INDEX runs_by_workflow ON runs (workflow, status);
    CREATE INDEX runs_by_parent ON runs (parent_id);
    CREATE TABLE journal (
        run_id   TEXT NOT NULL,
        seq      INTEGER NOT NULL,
        position INTEGER,
        kind     TEXT NOT NULL,
        name     TEXT NOT NULL DEFAULT '',
        data     TEXT,
        attempt  INTEGER NOT NULL DEFAULT 0,
        final    INTEGER NOT NULL DEFAULT 0,
        at       REAL NOT NULL,
        epoch    INTEGER,
        worker   TEXT,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX journal_one_outcome ON journal (run_id, position) WHERE final = 1;
    CREATE TABLE events (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL,
        name        TEXT NOT NULL,
        payload     TEXT NOT NULL,
        sent_at     REAL NOT NULL,
        consumed_at INTEGER
    );
    CREATE INDEX events_pending ON events (run_id, name, consumed_at, id);
    CREATE TABLE blobs (
        key        TEXT PRIMARY KEY,
        data       TEXT NOT NULL
    );
    """,
    # 2: retention (gc walks a workflow's finished runs oldest first) and blob references
    # (a blob is deleted only when no journal entry, input or result still names it)
    """
    CREATE INDEX runs_finished ON runs (workflow, updated_at, id)
        WHERE status IN ('completed', 'failed', 'cancelled', 'dead');
    CREATE INDEX journal_blob_refs ON journal (data) WHERE data LIKE '{"$perdure_blob%';
    CREATE INDEX runs_input_blob_refs ON runs (input) WHERE input LIKE '{"$perdure_blob%';
    CREATE INDEX runs_result_blob_refs ON runs (result) WHERE result LIKE '{"$perdure_blob%'
    """,
    # 3: queues: a run's queue, priority and partition key; when it first started (rate limits)
    """
    ALTER TABLE runs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN partition_key TEXT;
    ALTER TABLE runs ADD COLUMN started_at REAL;
    CREATE INDEX runs_by_queue ON runs (queue, status)
    """,
    # 4: an event's dedup key (the same event delivered twice reaches a run once); pauses of
    # whole workflows or workers (claims skip them). (Schedules and their ticks, made here
    # before, are triggers/schedule_sql.py's.)
    """
    ALTER TABLE events ADD COLUMN dedup_key TEXT;
    CREATE UNIQUE INDEX events_dedup ON events (run_id, dedup_key) WHERE dedup_key IS NOT NULL;
    CREATE TABLE pauses (
        scope   TEXT NOT NULL,
        name    TEXT NOT NULL,
        at      REAL NOT NULL,
        PRIMARY KEY (scope, name)
    )
    """,
    MOVED,  # 5: agents' usage, budgets, memory and notes (agent/budget_sql.py, memory_sql.py)
    MOVED,  # 6: API tokens and the audit log (server/access_sql.py)
    # 7: workers say who and where they are (host, pid) and that they are alive, busy or idle
    """
    CREATE TABLE workers (
        id            TEXT PRIMARY KEY,
        host          TEXT NOT NULL,
        pid           INTEGER NOT NULL,
        started_at    REAL NOT NULL,
        heartbeat_at  REAL NOT NULL,
        concurrency   INTEGER NOT NULL,
        running       INTEGER NOT NULL DEFAULT 0,
        stopped_at    REAL
    );
    CREATE INDEX workers_by_heartbeat ON workers (heartbeat_at)
    """,
    MOVED,  # 8: the audit log's outcome and reason (server/access_sql.py)
    MOVED,  # 9: dashboard sessions (server/access_sql.py)
    # 10: a run remembers the key of the last fenced write that landed, so a worker whose
    # connection died mid-commit can tell, once the store is back, whether it did
    """
    ALTER TABLE runs ADD COLUMN last_append TEXT
    """,
    # 11: each worker says how far its host's clock is from the store server's
    """
    ALTER TABLE workers ADD COLUMN clock_offset REAL
    """,
    # 12: a run's stream: what its steps write while they run (tokens, progress), in order,
    # with markers where an attempt began again; never needed for replay
    """
    CREATE TABLE run_streams (
        run_id  TEXT NOT NULL,
        seq     INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        topic   TEXT NOT NULL,
        data    TEXT,
        at      REAL NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE INDEX run_streams_by_topic ON run_streams (run_id, topic)
    """,
    # 13: proof that a worker is dead: its process (boot, pid namespace, start time), and
    # on PostgreSQL the session lock it holds for its life (key, and the server start
    # under which it was taken: a server restart frees every lock and proves nothing)
    """
    ALTER TABLE workers ADD COLUMN proc TEXT;
    ALTER TABLE workers ADD COLUMN lock_key INTEGER;
    ALTER TABLE workers ADD COLUMN lock_server REAL
    """,
    MOVED,  # 14: budget reservations, parked runs, agents' specs (agent/budget_sql.py)
    # 15 (pause --now; issue 15): a workflow or worker paused with `now` (a run's own is
    # runs.pause_requested = 2): its workers cut off the abortable calls in flight. (Shared
    # budgets, made here before, are agent/budget_sql.py's.)
    """
    ALTER TABLE pauses ADD COLUMN abort INTEGER NOT NULL DEFAULT 0
    """,
    MOVED,  # 16: the table-change outbox (triggers/changes_sql.py)
    MOVED,  # 17: dead broker messages (triggers/dead_sql.py)
    MOVED,  # 18: agent sessions' items (integrations/agent_session_sql.py)
    # 19 (SQLite): runs_by_parent holds child runs only, so a run with no parent (most)
    # writes no page of it when created: one WAL frame fewer per start. Lookups by parent
    # (`parent_id = ?`, `IN`) imply NOT NULL and still use it. PostgreSQL keeps its index.
    """
    /*sqlite*/DROP INDEX runs_by_parent;
    /*sqlite*/CREATE INDEX runs_by_parent ON runs (parent_id) WHERE parent_id IS NOT NULL
    """,
    # 20 (SQLite): a write's key on its last journal entry. SQLite reads a run's next seq
    # from the journal (MAX(seq) under the write lock) and keeps a write's key there, so
    # a step's write changes no page of the runs table (runs.next_seq and last_append
    # then move only on PostgreSQL, and last_append for writes with no entries).
    """
    /*sqlite*/ALTER TABLE journal ADD COLUMN write_key TEXT
    """,
    # 21: each extension keeps its own tables and version row from here. What the store's
    # version was before (if it had one) tells which of an extension's tables perdure
    # made here once (the extension's `legacy`): kept, not made again.
    """
    INSERT INTO perdure_meta (key, value)
        SELECT 'legacy_version', value FROM perdure_meta WHERE key = 'schema_version'
    """,
    # 22 (deploys; issue 36): a worker's build and the version of each workflow it holds;
    # when each workflow version was first deployed (a newer one gets to upgrade runs
    # first); on a run, the version whose check found it incompatible (it is left for a
    # worker of its own version, or waits for one)
    """
    ALTER TABLE workers ADD COLUMN build TEXT;
    CREATE TABLE worker_versions (
        worker_id   TEXT NOT NULL,
        workflow    TEXT NOT NULL,
        version     TEXT NOT NULL,
        since       REAL NOT NULL,
        PRIMARY KEY (worker_id, workflow)
    );
    CREATE INDEX worker_versions_by_version ON worker_versions (workflow, version);
    CREATE TABLE code_versions (
        workflow    TEXT NOT NULL,
        version     TEXT NOT NULL,
        first_seen  REAL NOT NULL,
        PRIMARY KEY (workflow, version)
    );
    ALTER TABLE runs ADD COLUMN version_checked TEXT
    """,
]

LATEST = len(MIGRATIONS)


def recorded_version(db: Db, where: str) -> int:
    """The schema version `db` records (0 if none); SchemaVersionError if newer than LATEST."""
    row = db.execute("SELECT value FROM perdure_meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version > LATEST:
        raise SchemaVersionError(
            f"store {where} has schema version {version}, newer than this perdure "
            f"understands ({LATEST}); upgrade perdure. Nothing was changed."
        )
    return version


def apply(db: Db, where: str) -> int:
    """Bring the schema `db` reaches up to LATEST inside the caller's transaction.

    Returns the version found. Raises SchemaVersionError, changing nothing, if the
    store was written by a newer perdure; `where` names the store in that message.
    """
    db.execute("CREATE TABLE IF NOT EXISTS perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
    version = recorded_version(db, where)
    run_scripts(db, MIGRATIONS[version:])
    record(db, "schema_version", LATEST)
    return version


def run_scripts(db: Db, scripts: Sequence[str]) -> None:
    """Run migration scripts in order, each in `db`'s dialect."""
    for script in scripts:
        for statement in db.statements(script):
            db.execute(statement)


def record(db: Db, key: str, version: int) -> None:
    """Keep `version` as the schema version under `key` in perdure_meta."""
    db.execute(
        "INSERT INTO perdure_meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, str(version)),
    )
