"""The extension machinery on one SQLite store: methods tables bound to a store, tables made
again after the store is reopened on a new file, and table names checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from perdure.store import SQLiteStore
from perdure.store.dialect import Db
from perdure.store.extensions import Extension, Methods, reads, writes

NOTES = Extension(
    "machinery_notes",
    ["CREATE TABLE machinery_notes (text TEXT NOT NULL)"],
    tables=("machinery_notes",),
)


def add(db: Db, text: str) -> None:
    """Keep one note."""
    db.execute("INSERT INTO machinery_notes (text) VALUES (?)", (text,))


def count(db: Db) -> int:
    return int(db.execute("SELECT COUNT(*) FROM machinery_notes").fetchone()[0])


class Notes(Methods):
    extension = NOTES
    add = writes(add)
    count = reads(count)


def test_a_method_is_named_for_its_sql_function_and_bound_to_its_store(tmp_path: Path) -> None:
    """`Notes(store).add` is a coroutine function named and documented as the SQL function;
    the class attribute is the table line itself."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    method = Notes(store).add
    assert method.__name__ == "add" and method.__doc__ == "Keep one note."
    assert Notes.__dict__["add"].write and not Notes.__dict__["count"].write


def test_a_store_reopened_on_a_new_file_makes_the_tables_again(tmp_path: Path, call: Any) -> None:
    """What a store knows of its extensions ends when it stops: reopened on a file made
    anew, the extension's tables are made again on their first use."""
    path = tmp_path / "s.db"
    store = SQLiteStore(str(path))
    store.start()
    call(Notes(store).add("one"))
    store.stop()
    path.unlink()
    store.start()
    try:
        assert call(Notes(store).count()) == 0
        call(Notes(store).add("two"))
        assert call(Notes(store).count()) == 1
    finally:
        store.stop()


def test_an_extension_table_name_must_be_a_plain_identifier() -> None:
    """A table name PostgreSQL could not be given its schema by is refused when declared."""
    with pytest.raises(ValueError, match="table name"):
        Extension("bad", [""], tables=("Bad-Name",))
