"""The machinery SQL stores share: one store thread per process, batched writes, answers.

All of a process's store work runs on one thread that owns one connection.
Writes queued while a transaction commits are applied together in the next
transaction (one savepoint each, so one refused write never undoes another):
with several runs active, many steps share one commit. Answers of a batch
reach each caller's event loop in one wake-up. When the thread is idle, a
caller that is alone may run its own write on a second connection instead.
A caller may bound its wait (waits.py): an operation not begun by then
never begins, so a caller that gave up knows nothing of it was written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import StoreError, StoreUnavailable
from . import (
    access_sql,
    agent_sql,
    changes_sql,
    dead_sql,
    retention,
    schedule_sql,
    sqlops,
    stream_sql,
    waits,
    workers_sql,
)
from . import agent_session_sql as session_sql
from .access_sql import AuditQuery, AuditRow, SessionRow, TokenRow
from .agent_sql import Budget, Limit, MemoryRow, Refusal, Reservation, SharedBudget, UsageRow
from .base import (
    Append,
    AppendResult,
    Claim,
    Entry,
    EventRow,
    GcBatch,
    GcRule,
    LeaseState,
    NewRun,
    QueueSpec,
    RunRow,
    ScheduleAdvance,
    ScheduleRow,
    TickRow,
)
from .changes_sql import Build, TableTrigger, Taken
from .dead_sql import DeadMessage
from .dialect import Db
from .stream_sql import StreamRow
from .waits import Bound
from .workers_sql import WorkerRow

log = logging.getLogger("perdure.store")
T = TypeVar("T")
_MAX_BATCH = 512


@dataclass(slots=True)
class _Op:
    """One store operation and where its answer goes: a thread's future or a loop's."""

    fn: Callable[[Db], Any]
    write: bool
    append: Append | None = None  # the append this op writes, if it is one
    plain: bool = False  # a plain append, one statement: shareable, needs no BEGIN alone
    future: concurrent.futures.Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    waiter: asyncio.Future[Any] | None = None
    bound: Bound | None = None  # the caller gives up at this bound unless the op has begun
    begun: bool = False  # (with a bound) the store began it: the caller waits for the answer
    abandoned: bool = False  # (with a bound) the caller gave up first: never begin it

    def start(self) -> bool:
        """False if the caller gave up before the operation began (then it is skipped)."""
        if self.future is not None:
            return self.future.set_running_or_notify_cancel()
        return self.waiter is not None and not self.waiter.cancelled()


def _deliver(answers: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    """On the caller's loop: resolve every waiter answered by one batch (one wake-up)."""
    for waiter, value, error in answers:
        if waiter.done():
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(value)


def _plain_group(ops: list[_Op]) -> list[_Op]:
    """The batch's plain appends that may share one statement: one per run, and only of
    runs with no other append in the batch (a run's own writes keep their order)."""
    runs: dict[str, int] = {}
    for op in ops:
        if op.append is not None:
            runs[op.append.run_id] = runs.get(op.append.run_id, 0) + 1
    return [op for op in ops if op.plain and runs[_plain(op).run_id] == 1]


def _plain(op: _Op) -> Append:
    assert op.append is not None
    return op.append


def _outcomes(
    group: list[_Op], results: list[AppendResult | Exception]
) -> list[tuple[_Op, Any, BaseException | None]]:
    """(op, value, error) for each op of a shared append statement."""
    return [
        (op, None, r) if isinstance(r, Exception) else (op, r, None)
        for op, r in zip(group, results, strict=True)
    ]


class ThreadedStore:
    """A Store whose SQL runs on one thread; subclasses connect, begin and migrate."""

    url: str
    thread_name = "perdure-store"
    db_errors: tuple[type[Exception], ...] = ()
    fused_appends = False  # a plain append is one statement (see sqlops.plain_append)
    server_clock = False  # the database has a clock all hosts share (a server: PostgreSQL)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.commits = 0  # transactions committed, for benchmarks
        # Inline path: a caller may run its own operation on a second connection when the
        # store thread has nothing queued or running (no commit to share, no order to keep).
        self._inline_conn: Any = None
        self._migrated = False  # the store thread has migrated: inline calls may begin
        self._inline_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._enqueued = 0  # operations handed to the store thread
        self._completed = 0  # of those, answered (written by the store thread only)
        self._answers: dict[asyncio.AbstractEventLoop, list[Any]] = {}  # store thread only
        self._doubtful = False  # a call lost the database: replace the thread's connection
        self._listeners: list[Callable[[], None]] = []
        self._claims = threading.Lock()  # who was first, for ops with a bound: store or caller

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from any thread) when another process may have made work runnable.

        Stores without cross-process notifications never call it; workers then poll.
        """
        self._listeners.append(listener)

    def _heard(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener must never stop the notifications
                log.exception("store listener failed")

    # -- what a database adds ------------------------------------------------------

    def _prepare(self) -> None:
        """Before the thread starts (e.g. create the folder of a file)."""

    def _connect(self) -> Any:
        raise NotImplementedError

    def _disconnect(self, conn: Any) -> None:
        """Give up a connection (close it, or hand it back to a pool)."""
        conn.close()

    def _connect_again(self) -> Any:
        """One attempt at replacing a lost connection (the reconnect loop retries)."""
        return self._connect()

    def _migrate(self, conn: Any) -> None:
        raise NotImplementedError

    def _begin(self, conn: Any) -> None:
        conn.execute("BEGIN")

    def _db(self, conn: Any) -> Db:
        return Db(conn)

    def _holding(self, conn: Any, appends: Sequence[Append | None]) -> None:
        """A write transaction of `conn` began, to write `appends` (SQLite records who holds
        its one write lock)."""

    def _finish(self, conn: Any, verb: str) -> None:
        """End `conn`'s transaction with COMMIT or ROLLBACK."""
        conn.execute(verb)

    def _wait_error(self, seconds: float) -> StoreError:
        """What a caller whose bound passed before its operation began is told."""
        return StoreUnavailable(
            f"store {self.url}: no answer within {seconds:g}s; nothing was written"
        )

    def _inline_connect(self) -> Any | None:
        """A second connection for the inline path, or None to never run inline."""
        return None

    def _broken(self, conn: Any) -> bool:
        """True when the connection is lost and must be replaced."""
        return False

    def _inline_begin(self, conn: Any) -> bool:
        """Begin an inline write without waiting; False if the database is busy."""
        return False

    def _read_busy(self, exc: BaseException) -> bool:
        """True when an inline read met a lock it must not wait for (queue it instead)."""
        return False

    def _start_failure(self, exc: BaseException, *, lost: bool) -> BaseException:
        """What `start()` raises when connecting or migrating failed with `exc` (`lost`: the
        connection broke meanwhile)."""
        return exc

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the store thread and migrate; idempotent and thread-safe."""
        with self._lock:
            if self._thread is not None:
                return
            self._prepare()
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._thread = threading.Thread(
                target=self._serve, args=(ready,), name=self.thread_name, daemon=True
            )
            self._thread.start()
        try:
            ready.result()
        except BaseException:
            with self._lock:
                self._thread = None
            raise

    async def open(self) -> None:
        bound = waits.current()
        if bound is None or self._thread is not None:
            await asyncio.to_thread(self.start)
            return
        try:  # connecting and migrating go on if the bound passes; the caller stops waiting
            await asyncio.wait_for(asyncio.shield(asyncio.to_thread(self.start)), bound.left())
        except TimeoutError:
            raise self._wait_error(bound.seconds) from None

    async def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._migrated = False
        if thread is not None:
            self._queue.put(None)
            thread.join()
        with self._inline_lock:
            if self._inline_conn is not None:
                with contextlib.suppress(Exception):
                    self._disconnect(self._inline_conn)
                self._inline_conn = None

    # -- the store thread ---------------------------------------------------------

    def _serve(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:
            ready.set_exception(self._start_failure(exc, lost=False))
            return
        try:
            self._migrate(conn)
        except BaseException as exc:
            lost = self._broken(conn)
            self._disconnect(conn)
            ready.set_exception(self._start_failure(exc, lost=lost))
            return
        self._migrated = True
        ready.set_result(None)
        try:
            while True:
                op = self._queue.get()
                if op is None:
                    break
                batch = [op]
                while len(batch) < _MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)
                        break
                    batch.append(nxt)
                try:
                    self._run_batch(conn, batch)
                except Exception as exc:  # a bug must fail the batch, never the store thread
                    error = self._failure(conn, exc)
                    if error is exc:
                        log.exception("store %s: a batch failed", self.url)
                    self._fail_batch(batch, exc, error if error is not exc else None)
                # Counted done before the answers go out: a caller woken by its answer
                # finds the thread idle and may run its next operation inline.
                self._completed += len(batch)
                self._send_answers()
                if self._broken(conn) or self._doubtful:
                    self._doubtful = False
                    conn = self._reconnect(conn)
                    if conn is None:
                        return
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    self._disconnect(conn)

    def _fail_batch(
        self, batch: list[_Op], exc: Exception, error: BaseException | None = None
    ) -> None:
        """Answer every op of a batch that raised unexpectedly that it failed (`error`:
        what to answer, when the store knows better than an internal error)."""
        if error is None:
            error = StoreError(f"store {self.url}: internal error ({type(exc).__name__}: {exc})")
        self._answers = {}
        for op in batch:
            if op.future is not None:
                if not op.future.done():
                    op.future.set_exception(error)
            elif op.loop is not None and op.waiter is not None and not op.abandoned:
                self._answers.setdefault(op.loop, []).append((op.waiter, None, error))

    def _send_answers(self) -> None:
        """Wake each caller's loop once for all its answers of the batch just run."""
        answers, self._answers = self._answers, {}
        for loop, items in answers.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(_deliver, items)

    def _reconnect(self, old: Any) -> Any:
        """Replace a lost connection, retrying with backoff until it works or the store stops."""
        with contextlib.suppress(Exception):
            self._disconnect(old)
        delay = 0.05
        while self._thread is not None:
            try:
                conn = self._connect_again()
            except Exception as exc:
                log.warning("store %s unreachable (%s); retrying in %.2fs", self.url, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            log.warning("store %s: reconnected", self.url)
            return conn
        return None

    def _connection_lost(self, conn: Any, exc: BaseException) -> bool:
        """Did `exc` come from losing the database (not from the call itself)? A store
        whose driver can tell more (PostgreSQL) says so for errors met before the
        connection is marked broken, e.g. inside a pipeline or a COMMIT."""
        return isinstance(exc, self.db_errors) and self._broken(conn)

    def _failure(self, conn: Any, exc: BaseException) -> BaseException:
        """What a caller sees for `exc`: StoreUnavailable when the connection was lost
        (never the driver's own error, which would reach a workflow and fail its run)."""
        if isinstance(exc, StoreUnavailable):
            return exc
        if self._connection_lost(conn, exc):
            self._doubtful = True  # the store thread replaces its connection after the batch
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return StoreUnavailable(f"store {self.url} unreachable: {first}")
        return exc

    def _run_batch(self, conn: Any, batch: list[_Op]) -> None:
        writes: list[_Op] = []
        for op in batch:
            if not op.start():
                continue  # the caller gave up before the op started: skip it
            if op.write:
                writes.append(op)
                continue
            if writes:
                self._commit(conn, writes)
                writes = []
            if not self._claim(op):
                continue
            try:
                self._answer(op, op.fn(self._db(conn)), None)
            except BaseException as exc:
                self._answer(op, None, self._failure(conn, exc))
        if writes:
            self._commit(conn, writes)

    def _answer(self, op: _Op, value: Any, error: BaseException | None) -> None:
        if op.future is not None:
            if error is not None:
                op.future.set_exception(error)
            else:
                op.future.set_result(value)
        elif op.loop is not None and op.waiter is not None and not op.abandoned:
            self._answers.setdefault(op.loop, []).append((op.waiter, value, error))

    def _claim(self, op: _Op) -> bool:
        """True if `op` may begin now (then its caller waits for it); False if its caller
        gave up waiting first (then it never begins)."""
        if op.bound is None:
            return True
        with self._claims:
            if op.abandoned:
                return False
            op.begun = True
            return True

    def _abandon(self, op: _Op) -> bool:
        """The caller gives up on `op`: True if it had not begun (and now never will)."""
        with self._claims:
            if op.begun:
                return False
            op.abandoned = True
            return True

    def _commit(self, conn: Any, ops: list[_Op]) -> None:
        outcomes: list[tuple[_Op, Any, BaseException | None]] = []
        if self.fused_appends:  # one plain statement needs no BEGIN, so nothing to wait for
            ops = [op for op in ops if self._claim(op)]
            if not ops:
                return
            group = _plain_group(ops)
            if len(ops) == 1 and ops[0].plain:
                self._autocommit_one(conn, ops[0])
                return
            if len(group) == len(ops) and self._autocommit_group(conn, group):
                return
        try:
            try:
                self._begin(conn)  # may wait for the database's write lock (SQLite)
            except StoreUnavailable as exc:  # stopped while waiting: nothing was begun
                for op in ops:
                    self._answer(op, None, exc)
                return
            ops = [op for op in ops if self._claim(op)]
            if not ops:  # every caller gave up while the lock was awaited
                self._finish(conn, "ROLLBACK")
                return
            self._holding(conn, [op.append for op in ops])
            group = _plain_group(ops) if self.fused_appends else []
            if len(ops) == 1:  # alone in its transaction: no savepoint needed
                self._commit_one(conn, ops[0])
                return
            rest = ops
            if len(group) > 1:
                conn.execute("SAVEPOINT op")
                try:
                    results = sqlops.append_plain(self._db(conn), [_plain(op) for op in group])
                except StoreError:  # a unique violation: each on its own below, to see whose
                    conn.execute("ROLLBACK TO op")
                else:
                    outcomes += _outcomes(group, results)
                    shared = {id(op) for op in group}
                    rest = [op for op in ops if id(op) not in shared]
                conn.execute("RELEASE op")
            for op in rest:
                conn.execute("SAVEPOINT op")
                try:
                    value = op.fn(self._db(conn))
                except BaseException as exc:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    outcomes.append((op, None, exc))
                else:
                    conn.execute("RELEASE op")
                    outcomes.append((op, value, None))
            self._finish(conn, "COMMIT")
            self.commits += 1
        except self.db_errors as exc:
            with contextlib.suppress(Exception):
                self._finish(conn, "ROLLBACK")
            err = self._failure(conn, exc)
            if err is exc:
                err = StoreError(f"store {self.url}: {exc}")
            for op in ops:
                if op.future is None or not op.future.done():
                    self._answer(op, None, err)
            return
        for op, value, error in outcomes:
            self._answer(op, value, error)

    def _autocommit_group(self, conn: Any, group: list[_Op]) -> bool:
        """Plain appends of several runs as one statement in autocommit; False to retry them
        one by one (a unique violation failed the statement, so nothing was written)."""
        try:
            results = sqlops.append_plain(self._db(conn), [_plain(op) for op in group])
        except StoreError:
            return False
        except BaseException as exc:
            err = self._failure(conn, exc)
            if err is exc and isinstance(exc, self.db_errors):
                err = StoreError(f"store {self.url}: {exc}")
            for op in group:
                self._answer(op, None, err)
            return True
        self.commits += 1
        for op, value, error in _outcomes(group, results):
            self._answer(op, value, error)
        return True

    def _autocommit_one(self, conn: Any, op: _Op) -> None:
        """One single-statement write, its own transaction: one round trip, no BEGIN."""
        try:
            value = op.fn(self._db(conn))
        except BaseException as exc:
            err = self._failure(conn, exc)
            if err is exc and isinstance(exc, self.db_errors):
                err = StoreError(f"store {self.url}: {exc}")
            self._answer(op, None, err)
            return
        self.commits += 1
        self._answer(op, value, None)

    def _commit_one(self, conn: Any, op: _Op) -> None:
        try:
            value = op.fn(self._db(conn))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self._finish(conn, "ROLLBACK")
            self._answer(op, None, self._failure(conn, exc))
            return
        try:
            self._finish(conn, "COMMIT")
        except BaseException as exc:  # lost mid-commit: it may or may not have landed
            self._answer(op, None, self._failure(conn, exc))
            return
        self.commits += 1
        self._answer(op, value, None)

    # -- submission ---------------------------------------------------------------

    def submit(
        self, fn: Callable[[Db], T], *, write: bool, append: Append | None = None
    ) -> concurrent.futures.Future[T]:
        """Queue `fn` for the store thread; writes are grouped into shared transactions."""
        if self._thread is None:
            self.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._enqueue(_Op(fn, write, append, self._plain(append), future=future))
        return future

    def _enqueue(self, op: _Op) -> None:
        with self._count_lock:
            self._enqueued += 1
        self._queue.put(op)

    async def _call(
        self,
        fn: Callable[[Db], T],
        *,
        write: bool,
        inline: bool | None = None,
        append: Append | None = None,
    ) -> T:
        """Await `fn` on the store thread; answers of one batch reach a loop in one wake-up.

        `inline` lets the caller run `fn` itself when the store thread is idle: one
        caller alone saves two thread hand-offs (and the GIL passing between three
        threads), and there is no commit to share. Reads are short: by default they
        run inline; writes only when the caller says so (a short write whose commit
        nobody else is waiting to share).
        """
        if self._thread is None:
            self.start()
        if inline if inline is not None else not write:
            done, value = self._try_inline(fn, write, self._plain(append), append)
            if done:
                return value  # type: ignore[no-any-return]
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        bound = waits.current()
        op = _Op(fn, write, append, self._plain(append), loop=loop, waiter=waiter, bound=bound)
        self._enqueue(op)
        if bound is None:
            return await waiter
        timer = loop.call_later(bound.left(), self._give_up, op, bound)
        try:
            return await waiter
        except asyncio.CancelledError:
            self._abandon(op)
            raise
        finally:
            timer.cancel()

    def _give_up(self, op: _Op, bound: Bound) -> None:
        """On the caller's loop when its bound passed: fail the op unless it has begun (then
        its answer comes soon, and the caller waits for it)."""
        if op.waiter is not None and not op.waiter.done() and self._abandon(op):
            op.waiter.set_exception(self._wait_error(bound.seconds))

    def _try_inline(
        self,
        fn: Callable[[Db], Any],
        write: bool,
        single: bool = False,
        append: Append | None = None,
    ) -> tuple[bool, Any]:
        """Run `fn` on this thread if nothing is queued or running; (False, None) if not."""
        completed = self._completed
        if (
            not self._migrated
            or completed != self._enqueued
            or not self._inline_lock.acquire(blocking=False)
        ):
            return False, None
        try:
            conn = self._inline_conn
            if conn is None:
                conn = self._inline_conn = self._inline_connect()
                if conn is None:
                    return False, None
            try:
                return self._inline_run(conn, fn, write, single, append)
            except BaseException as exc:
                err = self._failure(conn, exc)
                if err is not exc:  # the connection is lost: a fresh one next time
                    self._inline_conn = None
                    with contextlib.suppress(Exception):
                        self._disconnect(conn)
                    raise err from None
                raise
        finally:
            self._inline_lock.release()

    def _inline_run(
        self, conn: Any, fn: Callable[[Db], Any], write: bool, single: bool, append: Append | None
    ) -> tuple[bool, Any]:
        if not write:
            try:
                return True, fn(self._db(conn))
            except self.db_errors as exc:
                if self._read_busy(exc):
                    return False, None  # e.g. SQLite's WAL index being rebuilt: queue it
                raise
        if single:  # one statement: its own transaction
            value = fn(self._db(conn))
            self.commits += 1
            return True, value
        if not self._inline_begin(conn):
            return False, None  # the database is busy: queue instead of waiting
        self._holding(conn, [append])
        try:
            value = fn(self._db(conn))
        except BaseException:
            with contextlib.suppress(Exception):
                self._finish(conn, "ROLLBACK")
            raise
        self._finish(conn, "COMMIT")
        self.commits += 1
        return True, value

    # -- the Store protocol ---------------------------------------------------------

    async def create_run(self, new: NewRun) -> tuple[RunRow, bool]:
        return await self._call(lambda c: sqlops.create_run(c, new), write=True, inline=True)

    async def get_run(self, run_id: str) -> RunRow | None:
        return await self._call(lambda c: sqlops.get_run(c, run_id), write=False)

    async def list_runs(
        self,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
        after: tuple[float, str] | None = None,
        ids: Sequence[str] = (),
    ) -> list[RunRow]:
        return await self._call(
            lambda c: sqlops.list_runs(c, statuses, workflow, parent_id, limit, after, ids),
            write=False,
        )

    async def count_runs(self) -> dict[str, int]:
        return await self._call(sqlops.count_runs, write=False)

    async def journal(self, run_id: str, after: int = -1, limit: int = -1) -> list[Entry]:
        return await self._call(lambda c: sqlops.journal(c, run_id, after, limit), write=False)

    def append_now(self, append: Append) -> AppendResult:
        """`append` from any thread, blocking it: inline if the store thread is idle."""
        fn: Callable[[Db], AppendResult] = lambda c: sqlops.append(c, append)  # noqa: E731
        if append.inline_ok:
            done, value = self._try_inline(fn, True, self._plain(append), append)
            if done:
                return value  # type: ignore[no-any-return]
        return self.submit(fn, write=True, append=append).result()

    async def append(self, append: Append) -> AppendResult:
        return await self._call(
            lambda c: sqlops.append(c, append),
            write=True,
            inline=append.inline_ok,
            append=append,
        )

    def _plain(self, append: Append | None) -> bool:
        """True for a plain append this store writes as one statement."""
        return append is not None and self.fused_appends and sqlops.plain_append(append)

    async def claim(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        workflows: Sequence[str],
        queues: Sequence[QueueSpec] = (),
        held: Mapping[str, int] | None = None,
        executing: Sequence[str] = (),
        own: bool = False,
    ) -> list[Claim]:
        return await self._call(
            lambda c: sqlops.claim(
                c,
                owner,
                now,
                lease_seconds,
                limit,
                workflows,
                queues,
                held or {},
                executing,
                own,
            ),
            write=True,
            inline=True,
        )

    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_until: float
    ) -> list[LeaseState]:
        return await self._call(
            lambda c: sqlops.heartbeat(c, owner, run_ids, lease_until), write=True, inline=True
        )

    async def release(self, owner: str, run_ids: Sequence[str]) -> None:
        await self._call(lambda c: sqlops.release(c, owner, run_ids), write=True, inline=True)

    async def set_pause(
        self, scope: str, name: str, paused: bool, now: float, abort: bool = False
    ) -> bool:
        return await self._call(
            lambda c: sqlops.set_pause(c, scope, name, paused, now, abort), write=True
        )

    async def list_pauses(self) -> list[tuple[str, str, float]]:
        return await self._call(sqlops.list_pauses, write=False)

    async def next_wake(self, workflows: Sequence[str]) -> float | None:
        return await self._call(lambda c: sqlops.next_wake(c, workflows), write=False)

    async def send_event(
        self, run_id: str, name: str, payload: str, now: float, key: str | None = None
    ) -> int:
        return await self._call(
            lambda c: sqlops.send_event(c, run_id, name, payload, now, key), write=True
        )

    async def next_event(self, run_id: str, name: str) -> EventRow | None:
        return await self._call(lambda c: sqlops.next_event(c, run_id, name), write=False)

    async def cancel(self, run_id: str, now: float) -> list[str]:
        return await self._call(lambda c: sqlops.cancel_tree(c, run_id, now), write=True)

    async def stuck(self, now: float, grace: float, limit: int = 1000) -> list[RunRow]:
        return await self._call(lambda c: sqlops.stuck(c, now, grace, limit), write=False)

    async def get_blob(self, key: str) -> str:
        return await self._call(lambda c: sqlops.get_blob(c, key), write=False)

    async def gc(
        self, rule: GcRule, after: tuple[float, str] | None = None, limit: int = 500
    ) -> GcBatch:
        return await self._call(lambda c: retention.gc_batch(c, rule, after, limit), write=True)

    # -- schedules ------------------------------------------------------------------------

    async def put_schedule(self, row: ScheduleRow, *, replace_state: bool) -> ScheduleRow:
        return await self._call(
            lambda c: schedule_sql.put_schedule(c, row, replace_state), write=True
        )

    async def get_schedule(self, name: str) -> ScheduleRow | None:
        return await self._call(lambda c: schedule_sql.get_schedule(c, name), write=False)

    async def list_schedules(self) -> list[ScheduleRow]:
        return await self._call(schedule_sql.list_schedules, write=False)

    async def due_schedules(self, now: float) -> list[ScheduleRow]:
        return await self._call(lambda c: schedule_sql.due_schedules(c, now), write=False)

    async def next_schedule_fire(self) -> float | None:
        return await self._call(schedule_sql.next_schedule_fire, write=False)

    async def advance_schedule(self, advance: ScheduleAdvance) -> bool:
        return await self._call(lambda c: schedule_sql.advance(c, advance), write=True)

    async def schedule_ticks(
        self, name: str, *, statuses: Sequence[str] = (), limit: int = 50
    ) -> list[TickRow]:
        return await self._call(lambda c: schedule_sql.ticks(c, name, statuses, limit), write=False)

    async def set_schedule_paused(
        self, name: str, paused: bool, now: float, next_fire: float | None
    ) -> ScheduleRow:
        return await self._call(
            lambda c: schedule_sql.set_paused(c, name, paused, now, next_fire), write=True
        )

    async def delete_schedule(self, name: str) -> bool:
        return await self._call(lambda c: schedule_sql.delete(c, name), write=True)

    async def active_runs(self, id_prefix: str) -> list[RunRow]:
        return await self._call(lambda c: schedule_sql.active_runs(c, id_prefix), write=False)

    # -- agents ---------------------------------------------------------------------------

    async def record_usage(self, row: UsageRow) -> bool:
        return await self._call(lambda c: agent_sql.record_usage(c, row), write=True)

    async def spent(self, agent: str, since: float) -> tuple[int, float]:
        return await self._call(lambda c: agent_sql.spent(c, agent, since), write=False)

    async def run_spent(self, run_id: str) -> tuple[int, float]:
        return await self._call(lambda c: agent_sql.run_spent(c, run_id), write=False)

    async def usage(self, agent: str | None, since: float) -> list[UsageRow]:
        return await self._call(lambda c: agent_sql.usage(c, agent, since), write=False)

    async def get_budget(self, agent: str) -> Budget | None:
        return await self._call(lambda c: agent_sql.get_budget(c, agent), write=False)

    async def put_budget(self, budget: Budget, now: float) -> None:
        await self._call(lambda c: agent_sql.put_budget(c, budget, now), write=True)

    async def clear_budget(self, agent: str) -> bool:
        return await self._call(lambda c: agent_sql.clear_budget(c, agent), write=True)

    async def declare_agent(self, agent: str, spec_budget: str, now: float) -> None:
        await self._call(lambda c: agent_sql.declare_agent(c, agent, spec_budget, now), write=True)

    async def declared_agent(self, agent: str) -> str | None:
        return await self._call(lambda c: agent_sql.declared_agent(c, agent), write=False)

    async def reserve(
        self, reservation: Reservation, limits: list[Limit], now: float
    ) -> Refusal | None:
        return await self._call(
            lambda c: agent_sql.reserve(c, reservation, limits, now), write=True
        )

    async def settle(self, reservation: Reservation, usage: UsageRow | None) -> bool:
        return await self._call(lambda c: agent_sql.settle(c, reservation, usage), write=True)

    async def release_reservation(self, reservation: Reservation, state: str | None) -> None:
        await self._call(lambda c: agent_sql.release(c, reservation, state), write=True)

    async def reservations(self, agent: str | None, since: float) -> list[Reservation]:
        return await self._call(lambda c: agent_sql.reservations(c, agent, since), write=False)

    async def budget_parked(self, agent: str) -> list[tuple[str, int, float]]:
        return await self._call(lambda c: agent_sql.parked(c, agent), write=False)

    async def budget_unpark(self, run_id: str) -> None:
        await self._call(lambda c: agent_sql.unpark(c, run_id), write=True)

    async def pool_spent(self, pool: str, since: float) -> tuple[int, float]:
        return await self._call(lambda c: agent_sql.pool_spent(c, pool, since), write=False)

    async def get_shared_budget(self, name: str) -> SharedBudget | None:
        return await self._call(lambda c: agent_sql.get_shared_budget(c, name), write=False)

    async def put_shared_budget(self, budget: SharedBudget, now: float) -> None:
        await self._call(lambda c: agent_sql.put_shared_budget(c, budget, now), write=True)

    async def clear_shared_budget(self, name: str) -> bool:
        return await self._call(lambda c: agent_sql.clear_shared_budget(c, name), write=True)

    async def declared_agents(self) -> list[tuple[str, str]]:
        return await self._call(lambda c: agent_sql.declared_agents(c), write=False)

    async def remember(
        self, agent: str, text: str, tags: str, run_id: str | None, now: float
    ) -> int:
        return await self._call(
            lambda c: agent_sql.remember(c, agent, text, tags, run_id, now), write=True
        )

    async def recall(self, agent: str, query: str, limit: int) -> list[MemoryRow]:
        return await self._call(lambda c: agent_sql.recall(c, agent, query, limit), write=False)

    async def get_notes(self, agent: str) -> str:
        return await self._call(lambda c: agent_sql.get_notes(c, agent), write=False)

    async def add_note(
        self, agent: str, line: str, run_id: str | None, now: float, keep: int = 50
    ) -> str:
        return await self._call(
            lambda c: agent_sql.add_note(c, agent, line, run_id, now, keep), write=True
        )

    async def put_notes(self, agent: str, notes: str, run_id: str | None, now: float) -> None:
        await self._call(lambda c: agent_sql.put_notes(c, agent, notes, run_id, now), write=True)

    # -- the worker registry ------------------------------------------------------------

    async def worker_beat(self, row: WorkerRow) -> None:
        await self._call(lambda c: workers_sql.beat(c, row), write=True)

    async def worker_register(
        self, row: WorkerRow, reusable: Callable[[WorkerRow], bool]
    ) -> WorkerRow | None:
        return await self._call(lambda c: workers_sql.register(c, row, reusable), write=True)

    async def worker_stopped(self, worker_id: str, now: float) -> None:
        await self._call(lambda c: workers_sql.stopped(c, worker_id, now), write=True)

    async def list_workers(self, since: float) -> list[WorkerRow]:
        return await self._call(lambda c: workers_sql.list_workers(c, since), write=False)

    async def release_worker(self, row: WorkerRow, now: float) -> int:
        return await self._call(lambda c: workers_sql.release_worker(c, row, now), write=True)

    async def worker_session(self, row: WorkerRow) -> bool:
        """Hold a session for `row`'s worker whose end others can see; False: this store
        has no sessions (SQLite: a file), and only pids and leases tell."""
        return False

    async def sessions_gone(self, me: str, since: float) -> list[WorkerRow]:
        return []

    # -- access control -------------------------------------------------------------------

    async def add_token(
        self, token_id: str, name: str, digest: str, scopes: str, now: float
    ) -> None:
        await self._call(
            lambda c: access_sql.add_token(c, token_id, name, digest, scopes, now), write=True
        )

    async def find_token(self, digest: str) -> TokenRow | None:
        return await self._call(lambda c: access_sql.find_token(c, digest), write=False)

    async def list_tokens(self) -> list[TokenRow]:
        return await self._call(access_sql.list_tokens, write=False)

    async def revoke_token(self, token_id: str, now: float) -> bool:
        return await self._call(lambda c: access_sql.revoke_token(c, token_id, now), write=True)

    # -- dead messages ------------------------------------------------------------------

    async def add_dead_message(self, row: DeadMessage) -> bool:
        return await self._call(lambda c: dead_sql.add_dead(c, row), write=True)

    async def dead_messages(
        self, trigger: str | None = None, limit: int = 100
    ) -> list[DeadMessage]:
        return await self._call(lambda c: dead_sql.list_dead(c, trigger, limit), write=False)

    async def forget_dead_message(self, trigger: str, message_id: str) -> bool:
        return await self._call(lambda c: dead_sql.forget_dead(c, trigger, message_id), write=True)

    async def append_stream(
        self, run_id: str, rows: Sequence[tuple[str, str, str | None, float]], keep: int
    ) -> int:
        return await self._call(lambda c: stream_sql.append(c, run_id, rows, keep), write=True)

    async def read_stream(self, run_id: str, after: int = -1, limit: int = 500) -> list[StreamRow]:
        return await self._call(lambda c: stream_sql.read(c, run_id, after, limit), write=False)

    async def stream_last(self, run_id: str) -> int:
        return await self._call(lambda c: stream_sql.last(c, run_id), write=False)

    # -- table changes (the outbox user-table triggers write) ------------------------------

    async def take_changes(self, trigger: str, limit: int, build: Build, now: float) -> Taken:
        return await self._call(
            lambda c: changes_sql.take(c, trigger, limit, build, now), write=True
        )

    async def change_counts(self, trigger: str) -> tuple[int, float | None, int, str | None]:
        return await self._call(lambda c: changes_sql.pending_counts(c, trigger), write=False)

    async def retry_changes(self, trigger: str) -> int:
        return await self._call(lambda c: changes_sql.retry_refused(c, trigger), write=True)

    async def has_changes(self, trigger: str) -> bool:
        return await self._call(lambda c: changes_sql.has_changes(c, trigger), write=False)

    # the triggers themselves, in the shared SQL's SQLite form (PostgreSQL overrides them)

    async def install_table_trigger(self, trigger: TableTrigger) -> bool:
        return await self._call(lambda c: changes_sql.install_sqlite(c, trigger), write=True)

    async def table_trigger_state(self, trigger: TableTrigger) -> tuple[bool, bool, bool]:
        return await self._call(lambda c: changes_sql.state_sqlite(c, trigger), write=False)

    async def uninstall_table_trigger(self, trigger: str) -> int:
        return await self._call(lambda c: changes_sql.uninstall_sqlite(c, trigger), write=True)

    async def server_time(self) -> float | None:
        if not self.server_clock:
            return None
        row = await self._call(
            lambda c: c.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone(),
            write=False,
        )
        return float(row[0])

    async def add_session(
        self, digest: str, token_id: str, now: float, forget_before: float
    ) -> None:
        await self._call(
            lambda c: access_sql.add_session(c, digest, token_id, now, forget_before), write=True
        )

    async def find_session(self, digest: str) -> SessionRow | None:
        return await self._call(lambda c: access_sql.find_session(c, digest), write=False)

    async def touch_session(self, digest: str, now: float) -> None:
        await self._call(lambda c: access_sql.touch_session(c, digest, now), write=True)

    async def end_session(self, digest: str, now: float) -> bool:
        return await self._call(lambda c: access_sql.end_session(c, digest, now), write=True)

    async def audit(
        self, at: float, actor: str, action: str, target: str, detail: str,
        outcome: str = "ok", reason: str = "",
    ) -> int:  # fmt: skip
        row = AuditRow(0, at, actor, action, target, detail, outcome, reason)
        return await self._call(lambda c: access_sql.audit(c, row), write=True)

    async def audit_log(
        self, target: str | None = None, limit: int = 100, before: int | None = None,
        *, actor: str | None = None, since: float | None = None,
    ) -> list[AuditRow]:  # fmt: skip
        query = AuditQuery(target, actor, since, before, limit)
        return await self._call(lambda c: access_sql.audit_log(c, query), write=False)

    # agent sessions (a framework's conversation history), for callers outside a run
    async def agent_session_items(self, session_id: str, limit: int | None = None) -> list[str]:
        return await self._call(lambda c: session_sql.items(c, session_id, limit), write=False)

    async def agent_session_add(self, session_id: str, items: list[str], now: float) -> None:
        await self._call(lambda c: session_sql.add(c, session_id, items, now), write=True)

    async def agent_session_pop(self, session_id: str) -> str | None:
        return await self._call(lambda c: session_sql.pop(c, session_id), write=True)

    async def agent_session_clear(self, session_id: str) -> int:
        return await self._call(lambda c: session_sql.clear(c, session_id), write=True)
