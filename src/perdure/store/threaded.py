"""The machinery SQL stores share: one store thread per process, and callers' own turns.

All of a process's queued store work runs on one thread that owns one
connection, in batches (batching.py commits them: with several runs active,
many steps share one commit, and each event loop is woken once per batch).
When the thread is idle, a caller that is alone runs its own operation on a
second connection instead, with no hand-off at all. A caller may bound its wait
(waits.py): an operation not begun by then never begins, so a caller that gave
up knows nothing of it was written. The methods themselves are data
(methods.py): each names the SQL function it runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

from ..errors import StoreError, StoreUnavailable
from . import extensions, waits
from .base import Append
from .batching import Answers, Op, commit, read, run_batch
from .dialect import Db
from .extensions import Extension
from .methods import LeaseMethods, RunMethods, StreamMethods, WorkerMethods, bind_all
from .waits import Bound
from .workers_sql import WorkerRow

log = logging.getLogger("perdure.store")
T = TypeVar("T")
_MAX_BATCH = 512


class ThreadedStore(RunMethods, StreamMethods, LeaseMethods, WorkerMethods):
    """A Store whose SQL runs on one thread (or its caller's); subclasses connect, begin
    and migrate."""

    url: str
    thread_name = "perdure-store"
    db_errors: tuple[type[Exception], ...] = ()
    fused_appends = False  # a plain append is one statement (see sqlops.plain_append)

    def __init__(self) -> None:
        bind_all(self)
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.commits = 0  # transactions committed, for benchmarks
        # Inline path: a caller may run its own operation on a second connection when the
        # store thread has nothing queued or running (no commit to share, no order to keep).
        self._direct_db: Db | None = None  # the second connection, with its dialect
        self._migrated = False  # the store thread has migrated: direct calls may begin
        self._direct_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._enqueued = 0  # operations handed to the store thread
        self._completed = 0  # of those, answered (written by the store thread only)
        self._direct_answers = Answers()  # answers only the direct caller's own op
        self._doubtful = False  # a call lost the database: replace the thread's connection
        self._extended: set[Extension] = set()  # extensions whose tables are up to date

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

    def _begin(self, conn: Any, wait: bool = True) -> bool:
        """Begin a write transaction; with `wait` False (a caller's own thread) False instead
        of waiting if the database is busy."""
        conn.execute("BEGIN")
        return True

    def _db(self, conn: Any) -> Db:
        return Db(conn)

    def _holding(self, conn: Any, ops: Sequence[Op]) -> None:
        """A write transaction of `conn` began, to write `ops` (SQLite records who holds
        its one write lock)."""

    def _finish(self, conn: Any, verb: str) -> None:
        """End `conn`'s transaction with COMMIT or ROLLBACK."""
        conn.execute(verb)

    def _wait_error(self, seconds: float) -> StoreError:
        """What a caller whose bound passed before its operation began is told."""
        return StoreUnavailable(
            f"store {self.url}: no answer within {seconds:g}s; nothing was written"
        )

    def _direct_connect(self) -> Any | None:
        """A second connection for the direct path, or None to never run directly."""
        return None

    def _broken(self, conn: Any) -> bool:
        """True when the connection is lost and must be replaced."""
        return False

    def _read_busy(self, exc: BaseException) -> bool:
        """True when a direct read met a lock it must not wait for (queue it instead)."""
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
            self._extended = set()
        if thread is not None:
            self._queue.put(None)
            thread.join()
        with self._direct_lock:
            if self._direct_db is not None:
                with contextlib.suppress(Exception):
                    self._disconnect(self._direct_db.raw)
                self._direct_db = None

    # -- the store thread ---------------------------------------------------------

    def _serve(self, ready: concurrent.futures.Future[None]) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:
            ready.set_exception(self._start_failure(exc, lost=False))
            return
        try:
            self._migrate(conn)
            self._extend_known(conn)
        except BaseException as exc:
            lost = self._broken(conn)
            self._disconnect(conn)
            ready.set_exception(self._start_failure(exc, lost=lost))
            return
        self._migrated = True
        ready.set_result(None)
        db = self._db(conn)
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
                answers = Answers()
                try:
                    run_batch(self, db, batch, answers)
                except Exception as exc:  # a bug must fail the batch, never the store thread
                    error = self._failure(conn, exc)
                    if error is exc:
                        log.exception("store %s: a batch failed", self.url)
                        error = StoreError(
                            f"store {self.url}: internal error ({type(exc).__name__}: {exc})"
                        )
                    answers = Answers()
                    for op in batch:
                        answers.give(op, None, error)
                # Counted done before the answers go out: a caller woken by its answer
                # finds the thread idle and may run its next operation directly.
                self._completed += len(batch)
                answers.send()
                if self._broken(conn) or self._doubtful:
                    self._doubtful = False
                    conn = self._reconnect(conn)
                    if conn is None:
                        return
                    db = self._db(conn)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    self._disconnect(conn)

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

    # -- performing ops -------------------------------------------------------------

    async def perform(self, op: Op, direct: bool) -> Any:
        """Await `op`: on this thread if `direct` and the store thread is idle (one caller
        alone saves two thread hand-offs and shares no commit), else on the store thread.
        A caller with no event loop (a sync workflow's thread, driven by engine/context.py
        `drive`) is blocked until the answer instead of awaiting it."""
        if self._thread is None:
            self.start()
        # Run `op` on this thread if nothing is queued or running (no commit to share, no
        # order to keep): its answer is then `op.value`/`op.error`; a busy store thread, a
        # database busy elsewhere or no second connection queues it instead.
        if (
            direct
            and self._migrated
            and self._completed == self._enqueued
            and self._direct_lock.acquire(blocking=False)
        ):
            try:
                done = self._direct(op)
            finally:
                self._direct_lock.release()
            if done:
                if op.error is not None:
                    raise op.error
                return op.value
        loop = asyncio._get_running_loop()
        if loop is None:
            op.future = concurrent.futures.Future()
            self._enqueue(op)
            return await _Blocked(op.future)
        op.loop, op.waiter, op.bound = loop, loop.create_future(), waits.current()
        self._enqueue(op)
        if op.bound is None:
            return await op.waiter
        timer = loop.call_later(op.bound.left(), self._give_up, op, op.bound)
        try:
            return await op.waiter
        except asyncio.CancelledError:
            op.abandon()
            raise
        finally:
            timer.cancel()

    def submit(
        self, fn: Callable[[Db], T], *, write: bool, append: Append | None = None
    ) -> concurrent.futures.Future[T]:
        """Queue `fn(db)` for the store thread (tests and tools; the store's own methods are
        in methods.py); writes are grouped into shared transactions."""
        if self._thread is None:
            self.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._enqueue(Op(fn, (), {}, write, append, future=future))
        return future

    async def run_sql(
        self,
        fn: Callable[[Db], T],
        *,
        write: bool,
        extension: Extension | None = None,
        apart: bool = False,
    ) -> T:
        """The one generic entry (roles.Store.run_sql): `fn(db)` as an op of its own."""
        if extension is not None and extension not in self._extended:
            await self._extend(extension)
        if apart:
            return await self._apart(fn, write)
        value: T = await self.perform(Op(fn, (), {}, write), not write)
        return value

    def _extend_known(self, conn: Any) -> None:
        """As the store opens: the `at_open` extensions this process has declared up to date,
        in one write if any is not (none when all are: opening never waits for the lock)."""
        db, known = self._db(conn), extensions.at_open()
        stale = [ext for ext in known if not extensions.current(db, ext, self.url)]
        if stale:
            self._begin(conn)
            try:
                for ext in stale:
                    extensions.migrate(db, ext, self.url)
                self._finish(conn, "COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    self._finish(conn, "ROLLBACK")
                raise
        self._extended.update(known)

    async def _extend(self, extension: Extension) -> None:
        """Bring an extension's tables up to date in this store: a read when they are (no
        write lock), else its migrations in a write."""
        args = (extension, self.url)
        if not await self.perform(Op(extensions.current, args, {}, False), True):
            await self.perform(Op(extensions.migrate, args, {}, True), False)
        self._extended.add(extension)

    async def _apart(self, fn: Callable[[Db], T], write: bool) -> T:
        """`run_sql(apart=True)`: where the store has one connection (SQLite), an op like
        any other."""
        value: T = await self.perform(Op(fn, (), {}, write), not write)
        return value

    def _enqueue(self, op: Op) -> None:
        with self._count_lock:
            self._enqueued += 1
        self._queue.put(op)

    def _give_up(self, op: Op, bound: Bound) -> None:
        """On the caller's loop when its bound passed: fail the op unless it has begun (then
        its answer comes soon, and the caller waits for it)."""
        if op.waiter is not None and not op.waiter.done() and op.abandon():
            op.waiter.set_exception(self._wait_error(bound.seconds))

    def _direct(self, op: Op) -> bool:
        """`op` on the caller's second connection (the direct lock held); False if it could
        not begin (the database is busy elsewhere, or there is no second connection)."""
        db = self._direct_db
        if db is None:
            conn = self._direct_connect()
            if conn is None:
                return False
            db = self._direct_db = self._db(conn)
        answers = self._direct_answers
        if op.write:
            done = commit(self, db, [op], answers, wait=False)
        else:
            done = read(self, db, op, answers, wait=False)
        if done and isinstance(op.error, StoreUnavailable):  # lost: a fresh one next time
            self._direct_db = None
            with contextlib.suppress(Exception):
                self._disconnect(db.raw)
        return done

    # -- what only some databases have ------------------------------------------------

    async def worker_session(self, row: WorkerRow) -> bool:
        """Hold a session for `row`'s worker whose end others can see; False: this store
        has no sessions (SQLite: a file), and only pids and leases tell."""
        return False

    async def sessions_gone(self, me: str, since: float) -> list[WorkerRow]:
        return []


class _Blocked:
    """An op's answer for a caller with no event loop: the future is yielded up to the
    driver of the coroutine, which blocks its thread until it is done."""

    __slots__ = ("future",)

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, Any]:
        yield self.future
        return self.future.result()
