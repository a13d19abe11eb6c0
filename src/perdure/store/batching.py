"""Write batching: store operations as data, committed together, answered once per loop.

An `Op` is one operation as data: the SQL function it runs, its arguments, and
where its answer goes. The store thread hands each batch of queued ops to
`run_batch`; a caller alone runs its own op on its own thread. Either way there
is one way to write: `commit`. Writes queued together share
one transaction (a savepoint each when several, so one refused write never
undoes another). Answers are given only after the COMMIT returned, so no caller
is told a write landed before it is durable, and each event loop waiting for
answers of a batch is woken once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import StoreError, StoreUnavailable
from .base import Append, AppendResult
from .dialect import Db
from .sqlops import append_plain
from .waits import Bound

Outcome = tuple["Op", Any, BaseException | None]  # an op, its value, or the error it met
_CLAIMS = threading.Lock()  # who was first, for ops with a bound: the store or the caller


@dataclass(slots=True, eq=False)
class Op:
    """One store operation as data, and where its answer goes: a blocked thread's
    `future`, an event loop's `waiter`, or (neither: the caller runs it on its own
    thread) `value` and `error`."""

    fn: Callable[..., Any]  # a SQL function: fn(db, *args, **kwargs)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    write: bool
    append: Append | None = None  # a journal write (SQLite's lock record names its run)
    fused: bool = False  # a plain append this store may write with others in one statement
    future: concurrent.futures.Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    waiter: asyncio.Future[Any] | None = None
    bound: Bound | None = None  # the caller gives up at this bound unless the op has begun
    begun: bool = False  # (with a bound) the store began it: the caller waits for the answer
    abandoned: bool = False  # (with a bound) the caller gave up first: never begin it
    value: Any = None
    error: BaseException | None = None

    def started(self) -> bool:
        """False if a caller gave up before the op reached the store thread (skip it)."""
        if self.future is not None:
            return self.future.set_running_or_notify_cancel()
        return self.waiter is None or not self.waiter.cancelled()

    def claim(self) -> bool:
        """True if the op may begin now (its caller then waits for it); False if its
        caller gave up waiting first (then it never begins)."""
        if self.bound is None:
            return True
        with _CLAIMS:
            if self.abandoned:
                return False
            self.begun = True
            return True

    def abandon(self) -> bool:
        """The caller gives up: True if the op had not begun (and now never will)."""
        with _CLAIMS:
            if self.begun:
                return False
            self.abandoned = True
            return True


def _deliver(answers: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    """On the caller's loop: resolve every waiter answered by one batch (one wake-up)."""
    for waiter, value, error in answers:
        if waiter.done():
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(value)


class Answers:
    """The answers of one batch: a thread's at once, each event loop's in one wake-up."""

    __slots__ = ("_loops",)

    def __init__(self) -> None:
        self._loops: dict[asyncio.AbstractEventLoop, list[Any]] = {}

    def give(self, op: Op, value: Any, error: BaseException | None) -> None:
        if op.future is not None:
            if not op.future.done():
                if error is not None:
                    op.future.set_exception(error)
                else:
                    op.future.set_result(value)
        elif op.waiter is not None:
            if not op.abandoned and op.loop is not None:
                self._loops.setdefault(op.loop, []).append((op.waiter, value, error))
        else:
            op.value, op.error = value, error

    def send(self) -> None:
        """Wake each waiting loop once for all its answers."""
        loops, self._loops = self._loops, {}
        for loop, items in loops.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(_deliver, items)


class Database(Protocol):
    """What batching needs of a store: its database's transactions and errors."""

    url: str
    db_errors: tuple[type[Exception], ...]
    fused_appends: bool  # a plain append is one statement (see sqlops.plain_append)
    commits: int

    def _begin(self, conn: Any, wait: bool = True) -> bool: ...
    def _holding(self, conn: Any, ops: Sequence[Op]) -> None: ...
    def _finish(self, conn: Any, verb: str) -> None: ...
    def _failure(self, conn: Any, exc: BaseException) -> BaseException: ...
    def _read_busy(self, exc: BaseException) -> bool: ...


def run_batch(store: Database, db: Db, batch: list[Op], answers: Answers) -> None:
    """The store thread's batch in order: runs of writes committed together, reads between."""
    writes: list[Op] = []
    for op in batch:
        if not op.started():
            continue
        if op.write:
            writes.append(op)
            continue
        if writes:
            commit(store, db, writes, answers)
            writes = []
        if op.bound is None or op.claim():
            read(store, db, op, answers)
    if writes:
        commit(store, db, writes, answers)


def read(store: Database, db: Db, op: Op, answers: Answers, *, wait: bool = True) -> bool:
    """Answer one read; False (nothing answered) if `wait` is False and the database is busy."""
    try:
        value = op.fn(db, *op.args, **op.kwargs)
    except BaseException as exc:
        if not wait and store._read_busy(exc):
            return False  # e.g. SQLite's WAL index being rebuilt: the store thread waits
        answers.give(op, None, error(store, db, exc))
        return True
    answers.give(op, value, None)
    return True


def commit(store: Database, db: Db, ops: list[Op], answers: Answers, *, wait: bool = True) -> bool:
    """Write `ops` and answer each once it is durable: the one way writes are committed.

    Plain appends of distinct runs, on a store that fuses them, are one statement and so
    their own transaction (no BEGIN, one round trip); anything else is BEGIN, the ops (a
    savepoint each when several), COMMIT. With `wait` False (a caller's own thread) a busy
    database is not waited for: False, and nothing was begun or answered.
    """
    fuse = store.fused_appends
    if fuse and (ops[0].fused if len(ops) == 1 else len(_fusable(ops)) == len(ops)):
        if len(ops) > 1 or ops[0].bound is not None:
            ops = _awaited(ops)
        if not ops or _one_statement(store, db, ops, answers):
            return True
        fuse = False  # a unique violation failed the statement: each alone, to see whose
    conn = db.raw
    try:
        try:
            if not store._begin(conn, wait):  # may wait for the write lock (SQLite)
                return False
        except StoreUnavailable as exc:  # stopped while waiting: nothing was begun
            for op in ops:
                answers.give(op, None, exc)
            return True
        if len(ops) > 1 or ops[0].bound is not None:  # most calls: one op, no bound
            ops = _awaited(ops)  # after the wait for the lock: their callers may have left
        if not ops:
            store._finish(conn, "ROLLBACK")
            return True
        store._holding(conn, ops)
        if len(ops) == 1:
            return _alone(store, db, ops[0], answers)
        group = _fusable(ops) if fuse else []
        outcomes = _shared(store, db, group) if len(group) > 1 else []
        shared = {id(op) for op in group} if len(group) > 1 else set()
        outcomes += [_saved(store, db, op) for op in ops if id(op) not in shared]
        store._finish(conn, "COMMIT")
        store.commits += 1
    except store.db_errors as exc:  # the transaction itself failed: nothing of it landed
        with contextlib.suppress(Exception):
            store._finish(conn, "ROLLBACK")
        failed = error(store, db, exc)
        for op in ops:
            answers.give(op, None, failed)
        return True
    for op, value, err in outcomes:
        answers.give(op, value, err)
    return True


def error(store: Database, db: Db, exc: BaseException) -> BaseException:
    """What a caller is told of `exc`: StoreUnavailable when the database was lost, a
    database error as a StoreError naming the store, anything else as raised."""
    err = store._failure(db.raw, exc)
    if err is exc and isinstance(exc, store.db_errors):
        return StoreError(f"store {store.url}: {exc}")
    return err


def _awaited(ops: list[Op]) -> list[Op]:
    """The ops whose callers still wait for them, claimed: they begin now."""
    return [op for op in ops if op.bound is None or op.claim()]


def _fusable(ops: list[Op]) -> list[Op]:
    """The ops that may share one statement: plain appends, one per run, of runs with no
    other write among `ops` (a run's own writes keep their order)."""
    runs: dict[str, int] = {}
    for op in ops:
        if op.append is not None:
            runs[op.append.run_id] = runs.get(op.append.run_id, 0) + 1
    return [op for op in ops if op.fused and op.append and runs[op.append.run_id] == 1]


def _one_statement(store: Database, db: Db, ops: list[Op], answers: Answers) -> bool:
    """Fused plain appends as one statement in autocommit; False (nothing was written) if
    several met a unique violation, to be written one by one instead."""
    outcomes: list[Outcome]
    try:
        if len(ops) == 1:
            [op] = ops
            outcomes = [(op, op.fn(db, *op.args, **op.kwargs), None)]
        else:
            outcomes = _outcomes(ops, append_plain(db, [_append(op) for op in ops]))
    except StoreError as exc:
        if len(ops) > 1:
            return False
        outcomes = [(ops[0], None, exc)]
    except BaseException as exc:
        lost = error(store, db, exc)
        outcomes = [(op, None, lost) for op in ops]
    else:
        store.commits += 1
    for op, value, failed in outcomes:
        answers.give(op, value, failed)
    return True


def _alone(store: Database, db: Db, op: Op, answers: Answers) -> bool:
    """The one write of its transaction (no savepoint needed): COMMIT, or ROLLBACK if it
    failed. A COMMIT cut off raises to `commit` (it may or may not have landed)."""
    try:
        value = op.fn(db, *op.args, **op.kwargs)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            store._finish(db.raw, "ROLLBACK")
        answers.give(op, None, error(store, db, exc))
        return True
    store._finish(db.raw, "COMMIT")
    store.commits += 1
    answers.give(op, value, None)
    return True


def _shared(store: Database, db: Db, group: list[Op]) -> list[Outcome]:
    """Plain appends of several runs as one statement in a savepoint; on a unique
    violation, each in its own savepoint instead, to see whose it was."""
    db.raw.execute("SAVEPOINT op")
    try:
        results = append_plain(db, [_append(op) for op in group])
    except StoreError:
        db.raw.execute("ROLLBACK TO op")
        db.raw.execute("RELEASE op")
        return [_saved(store, db, op) for op in group]
    db.raw.execute("RELEASE op")
    return _outcomes(group, results)


def _saved(store: Database, db: Db, op: Op) -> Outcome:
    """One write among several in a transaction, in a savepoint: a failed one undoes only
    itself."""
    db.raw.execute("SAVEPOINT op")
    try:
        value = op.fn(db, *op.args, **op.kwargs)
    except BaseException as exc:
        db.raw.execute("ROLLBACK TO op")
        db.raw.execute("RELEASE op")
        return op, None, error(store, db, exc)
    db.raw.execute("RELEASE op")
    return op, value, None


def _append(op: Op) -> Append:
    assert op.append is not None
    return op.append


def _outcomes(group: list[Op], results: list[AppendResult | Exception]) -> list[Outcome]:
    """(op, value, error) for each op of a shared append statement."""
    return [
        (op, None, r) if isinstance(r, Exception) else (op, r, None)
        for op, r in zip(group, results, strict=True)
    ]
