"""Stores made before each extension kept its own tables: opened by this perdure they keep
every row, run no DDL again, and each extension records its version on first use.

`store_v20/store.db` was made by perdure 6c846c3 (store_v20/make_store.py), a row or
more in every table; `store_v20/migrations.py` holds that perdure's migrations, to build a
PostgreSQL schema (or an older SQLite file) the same way.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from store_v20.migrations import LEGACY

from fresh_stores import PG_URL
from perdure.agent.budget_sql import BUDGETS, Budgets
from perdure.agent.memory_sql import MEMORY, AgentMemory
from perdure.integrations.agent_session_sql import AGENT_SESSIONS, AgentSessions
from perdure.integrations.claude_agent_sql import CLAUDE_SESSIONS
from perdure.server.access_sql import ACCESS, Access
from perdure.store import SQLiteStore
from perdure.store.base import Store
from perdure.store.dialect import Db, PostgresDb
from perdure.store.migrations import LATEST
from perdure.triggers.changes_sql import OUTBOX, ChangeRow, Outbox, TableTrigger
from perdure.triggers.dead_sql import DEAD, DeadMessages
from perdure.triggers.health_sql import HEALTH
from perdure.triggers.schedule_sql import SCHEDULES, Schedules

# an extension the old perdure did not have makes its own tables as a store opens (declared
# `at_open`, imported here so every order of the tests sees it): not the extensions' upgrade
assert CLAUDE_SESSIONS.at_open and HEALTH.at_open
NEWER = frozenset({"claude_sessions", "claude_session_entries", "claude_session_entries_once",
                   "claude_session_entries_by_key", "claude_session_summaries",
                   "trigger_health"})  # fmt: skip

T = TypeVar("T")
STORE_V20 = Path(__file__).with_name("store_v20") / "store.db"
EXTENSIONS = (SCHEDULES, BUDGETS, MEMORY, ACCESS, OUTBOX, DEAD, AGENT_SESSIONS)
NOW = 1_700_000_000.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def schema_of(path: Path) -> set[tuple[str, str, str | None]]:
    """Every table, index and trigger of a SQLite file, with its SQL, read without writing."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        )}  # fmt: skip
    finally:
        conn.close()


def meta(store: Store) -> dict[str, str]:
    def read(db: Db) -> dict[str, str]:
        return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM perdure_meta")}

    return run(store.run_sql(read, write=False))


def every_extension_read(store: Store) -> dict[str, Any]:
    """What each extension finds of the rows the old perdure wrote."""

    async def read() -> dict[str, Any]:
        budgets, memory, access = Budgets(store), AgentMemory(store), Access(store)
        schedule = await Schedules(store).get_schedule("nightly")
        session = await access.find_session("sdigest-1")
        return {
            "schedule": None if schedule is None else (schedule.cron, schedule.next_fire),
            "ticks": [
                (t.status, t.reason) for t in await Schedules(store).schedule_ticks("nightly")
            ],
            "usage": [(u.agent, u.input_tokens, u.pool) for u in await budgets.usage(None, 0.0)],
            "spent": await budgets.spent("helper", 0.0),
            "budget": await budgets.get_budget("helper"),
            "shared": await budgets.get_shared_budget("team"),
            "declared": await budgets.declared_agent("helper"),
            "held": [(r.run_id, r.state, r.pool) for r in await budgets.reservations(None, 0.0)],
            "parked": await budgets.budget_parked("helper"),
            "recalled": [m.text for m in await memory.recall("helper", "email", 5)],
            "notes": await memory.get_notes("helper"),
            "tokens": [(t.id, t.name) for t in await access.list_tokens()],
            "session": None if session is None else session.name,
            "audit": [(a.action, a.outcome, a.reason) for a in await access.audit_log()],
            "dead": [(d.trigger, d.message_id) for d in await DeadMessages(store).dead_messages()],
            "items": await AgentSessions(store).agent_session_items("conv-1"),
            "pending": (await Outbox(store).change_counts("orders"))[0],
        }

    return run(read())


OLD_ROWS = {
    "schedule": ("0 3 * * *", NOW + 86400),
    "ticks": [("skipped", "overlap")],
    "usage": [("helper", 100, "team")],
    "spent": (170, 0.6),  # the usage row and the open reservation
    "recalled": ["the customer prefers email"],
    "notes": "called the customer",
    "tokens": [("t1", "ops")],
    "session": "ops",
    "audit": [("run.cancel", "refused", "finished")],
    "dead": [("inbox", "m-1")],
    "items": ['{"role": "user", "content": "hi"}'],
    "pending": 1,
    "held": [("run-1", "open", "team")],
    "parked": [("run-2", 5000, 1.0)],
    "declared": '{"tokens_per_day": 1000}',
}


@pytest.fixture
def old_file(tmp_path: Path) -> Path:
    path = tmp_path / "store.db"
    shutil.copyfile(STORE_V20, path)
    return path


def test_a_store_made_before_extensions_keeps_its_rows_and_runs_no_ddl(old_file: Path) -> None:
    """Every extension reads what the old perdure wrote; the file's tables, indexes and
    triggers are exactly as they were; each extension's version is recorded as made."""
    before = schema_of(old_file)
    store = SQLiteStore(str(old_file))
    store.start()
    try:
        found = every_extension_read(store)
        recorded = meta(store)
    finally:
        store.stop()
    for key, value in OLD_ROWS.items():
        assert found[key] == value, key
    assert found["budget"].tokens_per_day == 1000 and found["shared"].cost_per_day == 5.0
    after = schema_of(old_file)
    # only the core migrations past 21 changed the file (22: code versions, issue 36)
    changed = {name for _, name, _ in after ^ before}
    assert changed - NEWER == {"runs", "workers", "worker_versions", "worker_versions_by_version",
                               "code_versions"}  # fmt: skip
    assert recorded["schema_version"] == str(LATEST) and recorded["legacy_version"] == "20"
    assert {ext.name: recorded[ext.key] for ext in EXTENSIONS} == {
        ext.name: str(ext.latest) for ext in EXTENSIONS
    }


def test_the_old_table_trigger_still_records_and_its_changes_become_runs(old_file: Path) -> None:
    """The SQLite trigger the old perdure put on a user's table is kept as it was (installing
    it again changes nothing) and what it recorded, before and after, becomes runs."""
    store = SQLiteStore(str(old_file))
    store.start()
    try:
        outbox = Outbox(store)
        trigger = TableTrigger("orders", "orders", ("insert",))
        assert run(outbox.install_table_trigger(trigger)) is False
        assert run(outbox.table_trigger_state(trigger)) == (True, True, True)
        conn = sqlite3.connect(old_file, isolation_level=None)
        conn.execute("INSERT INTO orders (id, item) VALUES (2, 'pen')")
        conn.close()

        def build(change: ChangeRow) -> Any:
            from perdure.store.base import NewRun

            return NewRun(f"table:orders:{change.id}", "ship", "{}", "", NOW)

        taken = run(outbox.take_changes("orders", 10, build, NOW))
        runs = run(store.list_runs(workflow="ship"))
    finally:
        store.stop()
    assert (taken.started, taken.refused) == (2, 0)
    assert sorted(r.id for r in runs) == ["table:orders:1", "table:orders:2"]


def legacy_sqlite(path: Path, version: int) -> None:
    """A SQLite store as perdure at schema `version` (of 20) left it."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
        db = Db(conn)
        for script in LEGACY[:version]:
            for statement in db.statements(script):
                conn.execute(statement)
        conn.execute("INSERT INTO perdure_meta VALUES ('schema_version', ?)", (str(version),))
        conn.execute(
            "INSERT INTO agent_usage VALUES ('r', 1, 'helper', 'm', 10, 5, 0.1, 1.0)"
        )  # no pool yet: version 15 adds it
        conn.commit()
    finally:
        conn.close()


def test_an_older_store_gets_only_the_extension_scripts_it_lacked(tmp_path: Path) -> None:
    """A version-10 store had agents' usage, budgets and access tables but not shared
    budgets, reservations or the outbox: those are made, the rest kept with its rows."""
    path = tmp_path / "v10.db"
    legacy_sqlite(path, 10)
    store = SQLiteStore(str(path))
    store.start()
    try:
        usage = run(Budgets(store).usage(None, 0.0))
        assert run(Budgets(store).pool_spent("team", 0.0)) == (0, 0.0)
        assert run(Outbox(store).change_counts("x")) == (0, None, 0, None)
        assert run(Access(store).audit_log()) == []
        recorded = meta(store)
    finally:
        store.stop()
    assert [(u.agent, u.input_tokens, u.pool) for u in usage] == [("helper", 10, None)]
    assert recorded["legacy_version"] == "10"
    assert recorded[BUDGETS.key] == "3" and recorded[ACCESS.key] == "3"
    assert recorded[OUTBOX.key] == "1"
    assert {n for t, n, _ in schema_of(path) if t == "table"} >= {
        "agent_reservations", "budget_pools", "table_changes", "dashboard_sessions",
    }  # fmt: skip


def test_a_fresh_store_makes_its_own_extensions_as_it_opens_and_others_at_first_use(
    tmp_path: Path,
) -> None:
    """A new store makes, as it opens, the tables of perdure's own extensions declared by
    then (so a later read of one never writes: a held lock would make it wait), and writes
    nothing when it opens again; an extension that is not `at_open` appears at first use."""
    from perdure.store.extensions import Extension, Methods, reads

    later = Extension("later_notes", ["CREATE TABLE later_notes (line TEXT)"],
                      tables=("later_notes",))  # fmt: skip

    def lines(db: Db) -> list[str]:
        return [row[0] for row in db.execute("SELECT line FROM later_notes").fetchall()]

    class Later(Methods):
        extension = later
        read = reads(lines)

    path = tmp_path / "fresh.db"
    store = SQLiteStore(str(path))
    store.start()
    try:
        opened = {n for t, n, _ in schema_of(path) if t == "table"}
        assert run(DeadMessages(store).dead_messages()) == []
        assert run(Later(store).read()) == []
        used = {n for t, n, _ in schema_of(path) if t == "table"}
        recorded = meta(store)
    finally:
        store.stop()
    assert {"runs", "dead_messages", "schedules", "agent_budgets"} <= opened
    assert "later_notes" not in opened and used - opened == {"later_notes"}
    assert "legacy_version" not in recorded and recorded[DEAD.key] == "1"
    again = SQLiteStore(str(path))
    again.start()
    try:
        assert {n for t, n, _ in schema_of(path) if t == "table"} == used
        assert meta(again) == recorded  # nothing to bring up to date: nothing written
    finally:
        again.stop()


# -- PostgreSQL: a schema made by the old migrations --------------------------------------


@pytest.fixture
def old_schema() -> Iterator[str]:
    """A PostgreSQL schema as perdure at version 20 left it, with a row in a few tables."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        db = PostgresDb(conn, schema)
        with conn.transaction():
            db.execute("CREATE TABLE perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
            for script in LEGACY:
                for statement in db.statements(script):
                    db.execute(statement)
            db.execute("INSERT INTO perdure_meta VALUES ('schema_version', '20')")
            db.execute(
                "INSERT INTO agent_usage VALUES ('r', 1, 'helper', 'm', 10, 5, 0.1, 1.0, 'team')"
            )
            db.execute("INSERT INTO agent_memory (agent, text, at) VALUES ('helper', 'tea', 1.0)")
            db.execute(
                "INSERT INTO schedules (name, workflow, every, created_at, updated_at) "
                "VALUES ('tick', 'wf', 60, 1.0, 1.0)"
            )
            db.execute(
                "INSERT INTO audit_log (at, actor, action, target, detail) "
                "VALUES (1.0, 'cli', 'token.create', 'token:t1', '{}')"
            )
    try:
        yield schema
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_catalog(schema: str) -> set[tuple[str, ...]]:
    """Every column and index of a schema, as the server describes them."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, column_default FROM "
            "information_schema.columns WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s",
            (schema,),
        ).fetchall()
    return {tuple(str(v) for v in row) for row in [*columns, *indexes]}


@pytest.mark.postgres
def test_a_postgres_schema_made_before_extensions_upgrades_in_place(old_schema: str) -> None:
    """The old schema's rows read through each extension; no column or index is added,
    dropped or changed but the core migrations' since; each extension records its version."""
    from perdure.store.postgres import PostgresStore

    before = pg_catalog(old_schema)
    store = PostgresStore(f"{PG_URL}?schema={old_schema}")
    store.start()
    try:
        usage = run(Budgets(store).usage(None, 0.0))
        recalled = run(AgentMemory(store).recall("helper", "tea", 5))
        schedule = run(Schedules(store).get_schedule("tick"))
        audit = run(Access(store).audit_log())
        for ext in (DEAD, OUTBOX, AGENT_SESSIONS):
            run(store.run_sql(lambda db: None, write=False, extension=ext))
        recorded = meta(store)
    finally:
        store.stop()
    assert [(u.agent, u.pool) for u in usage] == [("helper", "team")]
    assert [m.text for m in recalled] == ["tea"]
    assert schedule is not None and schedule.every == 60.0
    assert [(a.action, a.outcome) for a in audit] == [("token.create", "ok")]
    # only the core migrations past 21 changed the schema (22: code versions, issue 36)
    added = {row[:2] for row in pg_catalog(old_schema) - before if row[0] not in NEWER}
    assert not before - pg_catalog(old_schema)
    assert added == {
        ("workers", "build"), ("runs", "version_checked"),
        ("worker_versions", "worker_id"), ("worker_versions", "workflow"),
        ("worker_versions", "version"), ("worker_versions", "since"),
        ("worker_versions", "worker_versions_pkey"),
        ("worker_versions", "worker_versions_by_version"),
        ("code_versions", "workflow"), ("code_versions", "version"),
        ("code_versions", "first_seen"), ("code_versions", "code_versions_pkey"),
    }  # fmt: skip
    assert recorded["legacy_version"] == "20"
    assert {ext.name: recorded[ext.key] for ext in EXTENSIONS} == {
        ext.name: str(ext.latest) for ext in EXTENSIONS
    }
