"""Store extensions on every store: an extension's tables are made on its first use, under a
version row of its own, once however many stores race to make them; later scripts upgrade
them in place; a newer version is refused; its methods reach the database only through
the store's generic entry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from perdure.errors import SchemaVersionError
from perdure.store.base import Store
from perdure.store.dialect import Db
from perdure.store.extensions import Extension, Methods, reads, writes

T = TypeVar("T")

FIRST = """
CREATE TABLE probe_notes (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    text  TEXT NOT NULL,
    at    REAL NOT NULL
);
CREATE INDEX probe_notes_by_at ON probe_notes (at)
"""
SECOND = "ALTER TABLE probe_notes ADD COLUMN tag TEXT NOT NULL DEFAULT 'plain'"
V1 = Extension("probe", [FIRST], tables=("probe_notes",))
V2 = Extension("probe", [FIRST, SECOND], tables=("probe_notes",))


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def add(db: Db, text: str, at: float) -> int:
    row = db.execute(
        "INSERT INTO probe_notes (text, at) VALUES (?, ?) RETURNING id", (text, at)
    ).fetchone()
    return int(row[0])


def texts(db: Db) -> list[str]:
    return [str(r[0]) for r in db.execute("SELECT text FROM probe_notes ORDER BY id").fetchall()]


def tags(db: Db) -> list[str]:
    return [str(r[0]) for r in db.execute("SELECT tag FROM probe_notes ORDER BY id").fetchall()]


class Probe(Methods):
    extension = V1
    add = writes(add)
    texts = reads(texts)


class ProbeV2(Methods):
    extension = V2
    add = writes(add)
    texts = reads(texts)
    tags = reads(tags)


def version_row(store: Store) -> str | None:
    def read(db: Db) -> str | None:
        row = db.execute(
            "SELECT value FROM perdure_meta WHERE key = 'schema_version:probe'"
        ).fetchone()
        return None if row is None else str(row[0])

    return run(store.run_sql(read, write=False))


def test_an_extensions_tables_are_made_on_first_use_and_kept(
    new_store: Callable[[], Store],
) -> None:
    """The first call makes the tables and records version 1; another store (another
    process) finds them made and its rows there."""
    first = new_store()
    assert version_row(first) is None
    assert run(Probe(first).add("hello", 1.0)) >= 1
    assert version_row(first) == "1"
    second = new_store()
    assert run(Probe(second).texts()) == ["hello"]
    assert version_row(second) == "1"


def test_stores_racing_to_make_an_extension_make_it_once(new_store: Callable[[], Store]) -> None:
    """Four stores using a new extension at once all succeed: its migration ran once."""
    stores = [new_store() for _ in range(4)]

    async def race() -> list[int]:
        return await asyncio.gather(*(Probe(s).add(f"n{i}", 1.0) for i, s in enumerate(stores)))

    assert len(set(run(race()))) == 4
    assert sorted(run(Probe(stores[0]).texts())) == ["n0", "n1", "n2", "n3"]
    assert version_row(stores[0]) == "1"


def test_a_later_script_upgrades_the_tables_in_place(new_store: Callable[[], Store]) -> None:
    """A store made at version 1 gets only the second script when a newer extension (the
    next perdure) first uses it: rows kept, the new column with its default."""
    store = new_store()
    run(Probe(store).add("old", 1.0))
    upgraded = new_store()
    assert run(ProbeV2(upgraded).tags()) == ["plain"]
    assert run(ProbeV2(upgraded).texts()) == ["old"]
    assert version_row(upgraded) == "2"
    assert run(ProbeV2(store).tags()) == ["plain"]  # the first store sees the new version too


def test_tables_of_a_newer_version_are_refused_and_left_alone(
    new_store: Callable[[], Store],
) -> None:
    """An extension older than its recorded version raises SchemaVersionError (one line,
    naming both versions) and changes nothing."""
    run(ProbeV2(new_store()).add("new", 1.0))
    older = new_store()
    with pytest.raises(SchemaVersionError) as info:
        run(Probe(older).texts())
    message = str(info.value)
    assert "probe" in message and "version 2" in message and "(1)" in message
    assert "\n" not in message
    assert version_row(older) == "2"
    assert run(ProbeV2(older).texts()) == ["new"]


def test_legacy_versions_count_what_the_core_once_made(new_store: Callable[[], Store]) -> None:
    """A store that predates extensions' own versions has the scripts its core version made
    (`legacy`): they are recorded, not run again."""
    store = new_store()

    def old_store(db: Db) -> None:  # as perdure at core version 12 left it: FIRST made
        for statement in db.statements(FIRST):
            db.execute(statement)
        db.execute("INSERT INTO perdure_meta (key, value) VALUES ('legacy_version', '12')")
        db.execute("INSERT INTO probe_notes (text, at) VALUES ('kept', 1.0)")

    run(store.run_sql(old_store, write=True))
    legacy = Extension("probe", [FIRST, SECOND], tables=("probe_notes",), legacy=(12,))

    class Legacy(Methods):
        extension = legacy
        tags = reads(tags)

    assert run(Legacy(new_store()).tags()) == ["plain"]
    assert version_row(store) == "2"
