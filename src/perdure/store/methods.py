"""The SQL stores' methods as data: per role, the SQL function each runs and how.

A line such as `get_run = reads(sqlops.get_run)` makes `await store.get_run(run_id)`:
the method takes the SQL function's parameters after its connection, builds a
batching `Op` from its arguments, and hands it to the store, so no store has a
forwarding method per operation. `reads` run on the caller's thread when the
store thread is idle; `writes` only when said (`direct=True`), since a queued
write may share its commit; `journal_writes` take an `Append`, whose
`direct_ok` decides. The tables below implement the role protocols of roles.py.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from . import retention, sqlops, stream_sql, workers_sql
from .base import Append
from .batching import Op
from .dialect import Db
from .sqlops import plain_append

P = ParamSpec("P")
T = TypeVar("T")


class Performer(Protocol):
    """A store that performs ops."""

    fused_appends: bool

    async def perform(self, op: Op, direct: bool) -> Any: ...


class Operation(Generic[P, T]):
    """A store method made from a SQL function `fn(db, *args)`: whether it writes, whether
    it may run on the caller's thread, and whether its one argument is an `Append`."""

    __slots__ = ("direct", "fn", "fuses", "journal", "name", "write")

    def __init__(
        self,
        fn: Callable[Concatenate[Db, P], T],
        *,
        write: bool,
        direct: bool | None = None,
        journal: bool = False,
        fuses: Callable[..., bool] | None = None,
    ) -> None:
        self.fn = fn
        self.write = write
        self.direct = (not write) if direct is None else direct
        self.journal = journal
        self.fuses = fuses  # given the arguments: one statement (own transaction) on a fusing store
        self.name = fn.__name__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, store: None, owner: type[Any]) -> Operation[P, T]: ...
    @overload
    def __get__(
        self, store: Performer, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, store: Performer | None, owner: type[Any]) -> Any:
        if store is None:
            return self
        return _bound(store, self, _method(store, self))


def _method(store: Performer, spec: Operation[Any, Any]) -> Any:
    """The method a store gets for `spec`. Written out per kind, since every store call
    runs it: one call to the store, no more."""
    fn, write, direct, fuses = spec.fn, spec.write, spec.direct, store.fused_appends
    perform = store.perform
    if spec.journal:

        async def journal(append: Append) -> Any:
            op = Op(fn, (append,), {}, True, append, fuses and plain_append(append))
            return await perform(op, append.direct_ok)

        return journal
    alone = spec.fuses if fuses else None
    if alone is not None:  # e.g. a plain create_run on PostgreSQL: no BEGIN, no COMMIT

        async def fusing(*args: Any, **kwargs: Any) -> Any:
            return await perform(Op(fn, args, kwargs, write, fused=alone(*args, **kwargs)), direct)

        return fusing

    async def method(*args: Any, **kwargs: Any) -> Any:
        return await perform(Op(fn, args, kwargs, write), direct)

    return method


def _bound(store: Performer, spec: Operation[Any, Any], method: Any) -> Any:
    """`method`, named as the store's; kept on the store, so later calls find it at once,
    unless a subclass overrides the name (then the override is what the name means)."""
    method.__name__ = method.__qualname__ = spec.name
    method.__doc__ = spec.fn.__doc__
    if getattr(type(store), spec.name, None) is spec:
        vars(store)[spec.name] = method
    return method


def bind_all(store: Performer) -> None:
    """Bind every table method of `store`'s class now (a store does so when made): the
    first call of each then finds it bound, as every later one does."""
    for klass in reversed(type(store).__mro__):
        for name, member in vars(klass).items():
            overridden = id(getattr(type(store), name, None)) != id(member)  # by a subclass
            if isinstance(member, Operation) and not overridden:
                _bound(store, member, _method(store, member))


def reads(fn: Callable[Concatenate[Db, P], T]) -> Operation[P, T]:
    """A read: run on the caller's thread whenever the store thread is idle."""
    return Operation(fn, write=False)


def writes(
    fn: Callable[Concatenate[Db, P], T],
    *,
    direct: bool = False,
    fuses: Callable[..., bool] | None = None,
) -> Operation[P, T]:
    """A write: queued to share a commit, or (`direct`) run by a caller alone; `fuses`: for
    which arguments it is one statement, its own transaction alone on a fusing store."""
    return Operation(fn, write=True, direct=direct, fuses=fuses)


def journal_writes(fn: Callable[[Db, Append], T]) -> Operation[[Append], T]:
    """A write of one `Append`: fused with other runs' plain appends where the store can."""
    return Operation(fn, write=True, journal=True)


# -- the tables, one per role of roles.py ---------------------------------------------------


class RunMethods:
    """roles.Runs: runs, their journals, events, blobs and retention."""

    create_run = writes(sqlops.create_run, direct=True, fuses=sqlops.plain_create)
    get_run = reads(sqlops.get_run)
    list_runs = reads(sqlops.list_runs)
    count_runs = reads(sqlops.count_runs)
    journal = reads(sqlops.journal)
    append = journal_writes(sqlops.append)
    send_event = writes(sqlops.send_event)
    next_event = reads(sqlops.next_event)
    cancel = writes(sqlops.cancel_tree)
    stuck = reads(sqlops.stuck)
    get_blob = reads(sqlops.get_blob)
    gc = writes(retention.gc_batch)


class StreamMethods:
    """roles.Streams: what steps write while they run."""

    append_stream = writes(stream_sql.append)
    read_stream = reads(stream_sql.read)
    stream_last = reads(stream_sql.last)


class LeaseMethods:
    """roles.Leases: claiming runs, holding them, handing them back, pauses."""

    claim = writes(sqlops.claim, direct=True)
    heartbeat = writes(sqlops.heartbeat, direct=True)
    release = writes(sqlops.release, direct=True)
    next_wake = reads(sqlops.next_wake)
    set_pause = writes(sqlops.set_pause)
    list_pauses = reads(sqlops.list_pauses)


class WorkerMethods:
    """roles.Workers: the worker registry (worker_session and sessions_gone are the store's)."""

    worker_beat = writes(workers_sql.beat)
    worker_register = writes(workers_sql.register)
    list_workers = reads(workers_sql.list_workers)
    release_worker = writes(workers_sql.release_worker)
