"""The SQL stores' methods as data: per role, the SQL function each runs and how.

A line such as `get_run = reads(sqlops.get_run)` makes `await store.get_run(run_id)`:
the method takes the SQL function's parameters after its connection, builds a
batching `Op` from its arguments, and hands it to the store, so no store has a
forwarding method per operation. `reads` run on the caller's thread when the
store thread is idle; `writes` only when said (`inline=True`), since a queued
write may share its commit; `journal_writes` take an `Append`, whose
`inline_ok` decides. The tables below implement the role protocols of roles.py.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from . import (
    access_sql,
    agent_session_sql,
    agent_sql,
    changes_sql,
    dead_sql,
    retention,
    schedule_sql,
    sqlops,
    stream_sql,
    workers_sql,
)
from .base import Append
from .batching import Op
from .dialect import Db
from .sqlops import plain_append

P = ParamSpec("P")
T = TypeVar("T")


class Performer(Protocol):
    """A store that performs ops."""

    fused_appends: bool

    async def perform(self, op: Op, inline: bool) -> Any: ...


class Operation(Generic[P, T]):
    """A store method made from a SQL function `fn(db, *args)`: whether it writes, whether
    it may run on the caller's thread, and whether its one argument is an `Append`."""

    __slots__ = ("fn", "fuses", "inline", "journal", "name", "write")

    def __init__(
        self,
        fn: Callable[Concatenate[Db, P], T],
        *,
        write: bool,
        inline: bool | None = None,
        journal: bool = False,
        fuses: Callable[..., bool] | None = None,
    ) -> None:
        self.fn = fn
        self.write = write
        self.inline = (not write) if inline is None else inline
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
    fn, write, inline, fuses = spec.fn, spec.write, spec.inline, store.fused_appends
    perform = store.perform
    if spec.journal:

        async def journal(append: Append) -> Any:
            op = Op(fn, (append,), {}, True, append, fuses and plain_append(append))
            return await perform(op, append.inline_ok)

        return journal
    alone = spec.fuses if fuses else None
    if alone is not None:  # e.g. a plain create_run on PostgreSQL: no BEGIN, no COMMIT

        async def fusing(*args: Any, **kwargs: Any) -> Any:
            return await perform(Op(fn, args, kwargs, write, fused=alone(*args, **kwargs)), inline)

        return fusing

    async def method(*args: Any, **kwargs: Any) -> Any:
        return await perform(Op(fn, args, kwargs, write), inline)

    return method


def _bound(store: Performer, spec: Operation[Any, Any], method: Any) -> Any:
    """`method`, named as the store's; kept on the store, so later calls find it at once,
    unless a subclass overrides the name (then the override is what the name means)."""
    method.__name__ = method.__qualname__ = spec.name
    method.__doc__ = spec.fn.__doc__
    if getattr(type(store), spec.name, None) is spec:
        vars(store)[spec.name] = method
    return method


def reads(fn: Callable[Concatenate[Db, P], T]) -> Operation[P, T]:
    """A read: run on the caller's thread whenever the store thread is idle."""
    return Operation(fn, write=False)


def writes(
    fn: Callable[Concatenate[Db, P], T],
    *,
    inline: bool = False,
    fuses: Callable[..., bool] | None = None,
) -> Operation[P, T]:
    """A write: queued to share a commit, or (`inline`) run by a caller alone; `fuses`: for
    which arguments it is one statement, its own transaction alone on a fusing store."""
    return Operation(fn, write=True, inline=inline, fuses=fuses)


def journal_writes(fn: Callable[[Db, Append], T]) -> Operation[[Append], T]:
    """A write of one `Append`: fused with other runs' plain appends where the store can."""
    return Operation(fn, write=True, journal=True)


# -- the tables, one per role of roles.py ---------------------------------------------------


class RunMethods:
    """roles.Runs: runs, their journals, events, blobs and retention."""

    create_run = writes(sqlops.create_run, inline=True, fuses=sqlops.plain_create)
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

    claim = writes(sqlops.claim, inline=True)
    heartbeat = writes(sqlops.heartbeat, inline=True)
    release = writes(sqlops.release, inline=True)
    next_wake = reads(sqlops.next_wake)
    set_pause = writes(sqlops.set_pause)
    list_pauses = reads(sqlops.list_pauses)


class WorkerMethods:
    """roles.Workers: the worker registry (worker_session and sessions_gone are the store's)."""

    worker_beat = writes(workers_sql.beat)
    worker_register = writes(workers_sql.register)
    worker_stopped = writes(workers_sql.stopped)
    list_workers = reads(workers_sql.list_workers)
    release_worker = writes(workers_sql.release_worker)


class ScheduleMethods:
    """roles.Schedules."""

    put_schedule = writes(schedule_sql.put_schedule)
    get_schedule = reads(schedule_sql.get_schedule)
    list_schedules = reads(schedule_sql.list_schedules)
    due_schedules = reads(schedule_sql.due_schedules)
    next_schedule_fire = reads(schedule_sql.next_schedule_fire)
    advance_schedule = writes(schedule_sql.advance)
    schedule_ticks = reads(schedule_sql.ticks)
    set_schedule_paused = writes(schedule_sql.set_paused)
    delete_schedule = writes(schedule_sql.delete)
    active_runs = reads(schedule_sql.active_runs)


class BudgetMethods:
    """roles.Budgets: usage per model call, budgets and their reservations."""

    record_usage = writes(agent_sql.record_usage)
    spent = reads(agent_sql.spent)
    run_spent = reads(agent_sql.run_spent)
    usage = reads(agent_sql.usage)
    get_budget = reads(agent_sql.get_budget)
    put_budget = writes(agent_sql.put_budget)
    clear_budget = writes(agent_sql.clear_budget)
    declare_agent = writes(agent_sql.declare_agent)
    declared_agent = reads(agent_sql.declared_agent)
    reserve = writes(agent_sql.reserve)
    settle = writes(agent_sql.settle)
    release_reservation = writes(agent_sql.release)
    reservations = reads(agent_sql.reservations)
    budget_parked = reads(agent_sql.parked)
    budget_unpark = writes(agent_sql.unpark)
    pool_spent = reads(agent_sql.pool_spent)
    get_shared_budget = reads(agent_sql.get_shared_budget)
    put_shared_budget = writes(agent_sql.put_shared_budget)
    clear_shared_budget = writes(agent_sql.clear_shared_budget)
    declared_agents = reads(agent_sql.declared_agents)


class MemoryMethods:
    """roles.Memory: an agent's long-term memory and progress notes."""

    remember = writes(agent_sql.remember)
    recall = reads(agent_sql.recall)
    get_notes = reads(agent_sql.get_notes)
    add_note = writes(agent_sql.add_note)
    put_notes = writes(agent_sql.put_notes)


class AccessMethods:
    """roles.Access: API tokens, dashboard sessions, the audit log."""

    add_token = writes(access_sql.add_token)
    find_token = reads(access_sql.find_token)
    list_tokens = reads(access_sql.list_tokens)
    revoke_token = writes(access_sql.revoke_token)
    add_session = writes(access_sql.add_session)
    find_session = reads(access_sql.find_session)
    touch_session = writes(access_sql.touch_session)
    end_session = writes(access_sql.end_session)
    audit = writes(access_sql.audit)
    audit_log = reads(access_sql.audit_log)


class SessionMethods:
    """roles.Sessions: agent sessions' items, for callers outside a run."""

    agent_session_items = reads(agent_session_sql.items)
    agent_session_add = writes(agent_session_sql.add)
    agent_session_pop = writes(agent_session_sql.pop)
    agent_session_clear = writes(agent_session_sql.clear)


class MessageMethods:
    """roles.Messages: dead broker messages."""

    add_dead_message = writes(dead_sql.add_dead)
    dead_messages = reads(dead_sql.list_dead)
    forget_dead_message = writes(dead_sql.forget_dead)


class TableChangeMethods:
    """roles.TableChanges: the outbox (the triggers' DDL is each store's own)."""

    take_changes = writes(changes_sql.take)
    change_counts = reads(changes_sql.pending_counts)
    has_changes = reads(changes_sql.has_changes)
    retry_changes = writes(changes_sql.retry_refused)
