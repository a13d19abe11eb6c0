"""Store extensions: tables a package above the store owns, with their SQL, migrations and
methods, reached through the store's one generic entry (`Store.run_sql`).

The core store keeps runs, streams, leases and workers and knows no extension. A
package that needs tables of its own (agent budgets, access tokens, schedules, ...)
declares an `Extension` next to its SQL: its name, its ordered migration scripts and
the tables they make. Its methods table is a `Methods` subclass, one line per SQL
function, bound to a store:

    BUDGETS = Extension("budgets", [SCRIPT_1, SCRIPT_2], tables=("agent_usage", ...))

    class Budgets(Methods):
        extension = BUDGETS
        spent = reads(spent)      # spent(db, agent, since) -> (tokens, cost)

    await Budgets(store).spent("helper", since)

A store brings perdure's own extensions (`at_open`) declared by then up to date as it
opens, and any other at its first call, under its own version row (`schema_version:<name>` in
perdure_meta); every call then runs its SQL function through `run_sql`, batched and
committed like the store's own writes.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..errors import SchemaVersionError
from .dialect import Db, add_tables
from .migrations import record, run_scripts

if TYPE_CHECKING:
    from .roles import Store

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Extension:
    """An extension's tables: its name (which keys its version row), its ordered migration
    scripts (version N is what the first N build; written for SQLite, in the subset both
    databases share, `/*sqlite*/` and `/*postgres*/` marking a statement for one), and the
    tables they make (named with the store's schema on PostgreSQL).

    `legacy`: for each of its first scripts, the core schema version whose script made
    the same tables before extensions kept their own (a store that old has them already).
    `at_open`: brought up to date as a store opens once declared (perdure's own extensions),
    so a read of it never has to write; else at its first call.
    """

    name: str
    migrations: Sequence[str]
    tables: Sequence[str]
    legacy: Sequence[int] = ()
    at_open: bool = False

    def __post_init__(self) -> None:
        if len(self.legacy) > len(self.migrations):
            raise ValueError(f"extension {self.name!r}: more legacy versions than scripts")
        add_tables(self.tables)
        if self.at_open:
            _at_open.append(self)

    @property
    def key(self) -> str:
        """Its version row's key in perdure_meta."""
        return f"schema_version:{self.name}"

    @property
    def latest(self) -> int:
        return len(self.migrations)


_at_open: list[Extension] = []  # the `at_open` extensions declared in this process so far


def at_open() -> list[Extension]:
    """The `at_open` extensions this process has declared (their modules imported): a store
    brings them up to date as it opens, so that a later read of one never has to write (a
    held write lock would make it wait: `perdure stuck` must answer then)."""
    return list(_at_open)


def version(db: Db, ext: Extension, where: str) -> int:
    """The version of `ext`'s tables `db` records; a store that predates extensions' own
    versions has those its `legacy` scripts made. SchemaVersionError if newer than known."""
    rows = dict(db.execute(
        "SELECT key, value FROM perdure_meta WHERE key IN (?, 'legacy_version')", (ext.key,)
    ).fetchall())  # fmt: skip
    if ext.key in rows:
        found = int(rows[ext.key])
    else:
        before = int(rows.get("legacy_version", 0))
        found = sum(1 for made_at in ext.legacy if made_at <= before)
    if found > ext.latest:
        raise SchemaVersionError(
            f"store {where} has version {found} of the {ext.name} tables, newer than this "
            f"perdure understands ({ext.latest}); upgrade perdure. Nothing was changed."
        )
    return found


def current(db: Db, ext: Extension, where: str) -> bool:
    """Whether `ext`'s tables are up to date (a read: no write lock when they are)."""
    return version(db, ext, where) == ext.latest and _recorded(db, ext)


def migrate(db: Db, ext: Extension, where: str) -> int:
    """Bring `ext`'s tables up to date inside the caller's write transaction, one migrator
    at a time; returns the version found."""
    db.lock_schema()
    found = version(db, ext, where)
    run_scripts(db, ext.migrations[found:])
    record(db, ext.key, ext.latest)
    return found


def _recorded(db: Db, ext: Extension) -> bool:
    row = db.execute("SELECT 1 FROM perdure_meta WHERE key = ?", (ext.key,)).fetchone()
    return row is not None


class Methods:
    """An extension's methods table over one store: each `reads`/`writes` line is a method
    running its SQL function (after its connection, the method's own parameters) through
    the store's generic entry."""

    __slots__ = ("store",)
    extension: ClassVar[Extension]

    def __init__(self, store: Store) -> None:
        self.store = store

    async def ready(self) -> None:
        """Bring the extension's tables up to date in the store (once per opened store),
        e.g. before a transactional step writes them on its own connection."""
        await self.store.run_sql(_nothing, write=False, extension=self.extension)


def _nothing(db: Db) -> None:
    return None


class Call(Generic[P, T]):
    """A line of a methods table: the SQL function `fn(db, *args)`, whether it writes, and
    whether it runs apart from the store's batches (DDL that may wait on a user's table)."""

    __slots__ = ("apart", "fn", "write")

    def __init__(self, fn: Callable[Concatenate[Db, P], T], *, write: bool, apart: bool) -> None:
        self.fn = fn
        self.write = write
        self.apart = apart

    @overload
    def __get__(self, methods: None, owner: type[Any]) -> Call[P, T]: ...
    @overload
    def __get__(
        self, methods: Methods, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, methods: Methods | None, owner: type[Any]) -> Any:
        if methods is None:
            return self
        fn, write, apart = self.fn, self.write, self.apart
        store, extension = methods.store, methods.extension

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await store.run_sql(
                lambda db: fn(db, *args, **kwargs), write=write, extension=extension, apart=apart
            )

        call.__name__ = call.__qualname__ = fn.__name__
        call.__doc__ = fn.__doc__
        return call


def reads(fn: Callable[Concatenate[Db, P], T], *, apart: bool = False) -> Call[P, T]:
    """A read (on the caller's thread whenever the store thread is idle)."""
    return Call(fn, write=False, apart=apart)


def writes(fn: Callable[Concatenate[Db, P], T], *, apart: bool = False) -> Call[P, T]:
    """A write, queued to share a commit with others."""
    return Call(fn, write=True, apart=apart)
