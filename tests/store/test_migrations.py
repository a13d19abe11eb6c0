"""Schema migrations: the version table, refusing newer stores and files that are not stores."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from store_v20.migrations import LEGACY

import perdure
from perdure.server.access_sql import Access
from perdure.store import SQLiteStore
from perdure.store.base import Append, Entry, GcRule, NewRun
from perdure.store.migrations import LATEST, MIGRATIONS


def table_counts(path: Path) -> dict[str, int]:
    """Rows per table of a SQLite file, read without changing it."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: conn.execute(f'SELECT COUNT(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        conn.close()


def meta_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM perdure_meta WHERE key='schema_version'").fetchone()
        return str(row[0])
    finally:
        conn.close()


def set_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("UPDATE perdure_meta SET value=? WHERE key='schema_version'", (str(version),))
        conn.commit()
    finally:
        conn.close()


def older_store(path: Path, version: int, *rows: str) -> None:
    """A SQLite store file as perdure at schema `version` (at most 20, before extensions
    kept their own tables) left it, with `rows` inserted."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
        for script in LEGACY[:version]:
            for statement in script.split(";"):
                text = statement.strip()
                if text.startswith("/*sqlite*/"):
                    text = text[len("/*sqlite*/") :]
                if text and not text.startswith("/*postgres*/"):
                    conn.execute(text)
        conn.execute("INSERT INTO perdure_meta VALUES ('schema_version', ?)", (str(version),))
        for row in rows:
            conn.execute(row)
        conn.commit()
    finally:
        conn.close()


def test_latest_is_the_number_of_migrations() -> None:
    """LATEST names the schema the full ordered list of migrations builds."""
    assert len(MIGRATIONS) == LATEST >= 1


def test_fresh_store_records_latest_schema_version(db_path: Path) -> None:
    """A new store file gets every table and schema_version = LATEST in perdure_meta."""
    store = SQLiteStore(str(db_path))
    store.start()
    store.stop()
    assert meta_version(db_path) == str(LATEST)
    assert {"runs", "journal", "events", "blobs", "perdure_meta"} <= set(table_counts(db_path))


def test_reopening_keeps_data_and_version(db_path: Path) -> None:
    """Opening an up-to-date store again migrates nothing and keeps its rows."""
    store = SQLiteStore(str(db_path))
    store.start()
    store.submit(
        lambda c: c.execute(
            "INSERT INTO runs (id, workflow, status, input, created_at, updated_at) "
            "VALUES ('r', 'wf', 'pending', '{}', 0, 0)"
        ),
        write=True,
    ).result()
    store.stop()
    before = table_counts(db_path)
    again = SQLiteStore(str(db_path))
    again.start()
    again.stop()
    assert table_counts(db_path) == before
    assert before["runs"] == 1
    assert meta_version(db_path) == str(LATEST)


def test_audit_records_of_an_older_store_read_as_ok_after_the_upgrade(
    db_path: Path, call: Any
) -> None:
    """A version-7 store's audit records (all of actions that succeeded) gain outcome `ok` and
    no reason when the access tables' second script adds those columns."""
    older_store(db_path, 7,
                "INSERT INTO audit_log (at, actor, action, target, detail) "
                "VALUES (1.0, 'admin:cli', 'token.create', 'token:t1', '{}')")  # fmt: skip
    store = SQLiteStore(str(db_path))
    store.start()
    try:
        [row] = call(Access(store).audit_log())
    finally:
        store.stop()
    assert (row.action, row.outcome, row.reason) == ("token.create", "ok", "")
    assert meta_version(db_path) == str(LATEST)


def test_newer_schema_raises_and_changes_nothing(db_path: Path) -> None:
    """A schema_version above LATEST raises SchemaVersionError and leaves the file untouched."""
    store = SQLiteStore(str(db_path))
    store.start()
    store.stop()
    set_version(db_path, LATEST + 1)
    bytes_before = db_path.read_bytes()
    counts_before = table_counts(db_path)

    newer = SQLiteStore(str(db_path))
    with pytest.raises(perdure.SchemaVersionError) as info:
        newer.start()
    message = str(info.value)
    assert str(LATEST + 1) in message and f"({LATEST})" in message
    assert "upgrade perdure" in message
    assert str(db_path) in message
    assert "\n" not in message
    assert db_path.read_bytes() == bytes_before
    assert table_counts(db_path) == counts_before
    assert meta_version(db_path) == str(LATEST + 1)


def test_newer_schema_refused_through_the_app(db_path: Path) -> None:
    """App.start() on a newer store raises SchemaVersionError (a StoreError), and no run is made."""
    store = SQLiteStore(str(db_path))
    store.start()
    store.stop()
    set_version(db_path, LATEST + 5)
    app = perdure.App(f"sqlite:///{db_path}")

    @app.workflow
    def noop() -> None:
        return None

    try:
        with pytest.raises(perdure.StoreError):
            app.start(noop)
    finally:
        app.close()
    assert table_counts(db_path)["runs"] == 0


def test_newer_schema_in_rollback_mode_is_left_byte_identical(db_path: Path) -> None:
    """A newer store that is not in WAL mode is refused without rewriting the file's header."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO perdure_meta VALUES ('schema_version', ?)", (str(LATEST + 1),))
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(perdure.SchemaVersionError):
        SQLiteStore(str(db_path)).start()
    assert db_path.read_bytes() == before


def test_file_that_is_not_sqlite_is_a_one_line_config_error(db_path: Path) -> None:
    """Opening a file that is not SQLite raises a one-line ConfigError and leaves the file alone."""
    db_path.write_bytes(b"this is a text file, not a database\n" * 200)
    before = db_path.read_bytes()
    with pytest.raises(perdure.ConfigError) as info:
        SQLiteStore(str(db_path)).start()
    message = str(info.value)
    assert "\n" not in message
    assert str(db_path) in message
    assert "not a" in message
    assert db_path.read_bytes() == before


def test_file_that_is_not_sqlite_through_the_app(db_path: Path) -> None:
    """Through the public API the same bad file gives ConfigError, not a traceback from sqlite3."""
    db_path.write_bytes(b"\x00garbage" * 1000)
    app = perdure.App(f"sqlite:///{db_path}")
    try:
        with pytest.raises(perdure.ConfigError):
            app.list_runs()
    finally:
        app.close()


def test_foreign_sqlite_database_is_refused_cleanly(db_path: Path) -> None:
    """A SQLite file that belongs to another program is refused with a one-line perdure error."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE runs (name TEXT)")
    conn.execute("INSERT INTO runs VALUES ('theirs')")
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(perdure.PerdureError) as info:
        SQLiteStore(str(db_path)).start()
    assert "\n" not in str(info.value)
    assert db_path.read_bytes() == before


def test_store_can_be_used_after_a_refused_open(db_path: Path, call: Any) -> None:
    """A store object whose open was refused opens fine once the bad file is gone."""
    db_path.write_bytes(b"not sqlite" * 100)
    store = SQLiteStore(str(db_path))
    with pytest.raises(perdure.ConfigError):
        store.start()
    db_path.unlink()
    store.start()
    try:
        new = NewRun(id="r", workflow="wf", input="{}", code_version="", now=0.0)
        run, created = call(store.create_run(new))
        assert created and run.id == "r"
    finally:
        store.stop()


def test_a_version_1_store_upgrades_in_place_and_gc_works(db_path: Path, call: Any) -> None:
    """A store written before retention gets migration 2 on open, keeps its runs, and gc runs."""
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE perdure_meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO perdure_meta VALUES ('schema_version', '1')")
    conn.executescript(MIGRATIONS[0])
    conn.execute(
        "INSERT INTO runs (id, workflow, status, input, created_at, updated_at) "
        "VALUES ('old', 'wf', 'completed', '{}', 0, 0), ('live', 'wf', 'running', '{}', 0, 0)"
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(str(db_path))
    store.start()
    try:
        assert meta_version(db_path) == str(LATEST)
        names = {
            r[0]
            for r in store.submit(
                lambda c: c.execute("SELECT name FROM sqlite_master WHERE type='index'").fetchall(),
                write=False,
            ).result()
        }
        assert {"runs_finished", "journal_blob_refs"} <= names
        assert call(store.gc(GcRule("wf", keep_last=0))).runs == 1
        assert call(store.get_run("live")) is not None
    finally:
        store.stop()


def test_a_journal_written_before_version_20_goes_on_after_the_upgrade(db_path: Path) -> None:
    """Before version 20 SQLite kept a run's next seq and last write's key on its row; after
    it, a write goes on at the seq after the journal's last, and a write that landed
    before the upgrade is still recognised when sent again."""
    at = "'step.outcome', 's', NULL, 0, 1, 1.0, 1, 'w1'"
    older_store(db_path, 19,
                "INSERT INTO runs (id, workflow, status, input, created_at, updated_at, "
                "lease_owner, lease_until, lease_epoch, next_seq, last_append) VALUES "
                "('r1', 'wf', 'running', '{}', 0, 0, 'w1', 1e12, 1, 2, 'k-old')",
                f"INSERT INTO journal VALUES ('r1', 0, 0, {at})",
                f"INSERT INTO journal VALUES ('r1', 1, 1, {at})")  # fmt: skip
    store = SQLiteStore(str(db_path))
    store.start()
    try:
        old = [Entry(kind="step.outcome", position=1, final=True, at=1.0)]
        again = asyncio.run(store.append(Append("r1", 1, old, key="k-old", retry=True)))
        new = [Entry(kind="step.outcome", position=2, final=True, at=2.0)]
        asyncio.run(store.append(Append("r1", 1, new, key="k-new")))
        journal = asyncio.run(store.journal("r1"))
    finally:
        store.stop()
    assert again.status == "running"
    assert [(e.seq, e.position) for e in journal] == [(0, 0), (1, 1), (2, 2)]
    assert meta_version(db_path) == str(LATEST)
