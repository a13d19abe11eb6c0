"""The schema migrations as perdure 6c846c3 shipped them (schema version 20), before each
extension kept its own tables and versions: what builds a store "made by the old code" at
any version, on SQLite or PostgreSQL, for the upgrade tests. Never edit: it is history.
"""

from __future__ import annotations

LEGACY: list[str] = [
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
    # 4: schedules and their ticks (each tick fired, skipped, missed or queued, with why);
    # an event's dedup key (the same event delivered twice reaches a run once);
    # pauses of whole workflows or workers (claims skip them)
    """
    CREATE TABLE schedules (
        name          TEXT PRIMARY KEY,
        workflow      TEXT NOT NULL,
        cron          TEXT,
        every         REAL,
        tz            TEXT NOT NULL DEFAULT 'UTC',
        input         TEXT NOT NULL DEFAULT '{"args":[],"kwargs":{}}',
        catchup       TEXT NOT NULL DEFAULT 'latest',
        catchup_limit INTEGER NOT NULL DEFAULT 10,
        overlap       TEXT NOT NULL DEFAULT 'skip',
        jitter        REAL NOT NULL DEFAULT 0,
        grace         REAL NOT NULL DEFAULT 60,
        paused        INTEGER NOT NULL DEFAULT 0,
        next_fire     REAL,
        source        TEXT NOT NULL DEFAULT 'code',
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL
    );
    CREATE INDEX schedules_due ON schedules (next_fire) WHERE paused = 0;
    CREATE TABLE schedule_ticks (
        schedule  TEXT NOT NULL,
        fire_at   REAL NOT NULL,
        status    TEXT NOT NULL,
        run_id    TEXT,
        reason    TEXT,
        at        REAL NOT NULL,
        PRIMARY KEY (schedule, fire_at)
    );
    CREATE INDEX schedule_ticks_queued ON schedule_ticks (schedule, fire_at)
        WHERE status = 'queued';
    ALTER TABLE events ADD COLUMN dedup_key TEXT;
    CREATE UNIQUE INDEX events_dedup ON events (run_id, dedup_key) WHERE dedup_key IS NOT NULL;
    CREATE TABLE pauses (
        scope   TEXT NOT NULL,
        name    TEXT NOT NULL,
        at      REAL NOT NULL,
        PRIMARY KEY (scope, name)
    )
    """,
    # 5: agents: model usage per call (budgets, `perdure usage`), budgets, long-term memory
    # with full-text search (FTS5 on SQLite, a tsvector on PostgreSQL), progress notes
    """
    CREATE TABLE agent_usage (
        run_id        TEXT NOT NULL,
        position      INTEGER NOT NULL,
        agent         TEXT NOT NULL,
        model         TEXT NOT NULL,
        input_tokens  INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost          REAL NOT NULL,
        at            REAL NOT NULL,
        PRIMARY KEY (run_id, position)
    );
    CREATE INDEX agent_usage_by_agent ON agent_usage (agent, at);
    CREATE TABLE agent_budgets (
        agent           TEXT PRIMARY KEY,
        tokens_per_hour INTEGER,
        tokens_per_day  INTEGER,
        cost_per_hour   REAL,
        cost_per_day    REAL,
        updated_at      REAL NOT NULL
    );
    CREATE TABLE agent_memory (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        agent   TEXT NOT NULL,
        text    TEXT NOT NULL,
        tags    TEXT NOT NULL DEFAULT '',
        run_id  TEXT,
        at      REAL NOT NULL
    );
    CREATE INDEX agent_memory_by_agent ON agent_memory (agent, id);
    /*sqlite*/ CREATE VIRTUAL TABLE agent_memory_fts
        USING fts5(text, tags, agent UNINDEXED, memory_id UNINDEXED);
    /*postgres*/ ALTER TABLE agent_memory ADD COLUMN tsv tsvector
        GENERATED ALWAYS AS (to_tsvector('simple', text || ' ' || tags)) STORED;
    /*postgres*/ CREATE INDEX agent_memory_search ON agent_memory USING gin (tsv);
    CREATE TABLE agent_notes (
        agent   TEXT PRIMARY KEY,
        notes   TEXT NOT NULL,
        run_id  TEXT,
        at      REAL NOT NULL
    )
    """,
    # 6: access control: API tokens (stored hashed) and the append-only audit log
    """
    CREATE TABLE api_tokens (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        hash        TEXT NOT NULL UNIQUE,
        scopes      TEXT NOT NULL,
        created_at  REAL NOT NULL,
        revoked_at  REAL
    );
    CREATE TABLE audit_log (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        at       REAL NOT NULL,
        actor    TEXT NOT NULL,
        action   TEXT NOT NULL,
        target   TEXT NOT NULL,
        detail   TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX audit_by_target ON audit_log (target, id)
    """,
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
    # 8: the audit log says how each action ended (ok, refused, failed) and why, and is
    # searched by actor; rows written before were all of actions that succeeded
    """
    ALTER TABLE audit_log ADD COLUMN outcome TEXT NOT NULL DEFAULT 'ok';
    ALTER TABLE audit_log ADD COLUMN reason TEXT NOT NULL DEFAULT '';
    CREATE INDEX audit_by_actor ON audit_log (actor, id)
    """,
    # 9: dashboard sign-ins are server-side sessions (only the session id's hash is kept):
    # ended on sign-out, dead with their token, expired by the server's idle/absolute limits
    """
    CREATE TABLE dashboard_sessions (
        hash        TEXT PRIMARY KEY,
        token_id    TEXT NOT NULL,
        created_at  REAL NOT NULL,
        seen_at     REAL NOT NULL,
        ended_at    REAL
    );
    CREATE INDEX sessions_by_token ON dashboard_sessions (token_id);
    CREATE INDEX sessions_by_seen ON dashboard_sessions (seen_at)
    """,
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
    # 14 (budgets): a model call reserves its worst case
    # against the agent's budget before it is sent; the row is the call's durable intent
    # (tier, model, estimate), settled into agent_usage when the reply comes, kept as
    # 'unknown' (its estimate counted) when the call was cut off. Runs parked for budget
    # wait in agent_budget_waits, in the order they parked, with what they asked for.
    # agent_specs: each agent a worker serves, with its spec's [budget] (JSON).
    """
    CREATE TABLE agent_reservations (
        run_id    TEXT NOT NULL,
        position  INTEGER NOT NULL,
        attempt   INTEGER NOT NULL,
        agent     TEXT NOT NULL,
        tier      TEXT NOT NULL,
        model     TEXT NOT NULL,
        tokens    INTEGER NOT NULL,
        cost      REAL NOT NULL,
        state     TEXT NOT NULL,
        at        REAL NOT NULL,
        PRIMARY KEY (run_id, position, attempt)
    );
    CREATE INDEX agent_reservations_by_agent ON agent_reservations (agent, state, at);
    CREATE TABLE agent_budget_waits (
        run_id    TEXT PRIMARY KEY,
        agent     TEXT NOT NULL,
        tokens    INTEGER NOT NULL,
        cost      REAL NOT NULL,
        at        REAL NOT NULL
    );
    CREATE INDEX agent_budget_waits_by_agent ON agent_budget_waits (agent, at);
    CREATE TABLE agent_specs (
        agent   TEXT PRIMARY KEY,
        budget  TEXT NOT NULL,
        at      REAL NOT NULL
    )
    """,
    # 15 (pause --now, shared budgets; issue 15). pauses.abort: a workflow or
    # worker paused with `now` (a run's own is runs.pause_requested = 2): its workers cut
    # off the abortable calls in flight. budget_pools: a named budget several agents share
    # ([budget] shared = NAME in their specs), per rolling hour/day; the pool each call
    # counts against is kept with its reservation and its usage.
    """
    ALTER TABLE pauses ADD COLUMN abort INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE budget_pools (
        name            TEXT PRIMARY KEY,
        tokens_per_hour INTEGER,
        tokens_per_day  INTEGER,
        cost_per_hour   REAL,
        cost_per_day    REAL,
        updated_at      REAL NOT NULL
    );
    ALTER TABLE agent_usage ADD COLUMN pool TEXT;
    ALTER TABLE agent_reservations ADD COLUMN pool TEXT;
    CREATE INDEX agent_usage_by_pool ON agent_usage (pool, at);
    CREATE INDEX agent_reservations_by_pool ON agent_reservations (pool, at)
    """,
    # 16 (table changes): the transactional outbox of `App.on_table_change`. A trigger
    # perdure installs on a user's table writes one row per change in the user's own
    # transaction; a worker turns each row into one run and deletes it in one transaction.
    # A row that cannot become a run is kept with the reason (`refused`).
    """
    CREATE TABLE table_changes (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        trigger_name  TEXT NOT NULL,
        op            TEXT NOT NULL,
        tbl           TEXT NOT NULL,
        pk            TEXT,
        new_row       TEXT,
        old_row       TEXT,
        at            REAL NOT NULL,
        refused       TEXT,
        refused_at    REAL
    );
    CREATE INDEX table_changes_pending ON table_changes (trigger_name, id) WHERE refused IS NULL
    """,
    # 17 (brokers): a broker message that can start no run (not JSON, refused by the
    # workflow's input check, over the payload limit), kept with the reason once per
    # (trigger, message id) and acknowledged, so the broker stops redelivering it
    """
    CREATE TABLE dead_messages (
        trigger     TEXT NOT NULL,
        message_id  TEXT NOT NULL,
        kind        TEXT NOT NULL,
        reason      TEXT NOT NULL,
        body        TEXT NOT NULL,
        size        INTEGER NOT NULL,
        at          REAL NOT NULL,
        PRIMARY KEY (trigger, message_id)
    );
    CREATE INDEX dead_messages_by_at ON dead_messages (at)
    """,
    # 18: agent sessions: a framework's conversation history under a session id, in order
    """
    CREATE TABLE agent_session_items (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  TEXT NOT NULL,
        item        TEXT NOT NULL,
        at          REAL NOT NULL
    );
    CREATE INDEX agent_session_items_by_session ON agent_session_items (session_id, id)
    """,
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
]
