"""The store protocol by role, and the tables that implement it: every role method of the SQL
stores is one line naming its SQL function, which takes exactly the role's parameters."""

from __future__ import annotations

import inspect
from typing import Any

from perdure.store.methods import Operation
from perdure.store.postgres import PostgresStore
from perdure.store.roles import ROLES, Store
from perdure.store.sqlite import SQLiteStore
from perdure.store.threaded import ThreadedStore

# role methods a store answers itself, because they differ by database
OWN = {"worker_session", "sessions_gone", "server_time", "install_table_trigger",
       "table_trigger_state", "uninstall_table_trigger"}  # fmt: skip


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
    the same name (PostgreSQL's worker_stopped) is never shadowed by the table's."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    assert store.get_run is store.get_run
    assert (
        inspect.getattr_static(PostgresStore, "worker_stopped")
        is vars(PostgresStore)["worker_stopped"]
    )
    pg = object.__new__(PostgresStore)  # not connected: only attribute lookup is tested
    first = pg.worker_stopped
    assert first.__func__ is vars(PostgresStore)["worker_stopped"]  # type: ignore[attr-defined]
    assert "worker_stopped" not in vars(pg)
