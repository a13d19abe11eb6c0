"""The table changes' store extension: the outbox rows user-table triggers write, the
triggers themselves, their migrations and methods (`Outbox(store)`).

`take` turns outbox rows into runs: in one transaction it locks a batch of a
trigger's rows (other workers skip them), creates one run per row and deletes
the row, so a run exists exactly when its row is gone, however workers race or
die. `install` puts the trigger on a user's table. On PostgreSQL: a function of
perdure's schema, generated per trigger, that inserts the change into
`table_changes` in the user's transaction and NOTIFYs the schema's changes
channel, installed on a connection apart from the store thread's (its DDL may
wait for the user's table). On SQLite: one trigger per operation on a table in
the store's own file. Installing again changes nothing unless the definition
changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, StoreError
from ..store.base import NewRun
from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes
from ..store.sqlops import create_run

OPS = ("insert", "update", "delete")
LOCK_TIMEOUT = "5s"  # an install waits this long for the user's table, then says so
_COLUMNS = "id, trigger_name, op, tbl, pk, new_row, old_row, at"


@runtime_checkable
class ChangeNotices(Protocol):
    """A store whose LISTEN thread also hears the triggers on users' tables (PostgreSQL):
    a trigger's loop wakes at a change instead of polling."""

    def subscribe_changes(self, listener: Callable[[str | None], None]) -> None:
        """Call `listener` with a trigger's name when a change it recorded commits, and with
        None when notifications may have been missed."""


@dataclass(frozen=True, slots=True)
class TableTrigger:
    """A trigger on a user's table: its perdure name, the table, the operations it sees."""

    name: str
    table: str
    ops: tuple[str, ...]
    notify: bool = True  # NOTIFY the workers at commit (False: they look every second)


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One change as the trigger recorded it (row images are JSON text, None if absent)."""

    id: int
    trigger: str
    op: str
    table: str
    key: str | None
    new: str | None
    old: str | None
    at: float

    def payload(self) -> dict[str, Any]:
        """What the workflow gets: the change as plain JSON values."""
        return {
            "id": self.id,
            "op": self.op,
            "table": self.table,
            "key": _json(self.key),
            "row": _json(self.new),
            "old": _json(self.old),
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class ChangeState:
    """A table-change trigger as the database shows it (`perdure triggers`)."""

    installed: bool  # perdure's trigger is on the table, as currently defined or not
    enabled: bool  # not disabled with ALTER TABLE ... DISABLE TRIGGER
    table_found: bool
    pending: int  # changes not yet turned into runs
    oldest: float | None  # when the oldest of them was written (server time)
    refused: int  # changes kept because they could not become a run
    last_refusal: str | None


@dataclass(frozen=True, slots=True)
class Taken:
    """What one `take` did: runs created (or found) and rows refused."""

    started: int
    refused: int


Build = Callable[[ChangeRow], NewRun | str]  # a run for the change, or why there is none

OUTBOX = Extension(
    "table_changes",
    [
        # 1: the transactional outbox of `App.on_table_change`. A trigger perdure installs
        # on a user's table writes one row per change in the user's own transaction; a
        # worker turns each row into one run and deletes it in one transaction. A row that
        # cannot become a run is kept with the reason (`refused`).
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
        CREATE INDEX table_changes_pending ON table_changes (trigger_name, id)
            WHERE refused IS NULL
        """,
    ],
    tables=("table_changes",),
    legacy=(16,),  # made by the core's script 16 before
    at_open=True,
)


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def take(db: Db, trigger: str, limit: int, build: Build, now: float) -> Taken:
    """Turn up to `limit` of `trigger`'s pending changes (oldest first) into runs."""
    rows = db.execute(
        f"SELECT {_COLUMNS} FROM table_changes WHERE trigger_name = ? AND refused IS NULL "
        f"ORDER BY id LIMIT ?{db.claim_lock}",
        (trigger, limit),
    ).fetchall()
    done: list[int] = []
    refused = 0
    for row in rows:
        change = ChangeRow(*row)
        built = build(change)
        if isinstance(built, str):
            db.execute(
                "UPDATE table_changes SET refused = ?, refused_at = ? WHERE id = ?",
                (built, now, change.id),
            )
            refused += 1
            continue
        create_run(db, built)  # an id already taken is that change's run: nothing new
        done.append(change.id)
    if done:
        db.execute(
            f"DELETE FROM table_changes WHERE id IN ({', '.join('?' * len(done))})", tuple(done)
        )
    return Taken(len(done), refused)


def pending_counts(db: Db, trigger: str) -> tuple[int, float | None, int, str | None]:
    """(pending, oldest pending `at`, refused, the latest refusal's reason) of a trigger."""
    pending, oldest = db.execute(
        "SELECT COUNT(*), MIN(at) FROM table_changes WHERE trigger_name = ? AND refused IS NULL",
        (trigger,),
    ).fetchone()
    refused = db.execute(
        "SELECT COUNT(*) FROM table_changes WHERE trigger_name = ? AND refused IS NOT NULL",
        (trigger,),
    ).fetchone()[0]
    last = db.execute(
        "SELECT refused FROM table_changes WHERE trigger_name = ? AND refused IS NOT NULL "
        "ORDER BY refused_at DESC, id DESC LIMIT 1",
        (trigger,),
    ).fetchone()
    return int(pending), oldest, int(refused), last[0] if last else None


def has_changes(db: Db, trigger: str) -> bool:
    """Whether `trigger` has a pending change (a read: no write lock for an idle look)."""
    row = db.execute(
        "SELECT 1 FROM table_changes WHERE trigger_name = ? AND refused IS NULL LIMIT 1",
        (trigger,),
    ).fetchone()
    return row is not None


def retry_refused(db: Db, trigger: str) -> int:
    """Make `trigger`'s refused changes pending again (after the workflow was fixed)."""
    cur = db.execute(
        "UPDATE table_changes SET refused = NULL, refused_at = NULL "
        "WHERE trigger_name = ? AND refused IS NOT NULL",
        (trigger,),
    )
    if cur.rowcount:
        db.notify()
    return cur.rowcount


def install(db: Db, t: TableTrigger) -> bool:
    """Put `t` on its table, or check it is there as defined; True if anything changed."""
    return install_pg(db, t) if db.dialect == "postgres" else install_sqlite(db, t)


def trigger_state(db: Db, t: TableTrigger) -> tuple[bool, bool, bool]:
    """(table found, trigger installed, trigger enabled) as the database shows them now."""
    return state_pg(db, t) if db.dialect == "postgres" else state_sqlite(db, t)


def uninstall(db: Db, trigger: str) -> int:
    """Drop the trigger `trigger` (the changes it recorded stay); how many were dropped."""
    return uninstall_pg(db, trigger) if db.dialect == "postgres" else uninstall_sqlite(db, trigger)


# -- PostgreSQL: the trigger on the user's table ---------------------------------------------


def names_of(schema: str, trigger: str) -> tuple[str, str]:
    """(PostgreSQL trigger name, function name) of a perdure trigger: a digest of the schema
    and the name, so any perdure name fits PostgreSQL's 63 characters."""
    digest = hashlib.sha256(f"{schema}:{trigger}".encode()).hexdigest()[:16]
    return f"perdure_{digest}", f"table_change_{digest}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def function_body(schema: str, t: TableTrigger, label: str, key: Sequence[str]) -> str:
    """The trigger function's PL/pgSQL: one INSERT per operation it sees, then (unless
    `notify=False`) a NOTIFY (PostgreSQL folds a transaction's identical ones into one)."""

    def keyed(record: str) -> str:
        if not key:
            return "NULL"
        pairs = ", ".join(f"{_literal(c)}, {record}.{_ident(c)}" for c in key)
        return f"json_build_object({pairs})::text"

    images = {
        "insert": ("NEW", "row_to_json(NEW)::text", "NULL"),
        "update": ("NEW", "row_to_json(NEW)::text", "row_to_json(OLD)::text"),
        "delete": ("OLD", "NULL", "row_to_json(OLD)::text"),
    }
    branches: list[str] = []
    for op in t.ops:
        record, new, old = images[op]
        branches.append(
            f"{'IF' if not branches else 'ELSIF'} TG_OP = {_literal(op.upper())} THEN\n"
            f"    INSERT INTO {_ident(schema)}.table_changes "
            "(trigger_name, op, tbl, pk, new_row, old_row, at)\n"
            f"    VALUES ({_literal(t.name)}, {_literal(op)}, {_literal(label)}, "
            f"{keyed(record)}, {new}, {old}, extract(epoch FROM clock_timestamp()));"
        )
    channel = f"perdure_{schema}_changes"
    notify = f"  PERFORM pg_notify({_literal(channel)}, {_literal(t.name)});\n" if t.notify else ""
    return "BEGIN\n  " + "\n  ".join(branches) + "\n  END IF;\n" + notify + "  RETURN NULL;\nEND"


def _resolve(cur: Any, t: TableTrigger) -> tuple[int, str, str, list[str]]:
    """(oid, schema, table, primary key columns) of the trigger's table; ConfigError if
    there is no such table."""
    where = f"table change trigger {t.name!r}"
    cur.execute("SELECT to_regclass(%s)::oid", (t.table,))
    row = cur.fetchone()
    if row is None or row[0] is None:
        raise ConfigError(
            f"{where}: no table {t.table!r} in the store's database (create it, or name it "
            "as schema.table)"
        )
    oid = int(row[0])
    cur.execute(
        "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
        (oid,),
    )
    nsp, rel, kind = cur.fetchone()
    if kind not in ("r", "p"):
        raise ConfigError(f"{where}: {nsp}.{rel} is not a table (a view or other relation)")
    cur.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
        (oid,),
    )
    return oid, nsp, rel, [r[0] for r in cur.fetchall()]


@contextmanager
def _pg_errors(name: str) -> Iterator[None]:
    """PostgreSQL's errors of a trigger's DDL as one line naming the trigger (a lost
    connection is left to the store, which says the store is unavailable)."""
    import psycopg

    try:
        yield
    except psycopg.errors.LockNotAvailable:
        raise StoreError(
            f"table change trigger {name!r}: its table stayed locked for {LOCK_TIMEOUT} (a "
            "long transaction holds it); try again"
        ) from None
    except (psycopg.OperationalError, psycopg.InterfaceError):
        raise
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"table change trigger {name!r}: {first}") from None


def install_pg(db: Db, t: TableTrigger) -> bool:
    """Put `t` on its table (idempotently); True if anything had to change.

    Runs in the write transaction of a connection apart (`run_sql(apart=True)`). The
    DDL locks the user's table briefly; it is skipped when the trigger and its
    function already carry this definition's fingerprint. Several workers installing
    at once take turns (an advisory lock per schema).
    """
    schema = db.schema
    tg_name, fn_name = names_of(schema, t.name)
    with _pg_errors(t.name), db.raw.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        oid, nsp, rel, key = _resolve(cur, t)
        body = function_body(schema, t, f"{nsp}.{rel}", key)
        if "$perdure$" in body:
            raise ConfigError(f"table change trigger {t.name!r}: '$perdure$' in a name")
        events = " OR ".join(op.upper() for op in t.ops)
        fingerprint = "perdure " + hashlib.sha256(f"{body}|{events}".encode()).hexdigest()[:24]
        if _current(cur, oid, tg_name, schema, fn_name) == (fingerprint, fingerprint):
            return False
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"perdure-triggers:{schema}",))
        qualified_fn = f"{_ident(schema)}.{_ident(fn_name)}"
        # the function runs as its owner (perdure's role): a role writing the user's
        # table needs no rights on perdure's schema, and the fixed search_path keeps the
        # writer's own from changing what the body means
        cur.execute(
            f"CREATE OR REPLACE FUNCTION {qualified_fn}() RETURNS trigger LANGUAGE plpgsql "
            "SECURITY DEFINER SET search_path = pg_catalog, pg_temp "
            f"AS $perdure${body}$perdure$"
        )
        cur.execute(f"COMMENT ON FUNCTION {qualified_fn}() IS {_literal(fingerprint)}")
        cur.execute("SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = %s", (tg_name,))
        for (elsewhere,) in cur.fetchall():  # on another table (the name moved) or this one
            cur.execute(f"DROP TRIGGER {_ident(tg_name)} ON {elsewhere}")
        table = f"{_ident(nsp)}.{_ident(rel)}"
        cur.execute(
            f"CREATE TRIGGER {_ident(tg_name)} AFTER {events} ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {qualified_fn}()"
        )
        cur.execute(f"COMMENT ON TRIGGER {_ident(tg_name)} ON {table} IS {_literal(fingerprint)}")
    return True


def _current(
    cur: Any, oid: int, tg_name: str, schema: str, fn_name: str
) -> tuple[str | None, str | None]:
    """The fingerprints the installed trigger and function carry (None: not there)."""
    cur.execute(
        "SELECT obj_description(oid, 'pg_trigger') FROM pg_trigger "
        "WHERE tgrelid = %s AND tgname = %s",
        (oid, tg_name),
    )
    trigger = cur.fetchone()
    cur.execute(
        "SELECT obj_description(p.oid, 'pg_proc') FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s",
        (schema, fn_name),
    )
    function = cur.fetchone()
    return (trigger[0] if trigger else None, function[0] if function else None)


def state_pg(db: Db, t: TableTrigger) -> tuple[bool, bool, bool]:
    """(table found, trigger installed, trigger enabled) as PostgreSQL shows them now."""
    tg_name, _ = names_of(db.schema, t.name)
    with _pg_errors(t.name), db.raw.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)::oid", (t.table,))
        row = cur.fetchone()
        if row is None or row[0] is None:
            return False, False, False
        cur.execute(
            "SELECT tgenabled FROM pg_trigger WHERE tgrelid = %s AND tgname = %s",
            (int(row[0]), tg_name),
        )
        found = cur.fetchone()
    return True, found is not None, found is not None and found[0] != "D"


def uninstall_pg(db: Db, trigger: str) -> int:
    """Drop perdure's trigger `trigger` from whichever table holds it, and its function;
    the changes it already recorded stay. Returns how many triggers were dropped."""
    schema = db.schema
    tg_name, fn_name = names_of(schema, trigger)
    with _pg_errors(trigger), db.raw.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute("SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = %s", (tg_name,))
        tables = [r[0] for r in cur.fetchall()]
        for table in tables:
            cur.execute(f"DROP TRIGGER {_ident(tg_name)} ON {table}")
        cur.execute(f"DROP FUNCTION IF EXISTS {_ident(schema)}.{_ident(fn_name)}()")
    return len(tables)


# -- SQLite: triggers on a table in the store's own file -----------------------------------------


def _sqlite_table(db: Db, t: TableTrigger) -> tuple[str, list[str], list[str]] | None:
    """(table, columns, primary key columns) of the trigger's table in the file, or None."""
    name = t.table.removeprefix("main.")
    row = db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
        (name,),
    ).fetchone()
    if row is None:
        return None
    info = db.execute(f"PRAGMA table_info({_ident(row[0])})").fetchall()
    columns = [r[1] for r in info]
    key = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return row[0], columns, key


def sqlite_trigger_sql(schema_name: str, t: TableTrigger, table: str, columns: Sequence[str],
                       key: Sequence[str], op: str) -> str:  # fmt: skip
    """The CREATE TRIGGER statement of one operation (SQLite has one trigger per event)."""
    tg_name = f"{names_of(schema_name, t.name)[0]}_{op}"

    def image(record: str, names: Sequence[str]) -> str:
        pairs = ", ".join(
            f"{_literal(c)}, CASE WHEN typeof({record}.{_ident(c)}) = 'blob' "
            f"THEN hex({record}.{_ident(c)}) ELSE {record}.{_ident(c)} END"
            for c in names
        )
        return f"json_object({pairs})"

    record = "OLD" if op == "delete" else "NEW"
    keyed = image(record, key) if key else f"json_object('rowid', {record}.rowid)"
    new = "NULL" if op == "delete" else image("NEW", columns)
    old = "NULL" if op == "insert" else image("OLD", columns)
    return (
        f"CREATE TRIGGER {_ident(tg_name)} AFTER {op.upper()} ON {_ident(table)} BEGIN "
        "INSERT INTO table_changes (trigger_name, op, tbl, pk, new_row, old_row, at) VALUES "
        f"({_literal(t.name)}, {_literal(op)}, {_literal('main.' + table)}, {keyed}, {new}, "
        f"{old}, (julianday('now') - 2440587.5) * 86400.0); END"
    )


def install_sqlite(db: Db, t: TableTrigger) -> bool:
    """Put `t` on its table in the store's SQLite file (one trigger per operation, each
    replaced only if its statement changed); True if anything had to change."""
    found = _sqlite_table(db, t)
    if found is None:
        raise ConfigError(
            f"table change trigger {t.name!r}: no table {t.table!r} in the store's SQLite "
            "file (on SQLite the table must live in the store's own file)"
        )
    table, columns, key = found
    changed = False
    for op in OPS:
        tg_name = f"{names_of('main', t.name)[0]}_{op}"
        row = db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (tg_name,)
        ).fetchone()
        wanted = sqlite_trigger_sql("main", t, table, columns, key, op) if op in t.ops else None
        if (row[0] if row else None) == wanted:
            continue
        db.execute(f"DROP TRIGGER IF EXISTS {_ident(tg_name)}")
        if wanted is not None:
            db.execute(wanted)
        changed = True
    return changed


def state_sqlite(db: Db, t: TableTrigger) -> tuple[bool, bool, bool]:
    """(table found, trigger installed, enabled: always, SQLite cannot disable one)."""
    found = _sqlite_table(db, t)
    if found is None:
        return False, False, False
    prefix = names_of("main", t.name)[0]
    names = {r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (found[0],)
    ).fetchall()}  # fmt: skip
    installed = all(f"{prefix}_{op}" in names for op in t.ops)
    return True, installed, installed


def uninstall_sqlite(db: Db, trigger: str) -> int:
    """Drop `trigger`'s SQLite triggers; the changes they recorded stay."""
    prefix = names_of("main", trigger)[0]
    dropped = 0
    for op in OPS:
        name = f"{prefix}_{op}"
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = ?",
                      (name,)).fetchone():  # fmt: skip
            db.execute(f"DROP TRIGGER {_ident(name)}")
            dropped = 1
    return dropped


class Outbox(Methods):
    """The table changes' methods over one store: the outbox rows and the triggers that
    write them (a trigger's DDL apart from the store's batches: it may wait for the
    user's table)."""

    extension = OUTBOX
    take_changes = writes(take)
    change_counts = reads(pending_counts)
    has_changes = reads(has_changes)
    retry_changes = writes(retry_refused)
    install_table_trigger = writes(install, apart=True)
    table_trigger_state = reads(trigger_state, apart=True)
    uninstall_table_trigger = writes(uninstall, apart=True)
