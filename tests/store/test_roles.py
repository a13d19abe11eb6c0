"""The store protocol by role, and the tables that implement it: every role method of the SQL
stores is one line naming its SQL function, which takes exactly the role's parameters; the
core is small and takes no Python callable but through its one generic entry."""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any

from perdure.store import base, dialect, extensions, roles, stream_sql, versions_sql, workers_sql
from perdure.store.methods import Operation
from perdure.store.postgres import PostgresStore
from perdure.store.roles import ROLES, Store
from perdure.store.sqlite import SQLiteStore
from perdure.store.threaded import ThreadedStore

# role methods a store answers itself, because they differ by database
OWN = {"worker_session", "sessions_gone"}
CORE_LIMIT = 30  # methods of the core protocol: its roles, open, close and run_sql
GENERIC = "run_sql"  # the one method that takes a Python callable


def _role_methods() -> dict[str, Any]:
    return {
        name: member
        for role in ROLES
        for name, member in vars(role).items()
        if inspect.iscoroutinefunction(member)
    }


def _table(name: str) -> Any:
    return inspect.getattr_static(ThreadedStore, name)


def test_every_role_method_is_a_table_line_or_the_stores_own() -> None:
    """Each role method is an Operation of methods.py, except the few a database answers
    itself: no forwarding methods."""
    for name in _role_methods():
        member = _table(name)
        if name in OWN:
            assert inspect.iscoroutinefunction(member), name
        else:
            assert isinstance(member, Operation), f"{name} is not a table line of methods.py"


def test_every_sql_function_takes_its_roles_parameters() -> None:
    """Names, kinds and defaults agree, so a caller's keyword arguments reach the SQL."""
    for name, method in _role_methods().items():
        if name in OWN:
            continue
        wanted = list(inspect.signature(method).parameters.values())[1:]  # after self
        got = list(inspect.signature(_table(name).fn).parameters.values())[1:]  # after db
        assert [p.name for p in got] == [p.name for p in wanted], name
        assert [p.default for p in got] == [p.default for p in wanted], name
        for g, w in zip(got, wanted, strict=True):
            assert g.kind == w.kind or (
                g.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
                and w.kind is inspect.Parameter.KEYWORD_ONLY
            ), f"{name}({g.name}): {g.kind} for {w.kind}"


def test_the_tables_hold_nothing_outside_a_role() -> None:
    """A table line with no role would be a store method no caller can type against."""
    roles = set(_role_methods())
    for klass in ThreadedStore.__mro__:
        for name, member in vars(klass).items():
            if isinstance(member, Operation):
                assert name in roles, f"{klass.__name__}.{name} is in no role of roles.py"


def test_store_is_every_role() -> None:
    """`Store` lists each role method once, with open, close and url."""
    members = {n for n in vars(Store) if not n.startswith("_")} | {
        n for role in ROLES for n in vars(role) if not n.startswith("_")
    }
    assert set(_role_methods()) <= members
    assert {"open", "close"} <= members


def test_a_method_is_bound_once_per_store_unless_overridden(tmp_path: Any) -> None:
    """A table method is kept on the store after its first use; a subclass's own method of
    the same name (PostgreSQL's worker_beat) is never shadowed by the table's."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    assert store.get_run is store.get_run
    own = vars(PostgresStore)["worker_beat"]
    assert inspect.getattr_static(PostgresStore, "worker_beat") is own
    pg = object.__new__(PostgresStore)  # not connected: only attribute lookup is tested
    first = pg.worker_beat
    assert first.__func__ is vars(PostgresStore)["worker_beat"]  # type: ignore[attr-defined]
    assert "worker_beat" not in vars(pg)


def _core_methods() -> dict[str, Any]:
    """Every method of the core protocol: its roles' and Store's own (open, close, run_sql)."""
    found = _role_methods()
    found.update(
        (name, member)
        for name, member in vars(Store).items()
        if inspect.iscoroutinefunction(member)
    )
    return found


def test_the_core_protocol_is_small() -> None:
    """The core store (runs, streams, leases, workers, open, close and the generic entry) has
    at most CORE_LIMIT methods: an extension's tables are reached through run_sql."""
    methods = _core_methods()
    assert {"open", "close", GENERIC} <= set(methods)
    assert len(methods) <= CORE_LIMIT, sorted(methods)


def _hints(method: Any) -> dict[str, Any]:
    """A method's parameter and return types, its TYPE_CHECKING-only names resolved."""
    names: dict[str, Any] = dict(globals())
    for module in (base, dialect, extensions, stream_sql, versions_sql, workers_sql, roles):
        names.update(vars(module))
    return typing.get_type_hints(method, globalns=names)


def _callable(hint: Any) -> bool:
    """Whether `hint` is or holds a callable type (Callable[...], a union with one, ...)."""
    if hint is collections.abc.Callable or typing.get_origin(hint) is collections.abc.Callable:
        return True
    return any(_callable(arg) for arg in typing.get_args(hint))


def test_no_role_method_takes_a_callable_but_the_generic_entry() -> None:
    """The store takes rows, ids and bytes; a Python callable reaches it through run_sql only."""
    taking = {
        name
        for name, method in _core_methods().items()
        if any(_callable(hint) for key, hint in _hints(method).items() if key != "return")
    }
    assert taking == {GENERIC}


def test_the_callable_check_sees_a_callable_parameter() -> None:
    """The check above finds a callable parameter, bare or in a union, and ignores rows."""

    class Probe(typing.Protocol):
        async def bare(self, fn: collections.abc.Callable[[int], bool]) -> None: ...
        async def optional(self, fn: collections.abc.Callable[[], None] | None) -> None: ...
        async def rows(self, row: workers_sql.WorkerRow, n: int) -> None: ...

    assert _callable(_hints(Probe.bare)["fn"])
    assert _callable(_hints(Probe.optional)["fn"])
    assert not any(_callable(h) for h in _hints(Probe.rows).values())


def test_what_only_some_stores_have_is_a_role_of_its_own(tmp_path: Any) -> None:
    """The engine asks `isinstance(store, Role)` for what one database has and the other has
    not (no getattr reaches a store): SQLite has one write lock for every process, and
    PostgreSQL wakes other processes with notices."""
    from perdure.store.roles import Notices, WriteLock

    sqlite = SQLiteStore(str(tmp_path / "s.db"))
    pg = object.__new__(PostgresStore)  # not connected: only the type is asked
    assert isinstance(sqlite, WriteLock) and not isinstance(sqlite, Notices)
    assert isinstance(pg, Notices) and not isinstance(pg, WriteLock)
