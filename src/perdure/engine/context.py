"""The state of one run while a worker replays it: positions, recorded entries, pending writes.

Writes are split by what a crash may lose. A *critical* write (the intent of a
`once` step, a suspension, a consumed event, the end of the run) is committed
before the workflow goes on. Other entries (outcomes, values, intents of
re-runnable steps) wait in a buffer, so that many steps share one commit, but
never long: the buffer is committed with the next critical write, after a step
whose body took longer than LINGER, once its oldest entry is LINGER old (a timer
commits it if the workflow goes quiet meanwhile), and when it grows past
BUFFER_LIMIT. So the durable journal is always a prefix of the one the workflow
saw, and a crash can only lose entries whose recovery is to run again: the step
that was executing, and fast steps that ended less than LINGER before it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import (
    DeadlineExceeded,
    LeaseLost,
    NonDeterminismError,
    PerdureError,
    RunSuspended,
    StoreError,
    StoreUnavailable,
    WorkerStopping,
)
from ..store import sqlops
from ..store.base import (
    RUNNING,
    TERMINAL,
    Append,
    AppendResult,
    Blob,
    Entry,
    NewRun,
    OperatorRequest,
    RunRow,
    Store,
    TxBody,
)
from ..store.blobs import in_row_or_blob
from . import observers, steering
from .client import origin_of
from .codec import dumps, loads
from .state import Phase, RunState

if TYPE_CHECKING:
    from .clock import Clock
    from .runtime import Runtime

T = TypeVar("T")
log = logging.getLogger("perdure.worker")
# names of this process's writes (Append.key): unique per process without a random draw
# (a getrandom call) per write, drawn again in a forked child; a retried write keeps its name
_WRITES_OF = secrets.token_hex(8) + ":"
_WRITES = itertools.count()


def _forked() -> None:
    global _WRITES_OF
    _WRITES_OF = secrets.token_hex(8) + ":"


os.register_at_fork(after_in_child=_forked)

_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "perdure_run", default=None
)

BUFFER_LIMIT = 64  # buffered entries before a flush is forced
RETRY_FIRST, RETRY_MOST = 0.05, 2.0  # seconds between tries of a write while the store is away
LINGER = 0.005  # seconds a buffered entry may wait to share a commit, and the step length
# past which a step's outcome is committed before the workflow goes on
WRITE_FAILURES = (StoreUnavailable, OperatorRequest, LeaseLost)  # a write that did not land


def family(kind: str) -> str:
    """`step.intent` -> `step`: entries of one family may share a position."""
    return kind.partition(".")[0]


@dataclass(slots=True)
class StepInfo:
    """What a running step may know about itself (`perdure.current_step()`)."""

    run_id: str
    name: str
    position: int
    attempt: int
    effect: str
    idempotency_key: str  # stable across retries and recovery: the run id and the position
    db: Any = None  # the store's connection, for transactional steps


class RunContext:
    """One run being replayed or executed by a worker under one lease epoch."""

    def __init__(
        self,
        runtime: Runtime,
        run: RunRow,
        entries: list[Entry],
        *,
        worker_id: str,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        sync_mode: bool,
        inline_sleep: float,
    ) -> None:
        self.runtime = runtime
        self.store: Store = runtime.store
        self.run = run
        self.epoch = run.lease_epoch
        self.worker_id = worker_id
        self.clock = clock
        self.loop = loop
        self.sync_mode = sync_mode
        self.inline_sleep = inline_sleep
        self.by_position: dict[int, list[Entry]] = {}
        for entry in entries:
            if entry.position is not None:
                self.by_position.setdefault(entry.position, []).append(entry)
        self.origin = origin_of(entries)  # what started the run ({}: a client call)
        self.position = 0
        self.buffer: list[Entry] = []
        self.buffered_at = 0.0  # time.monotonic() when the oldest buffered entry came
        self.commit_first = False  # a buffered entry must be committed before the next step body
        self._linger: asyncio.TimerHandle | None = None
        self._arming = False  # a sync workflow's thread asked the loop to arm the timer
        self.background: set[asyncio.Task[None]] = set()
        # the run's stream writer (engine.streams), once something wrote to the stream: its
        # rows are committed before any journal write, so no step's outcome outlives them
        self.stream: Any = None
        self.diverged: NonDeterminismError | None = None
        self.failure: str | None = None  # the error recorded when the run failed
        self.blobs: list[Blob] = []
        # A sync workflow's thread buffers entries while the loop may flush: guard the swap.
        self.buffer_lock = threading.Lock()
        self.loop_thread = threading.get_ident()
        self.state = RunState(pause=run.pause_requested)
        self._state_lock = threading.Lock()  # the loop and a sync workflow's thread change it
        self._cancel_sent = False  # the running task was cancelled (once is enough)
        self.task: asyncio.Task[Any] | None = None
        self.executing: dict[int, StepInfo] = {}  # steps whose body runs now, by position
        # the step calls of an async workflow under way (the task of each), and who waits
        # for them to end (a sibling parking the run: await_siblings)
        self.inflight: dict[object, asyncio.Task[Any] | None] = {}
        self._settling: list[asyncio.Future[None]] = []
        self.suspending: set[asyncio.Task[Any]] = set()  # sibling steps parking the run now
        self.crash_after_intent: frozenset[str] = frozenset()  # testing: crash injection
        self.steering_asked = steering.asked(entries)  # its journal says it takes steering
        # the lease this worker can show for the run (engine time: the lease_until it last
        # had the store accept, by claim or heartbeat), less a margin kept for clock error
        self.held_until = run.lease_until if run.lease_until is not None else math.inf
        self.lease_margin = 0.0

    # -- positions and recorded entries ----------------------------------------------

    @property
    def run_id(self) -> str:
        return self.run.id

    def next_position(self) -> int:
        self.guard()
        pos = self.position
        self.position += 1
        return pos

    def recorded(self, pos: int, kind_family: str, name: str) -> list[Entry]:
        """Entries at `pos`, after checking they belong to the same call (else non-determinism)."""
        entries = self.by_position.get(pos, [])
        for entry in entries:
            if family(entry.kind) == kind_family and entry.name == name:
                continue
            if entry.kind.startswith("run."):
                continue
            self.diverged = NonDeterminismError(
                self.run_id, pos, f"{family(entry.kind)} {entry.name!r}", f"{kind_family} {name!r}"
            )
            raise self.diverged
        if not entries and self.state.phase is Phase.CHECKING:
            raise ReplayEnd(pos)
        return entries

    @staticmethod
    def final(entries: list[Entry]) -> Entry | None:
        for entry in entries:
            if entry.final:
                return entry
        return None

    def data(self, entry: Entry) -> Any:
        """The decoded data of an entry (blob references were resolved when it was loaded)."""
        return loads(entry.data)

    def now(self) -> float:
        return self.clock.now()

    # -- guards ------------------------------------------------------------------------

    def guard(self) -> None:
        """Stop user code at a step boundary once the run must stop here.

        A divergence is sticky: code that caught NonDeterminismError gets it again.
        """
        phase = self.state.phase
        if phase is Phase.LOST or phase is Phase.RELEASED:  # RunState.stopped, without a call
            raise WorkerStopping()
        if self.diverged is not None:
            raise self.diverged

    def update(
        self,
        *,
        phase: Phase | None = None,
        cancel: bool | None = None,
        pause: bool | None = None,
        hold: bool | None = None,
    ) -> RunState:
        """Replace the state with the given parts changed (from any thread)."""
        with self._state_lock:
            was = self.state
            self.state = RunState(
                was.phase if phase is None else phase,
                was.cancel if cancel is None else cancel,
                was.pause if pause is None else pause,
                was.hold if hold is None else hold,
            )
            return self.state

    def close(self) -> None:
        """This execution is over: a running one is RELEASED (a lost or checking one stays so)."""
        with self._state_lock:
            if self.state.phase is Phase.RUNNING:
                self.state = replace(self.state, phase=Phase.RELEASED)

    def rearm(self, run: RunRow) -> None:
        """A kept context under the run's next claim: running, asked only what its row says."""
        with self._state_lock:
            self.state = RunState(pause=run.pause_requested, hold=self.state.hold)
        self._cancel_sent = False
        self.held_until = run.lease_until if run.lease_until is not None else math.inf

    def lease_holds(self) -> bool:
        """Whether the lease this worker last had accepted still runs (with its margin): a
        `once` body starts only then, since after it another worker may take the run over."""
        if self.state.phase is Phase.LOST:  # e.g. a heartbeat found the run taken over
            return False
        return self.clock.now() < self.held_until - self.lease_margin

    def lease_ran_out(self, step: str) -> WorkerStopping:
        """A `once` step's intent was acknowledged after the lease could have ended (its
        answer was held up, e.g. by a partition): its body must not start, since the run may
        be another worker's by now. Recovery parks it, as for any intent without outcome."""
        self.update(phase=Phase.LOST)
        observers.lease_lost(self.run_id, self.worker_id, "expired before a once body")
        log.warning(
            "worker %s: run %s: the lease may have ended before step %r could start (its "
            "intent was acknowledged %.1fs past it); not starting it",
            self.worker_id, self.run_id, step, self.clock.now() - self.held_until,
        )  # fmt: skip
        return WorkerStopping()

    def reopen(self) -> None:
        """The runner writes the run's end after a parking write (a failure, a cancel)."""
        with self._state_lock:
            if self.state.phase is Phase.RELEASED:
                self.state = replace(self.state, phase=Phase.RUNNING)

    def request_cancel(self) -> None:
        """Cancel from any thread: stop at the next step; a running async step is cancelled."""
        if self.state.cancel and self._cancel_sent:
            return
        self.update(cancel=True)
        self._cancel_sent = True
        task = self.task
        if task is not None and not self.sync_mode:
            self.loop.call_soon_threadsafe(task.cancel)

    async def hand_back_if_held(self) -> None:
        """Before a step body starts: if the run is to be handed back, commit and unwind."""
        if self.state.hold and self.state.phase is not Phase.LOST:
            await self.flush()
            raise WorkerStopping()

    async def abandon(self, reason: str) -> int:
        """The worker stops now: commit what is buffered plus a `step.stopped` entry for every
        step still executing (so recovery knows it was a stop, not a crash), then write no
        more. Returns how many steps were executing."""
        executing = list(self.executing.values())
        if self.state.phase is not Phase.RUNNING:
            self.update(phase=Phase.LOST)
            return len(executing)
        stops = [
            self.entry(
                "step.stopped",
                info.name,
                position=info.position,
                attempt=info.attempt,
                data={"executing": True, "effect": info.effect, "reason": reason},
            )
            for info in executing
            if info.effect not in ("read", "transactional")  # nothing to tell recovery
        ]
        append = self._take(tuple(stops))
        self.update(phase=Phase.LOST)  # from here on the run's own code writes nothing
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        try:
            await self.store.append(append)
        except StoreError as exc:  # recovery then sees a crash: the safe reading
            log.warning("worker %s: run %s: stop not journaled (%s)", self.worker_id,
                        self.run_id, exc)  # fmt: skip
        return len(executing)

    async def checkpoint(self) -> None:
        """At a step boundary: stop if the lease is gone, cancel, pause, or the deadline passed."""
        state = self.state
        if state.phase is Phase.CHECKING:
            raise ReplayEnd(self.position)
        self.guard()
        if state.cancel:
            raise RunSuspended("cancel")
        if state.pause:
            raise await self.suspend("paused", "paused")
        if state.hold:  # keep the run's state; its lease is released by the worker
            await self.flush()
            raise WorkerStopping()
        deadline = self.run.deadline_at
        if deadline is not None and self.now() >= deadline:
            raise DeadlineExceeded(f"run {self.run_id!r} passed its deadline")
        if self.overdue():
            await self.flush()

    # -- writes ------------------------------------------------------------------------

    def entry(
        self,
        kind: str,
        name: str = "",
        *,
        position: int | None = None,
        data: Any = None,
        data_json: str | None = None,
        attempt: int = 0,
        final: bool = False,
        where: str = "",
    ) -> Entry:
        """Build an entry; data is encoded here (PayloadError names `where`), large data by blob."""
        text = (
            data_json
            if data_json is not None
            else (None if data is None else dumps(data, where or f"{kind} {name}"))
        )
        if text is not None and len(text) > self.runtime.blob_threshold:
            text, blob = in_row_or_blob(text, self.runtime.blob_threshold)
            if blob is not None:
                with self.buffer_lock:
                    self.blobs.append(blob)
        entry = Entry(
            kind=kind,
            name=name,
            position=position,
            data=text,
            attempt=attempt,
            final=final,
            at=self.clock.now(),
            worker=self.worker_id,
        )
        if position is not None:
            self.by_position.setdefault(position, []).append(entry)
        return entry

    def buffer_entry(self, entry: Entry, *, commit_first: bool = False) -> None:
        """Queue a re-creatable entry, committed within LINGER (see the module docstring);
        `commit_first` ones (a once step's outcome) also before the next step body starts,
        since losing them would park the run."""
        with self.buffer_lock:
            if not self.buffer:
                self.buffered_at = time.monotonic()
            self.buffer.append(entry)
            if commit_first:
                self.commit_first = True
        if self._linger is None and not self._arming:
            if threading.get_ident() == self.loop_thread:
                self._arm_linger()
            else:  # a sync workflow's thread: the loop arms it
                self._arming = True
                self.loop.call_soon_threadsafe(self._arm_linger)

    def _arm_linger(self) -> None:
        self._arming = False
        if self.buffer and self._linger is None:
            due = self.buffered_at + LINGER - time.monotonic()
            self._linger = self.loop.call_later(max(due, 0.0), self._linger_flush)

    def _linger_flush(self) -> None:
        """No write came within LINGER of the oldest buffered entry: commit the buffer on
        its own. The timer is not cancelled by writes (one per step cost more than the
        step's SQL): it is armed again for an entry buffered since, or dropped."""
        self._linger = None
        if not self.buffer or self.state.phase is not Phase.RUNNING:
            return
        if time.monotonic() < self.buffered_at + LINGER:
            self._arm_linger()
            return
        task = self.loop.create_task(self._quiet_flush())
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _quiet_flush(self) -> None:
        with contextlib.suppress(WorkerStopping, RunSuspended, ReplayEnd):
            await self.flush()  # if the run is stopping anyway, recovery reads the journal

    def overdue(self) -> bool:
        """The buffer is to be committed now: it grew past BUFFER_LIMIT, or its oldest entry
        waited LINGER (a workflow that never leaves the loop would starve the timer)."""
        return bool(self.buffer) and (
            len(self.buffer) >= BUFFER_LIMIT or time.monotonic() - self.buffered_at > LINGER
        )

    async def write(
        self,
        *entries: Entry,
        status: str | None = None,
        fields: dict[str, Any] | None = None,
        new_runs: list[NewRun] | None = None,
        consume_event: int | None = None,
        body: TxBody | None = None,
        stop_if_requested: bool = False,
    ) -> AppendResult:
        """Commit buffered entries plus `entries` (and a status change) in one transaction:
        the one way a run's journal is written. The store commits it on the calling thread
        when it can, else on its own thread, shared with other runs' writes. `body`: a
        function the store runs in that transaction, whose JSON is the last entry's data
        (a transactional step's), through the store's one generic entry."""
        if self.stream is not None and self.stream.rows:
            await self.stream.flush_or_keep()
        append = self._take(entries, stop_if_requested=stop_if_requested)
        append.status, append.new_runs = status, new_runs or []
        if fields:
            append.fields.update(fields)
        append.consume_event = consume_event
        try:
            if body is None:
                result = await self.store.append(append)
            else:
                result = await self._send(append, body)
        except WRITE_FAILURES as exc:
            result = await self._not_landed(append, len(entries), exc, body)
        if (
            result.status == RUNNING
            and not result.cancel_requested
            and result.pause_requested == self.state.pause
        ):
            return result  # the common answer: the run goes on as it was
        return self._applied(result, append)

    async def _send(self, append: Append, body: TxBody | None) -> AppendResult:
        if body is None:
            return await self.store.append(append)
        with_body = functools.partial(sqlops.append_with_body, append=append, body=body)
        return await self.store.run_sql(with_body, write=True)

    async def _not_landed(
        self, append: Append, added: int, exc: Exception, body: TxBody | None = None
    ) -> AppendResult:
        """A write met `exc`: land it once the store is back, or unwind (an operator's
        request, a lost lease, a store gone for good). `added`: the entries the caller gave,
        after the buffered ones in `append`."""
        try:
            if not isinstance(exc, StoreUnavailable):
                raise exc
            return await self._land(append, exc, body)
        except OperatorRequest as request:
            self._refused(request, append, added)
            await self.checkpoint()
            raise  # checkpoint always unwinds here
        except LeaseLost:
            raise self._lost(append) from None
        except StoreUnavailable as gone:
            raise self._unreachable(gone) from None

    async def _land(
        self, append: Append, first: StoreUnavailable, body: TxBody | None = None
    ) -> AppendResult:
        """The store went away during a write: send the same write again, with backoff,
        until it lands (a first try that landed unseen is recognised by its key, and
        not written twice), the lease turns out taken (LeaseLost: the fence refuses it)
        or this execution is given up (the worker's grace ended). A live worker thus
        records the outcome it holds instead of leaving it to recovery."""
        again = replace(append, retry=True)
        await to_loop()
        began, delay = time.monotonic(), RETRY_FIRST
        log.warning("worker %s: run %s: store unavailable while recording %d entr(ies) (%s); "
                    "holding them until it is back", self.worker_id, self.run_id,
                    len(append.entries), first)  # fmt: skip
        while self.state.phase is Phase.RUNNING:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)
            try:
                result = await self._send(again, body)
            except StoreUnavailable:
                continue
            log.warning("worker %s: run %s: store back after %.1fs; recorded what it held",
                        self.worker_id, self.run_id, time.monotonic() - began)  # fmt: skip
            return result
        raise first

    def _take(self, entries: tuple[Entry, ...], *, stop_if_requested: bool = False) -> Append:
        """The Append carrying the buffer plus `entries` (no status change: `write` sets what
        else it carries); the buffer is emptied meanwhile."""
        phase = self.state.phase
        if phase is Phase.LOST:
            raise WorkerStopping()
        if phase is Phase.RELEASED:
            raise RunSuspended("already parked by a sibling")
        if phase is Phase.CHECKING:
            raise ReplayEnd(self.position)
        with self.buffer_lock:
            buffered, self.buffer = self.buffer, []
            blobs, self.blobs = self.blobs, []
            self.commit_first = False
        return Append(
            run_id=self.run.id,
            epoch=self.epoch,
            entries=[*buffered, *entries],
            fields={"updated_at": self.clock.now()},
            blobs=blobs,
            blob_threshold=self.runtime.blob_threshold,
            stop_if_requested=stop_if_requested,
            direct_ok=len(self.runtime.active) <= 1,
            key=f"{_WRITES_OF}{next(_WRITES):x}",
        )

    def _refused(self, request: OperatorRequest, append: Append, added: int) -> None:
        """Nothing was written: put the buffer back and take note of the operator's request."""
        self._give_back(append, added)
        self.update(cancel=request.cancel or None, pause=request.pause or None)

    def _give_back(self, append: Append, added: int) -> None:
        """`append` was not written: its buffered entries (all but the last `added`) and
        blobs go back before anything buffered since."""
        with self.buffer_lock:
            back = append.entries[: len(append.entries) - added]
            if back and not self.buffer:
                self.buffered_at = time.monotonic()
            self.buffer = back + self.buffer
            self.blobs = append.blobs + self.blobs

    def _lost(self, append: Append) -> WorkerStopping:
        self.update(phase=Phase.LOST)
        observers.lease_lost(self.run_id, self.worker_id, "write refused")
        log.warning(
            "worker %s: write for run %s refused: lease epoch %d was taken over; "
            "%d entr(ies) dropped",
            self.worker_id,
            self.run_id,
            self.epoch,
            len(append.entries),
        )
        return WorkerStopping()

    def _unreachable(self, exc: StoreUnavailable) -> WorkerStopping:
        """The store is gone mid-run: stop this execution; the journal decides on recovery."""
        self.update(phase=Phase.LOST)
        log.warning("worker %s: run %s stopped: %s", self.worker_id, self.run_id, exc)
        return WorkerStopping()

    async def read(self, reading: Callable[[], Awaitable[T]]) -> T:
        """An engine read for this run (an event, a child): while the store is away it is
        tried again, as a write is, instead of reaching the workflow as an exception that
        would fail it (or stopping the run with a once outcome still buffered)."""
        delay = RETRY_FIRST
        while True:
            try:
                return await reading()
            except StoreUnavailable as exc:
                if self.state.stopped:
                    raise self._unreachable(exc) from None
                await to_loop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MOST)

    def _applied(self, result: AppendResult, append: Append) -> AppendResult:
        if result.status in TERMINAL:
            self.runtime.run_ended(ended_row(self.run, append))
        state = self.state
        ended = result.status not in ("running", "cancelling")  # it holds no lease now
        if (
            ended
            or (result.cancel_requested and not state.cancel)
            or (result.pause_requested != state.pause)
        ):
            phase = Phase.RELEASED if ended else None
            self.update(phase=phase, cancel=result.cancel_requested or None,
                        pause=result.pause_requested)  # fmt: skip
        return result

    async def flush(self) -> None:
        if self.buffer:
            await self.write()

    async def suspend(
        self, status: str, reason: str, *entries: Entry, fields: dict[str, Any] | None = None
    ) -> RunSuspended:
        """Commit a parked state, hand the lease back, and return the signal to unwind with.
        Two sibling steps may park the run at once (two calls aborted by `pause --now`): the
        first waits for the other, which parks it; the first then only adds its entries."""
        await to_loop()
        me = asyncio.current_task()
        if me is not None:
            self.suspending.add(me)
        try:
            await self.await_siblings()
        finally:
            if me is not None:
                self.suspending.discard(me)
        if self.state.phase is Phase.RELEASED:  # parked by a sibling meanwhile: the run stays so
            if entries:
                await self.write(*entries)
            return RunSuspended(reason)
        wake_at = (fields or {}).get("wake_at")
        deadline = self.run.deadline_at
        if (
            deadline is not None
            and (wake_at is None or wake_at > deadline)
            and status
            in (
                "sleeping",
                "waiting",
            )
        ):
            wake_at = deadline
        await self.write(
            *entries,
            status=status,
            fields={**(fields or {}), "wake_at": wake_at, "lease_owner": None, "lease_until": None},
        )
        self.update(phase=Phase.RELEASED)  # the write's answer said so already
        return RunSuspended(reason)

    async def await_siblings(self) -> None:
        """Let sibling steps started with asyncio.gather record their outcomes first."""
        me = asyncio.current_task()
        while any(t is not me and t not in self.suspending for t in self.inflight.values()):
            waiter: asyncio.Future[None] = self.loop.create_future()
            self._settling.append(waiter)
            await waiter

    def left(self, call: object) -> None:
        """A step call of this run is over: whoever waits for the steps in flight looks again."""
        del self.inflight[call]
        if self._settling:
            waiters, self._settling = self._settling, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # -- running coroutines from sync workflows --------------------------------------

    def call(self, coro: Coroutine[Any, Any, T]) -> Any:
        """Await `coro` in async workflows; from a sync workflow's thread, block on it while
        the event loop runs it."""
        if not self.sync_mode:
            return coro
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class SimulatedCrash(BaseException):
    """Raised by crash injection: the worker dies between a step's intent and its outcome."""


class ReplayEnd(BaseException):
    """Raised in replay-check mode when the workflow reaches the end of its journal."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


ROW_FIELDS = frozenset(f.name for f in fields(RunRow))


def ended_row(run: RunRow, append: Append) -> RunRow:
    """The row of `run` as the ending write `append` leaves it."""
    changed = {k: v for k, v in append.fields.items() if k in ROW_FIELDS}
    return replace(run, status=append.status or run.status, **changed)


def current() -> RunContext | None:
    """The run the calling code belongs to, if any."""
    return _current.get()


def require(what: str) -> RunContext:
    """The current run, or a clear error naming the call made outside a workflow."""
    ctx = _current.get()
    if ctx is None:
        raise PerdureError(f"perdure.{what}() can only be called inside a workflow")
    return ctx


def activate(ctx: RunContext | None) -> contextvars.Token[RunContext | None]:
    return _current.set(ctx)


def deactivate(token: contextvars.Token[RunContext | None]) -> None:
    _current.reset(token)


class _ToLoop:
    """See `to_loop`."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        if asyncio._get_running_loop() is None:
            yield  # a bare yield: `drive` hands the rest to the event loop


_TO_LOOP = _ToLoop()


def to_loop() -> _ToLoop:
    """Awaited before what needs the event loop (a timer, a task, the step pool): from a
    sync workflow's own thread the rest of the coroutine then runs on the loop (`drive`);
    on the loop it does nothing."""
    return _TO_LOOP


def drive(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """Run `coro` on this thread (a sync workflow's own) as far as it goes without the event
    loop: a store operation queued behind others blocks the thread (it yields a
    `concurrent.futures.Future`: store/threaded.py); anything else it waits for (`to_loop`, a
    loop's future) hands the rest to `loop`, and the thread waits for it to end."""
    try:
        yielded = coro.send(None)
        while isinstance(yielded, concurrent.futures.Future):
            concurrent.futures.wait((yielded,))
            yielded = coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    return asyncio.run_coroutine_threadsafe(_rest(coro, yielded), loop).result()


async def _rest(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    value: T = await _Resumed(coro, yielded)
    return value


class _Resumed:
    """A coroutine begun on another thread, going on inside the task that awaits this: what
    it yields goes to the task, what the task sends or throws goes back to it."""

    __slots__ = ("coro", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self.coro, self.yielded = coro, yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self.coro, self.yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                yielded = coro.send(sent)
            except StopIteration as done:
                return done.value
