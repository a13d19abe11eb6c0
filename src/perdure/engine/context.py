"""The state of one run while a worker replays it: positions, recorded entries, pending writes.

Writes are split by what a crash may lose. A *critical* write (the intent of a
`once` step, a suspension, a consumed event, the end of the run) is committed
before the workflow goes on. Other entries (outcomes, values, intents of
re-runnable steps) wait in a buffer and are committed, in order, with the next
critical write, after a slow step, or when the buffer grows: so the durable
journal is always a prefix of the one the workflow saw, and a crash can only
lose entries whose recovery is to run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
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
from ..store.base import (
    TERMINAL,
    Append,
    AppendResult,
    Blob,
    Entry,
    NewRun,
    OperatorRequest,
    RunRow,
    Store,
)
from ..store.blobs import inline_or_blob
from . import observers
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
LINGER = 0.005  # seconds a once step's outcome may wait for the next write before its own
SLOW_STEP = 0.05  # seconds: a step slower than this has its outcome committed at once
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
    db: Any = None  # the store's connection, for transactional steps

    @property
    def idempotency_key(self) -> str:
        """Stable across retries and recovery: the run id and the step's position."""
        return f"{self.run_id}:{self.position}"


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
        self.precious = False
        self._precious_at = 0.0  # loop.time() when the precious entry was buffered
        self._linger: asyncio.TimerHandle | None = None
        self.background: set[asyncio.Task[None]] = set()
        # the run's stream writer (engine.streams), once something wrote to the stream: its
        # rows are committed before any journal write, so no step's outcome outlives them
        self.stream: Any = None
        self.diverged: NonDeterminismError | None = None
        self.blobs: list[Blob] = []
        # A sync workflow's thread buffers entries while the loop may flush: guard the swap.
        self.buffer_lock = threading.Lock()
        self.loop_thread = threading.get_ident()
        self.state = RunState(pause=run.pause_requested)
        self._state_lock = threading.Lock()  # the loop and a sync workflow's thread change it
        self._cancel_sent = False  # the running task was cancelled (once is enough)
        self.task: asyncio.Task[Any] | None = None
        self.executing: dict[int, StepInfo] = {}  # steps whose body runs now, by position
        self.inflight: dict[asyncio.Future[None], asyncio.Task[Any] | None] = {}
        self.suspending: set[asyncio.Task[Any]] = set()  # sibling steps parking the run now
        self.crash_after_intent: frozenset[str] = frozenset()  # testing: crash injection
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
        if self.state.stopped:
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
        """This execution is over: a running one is ENDED (a lost or checking one stays so)."""
        with self._state_lock:
            if self.state.phase is Phase.RUNNING:
                self.state = replace(self.state, phase=Phase.ENDED)

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
            if self.state.phase is Phase.ENDED:
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
        if self.needs_flush():
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
        if text is not None:
            text, blob = inline_or_blob(text, self.runtime.blob_threshold)
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
            at=self.now(),
            worker=self.worker_id,
        )
        if position is not None:
            self.by_position.setdefault(position, []).append(entry)
        return entry

    def buffer_entry(self, entry: Entry, *, precious: bool = False) -> None:
        """Queue a re-creatable entry; `precious` ones (a once step's outcome) are committed
        before the next step executes, since losing them would park the run."""
        with self.buffer_lock:
            self.buffer.append(entry)
            arm = precious and not self.precious
            if arm:
                self.precious = True
                self._precious_at = self.loop.time()
        if arm and self._linger is None:
            if threading.get_ident() == self.loop_thread:
                self._arm_linger()
            else:
                self.loop.call_soon_threadsafe(self._arm_linger)

    def _arm_linger(self) -> None:
        if self.precious and self._linger is None:
            self._linger = self.loop.call_at(self._precious_at + LINGER, self._linger_flush)

    def _linger_flush(self) -> None:
        """No write came within LINGER of a once outcome: commit it on its own. The timer is
        not cancelled by writes (one per step cost more than the step's SQL): it is armed
        again for an outcome buffered since, or dropped if nothing precious waits."""
        self._linger = None
        if not self.precious or self.state.phase is not Phase.RUNNING:
            return
        if self.loop.time() < self._precious_at + LINGER:
            self._arm_linger()
            return
        task = self.loop.create_task(self._quiet_flush())
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _quiet_flush(self) -> None:
        with contextlib.suppress(WorkerStopping, RunSuspended, ReplayEnd):
            await self.flush()  # if the run is stopping anyway, recovery reads the journal

    def needs_flush(self) -> bool:
        return len(self.buffer) >= BUFFER_LIMIT

    async def write(
        self,
        *entries: Entry,
        status: str | None = None,
        fields: dict[str, Any] | None = None,
        new_runs: list[NewRun] | None = None,
        consume_event: int | None = None,
        tx_body: Any = None,
        stop_if_requested: bool = False,
    ) -> AppendResult:
        """Commit buffered entries plus `entries` (and a status change) in one transaction."""
        if self.stream is not None and self.stream.rows:
            await self.stream.settle()
        append = self._take(entries, stop_if_requested=stop_if_requested)
        append.status, append.new_runs = status, new_runs or []
        append.fields.update(fields or {})
        append.consume_event, append.tx_body = consume_event, tx_body
        try:
            result = await self.store.append(append)
        except WRITE_FAILURES as exc:
            result = await self._not_landed(append, len(entries), exc)
        return self._applied(result, append)

    def write_now(self, *entries: Entry, stop_if_requested: bool = False) -> AppendResult:
        """`write` from a sync workflow's thread: on this thread if the store can, else (and
        for what follows a write that did not land) through the loop."""
        append_now = getattr(self.store, "append_now", None)
        if append_now is None:
            return self.call(self.write(*entries, stop_if_requested=stop_if_requested))  # type: ignore[no-any-return]
        if self.stream is not None and self.stream.rows:
            self.call(self.stream.settle())
        append = self._take(entries, stop_if_requested=stop_if_requested)
        try:
            result = append_now(append)
        except WRITE_FAILURES as exc:
            result = self.call(self._not_landed(append, len(entries), exc))
        return self._applied(result, append)

    def write_here(
        self, *entries: Entry, stop_if_requested: bool = False
    ) -> AppendResult | Coroutine[Any, Any, AppendResult] | None:
        """`write` without awaiting, from the loop of a run alone in its worker, when the
        store can commit it on this thread now: its result. None if it cannot: nothing was
        taken and `entries` are forgotten (make them again for `write`). A coroutine if
        the write did not land: awaited, it lands it once the store is back, or unwinds."""
        append_here = getattr(self.store, "append_here", None)
        if (
            append_here is None
            or len(self.runtime.active) > 1
            or (self.stream is not None and self.stream.rows)
        ):
            self._forget(entries)
            return None
        precious = self.precious
        append = self._take(entries, stop_if_requested=stop_if_requested)
        try:
            result = append_here(append)
        except WRITE_FAILURES as exc:
            return self._landing(append, len(entries), exc)
        if result is None:  # the store thread is busy: the buffer back as it was
            self._give_back(append, len(entries))
            self.precious = self.precious or precious
            self._forget(entries)
            return None
        return self._applied(result, append)

    def _forget(self, entries: tuple[Entry, ...]) -> None:
        """Entries made but never written, as if never made (a replay must not find them)."""
        for entry in entries:
            if entry.position is not None:
                self.by_position[entry.position].remove(entry)

    async def _landing(self, append: Append, added: int, exc: Exception) -> AppendResult:
        return self._applied(await self._not_landed(append, added, exc), append)

    async def _not_landed(self, append: Append, added: int, exc: Exception) -> AppendResult:
        """A write met `exc`: land it once the store is back, or unwind (an operator's
        request, a lost lease, a store gone for good). `added`: the entries the caller gave,
        after the buffered ones in `append`."""
        try:
            if not isinstance(exc, StoreUnavailable):
                raise exc
            return await self._land(append, exc)
        except OperatorRequest as request:
            self._refused(request, append, added)
            await self.checkpoint()
            raise  # checkpoint always unwinds here
        except LeaseLost:
            raise self._lost(append) from None
        except StoreUnavailable as gone:
            raise self._unreachable(gone) from None

    async def _land(self, append: Append, first: StoreUnavailable) -> AppendResult:
        """The store went away during a write: send the same write again, with backoff,
        until it lands (a first try that landed unseen is recognised by its key, and
        not written twice), the lease turns out taken (LeaseLost: the fence refuses it)
        or this execution is given up (the worker's grace ended). A live worker thus
        records the outcome it holds instead of leaving it to recovery."""
        again = replace(append, retry=True)
        began, delay = time.monotonic(), RETRY_FIRST
        log.warning("worker %s: run %s: store unavailable while recording %d entr(ies) (%s); "
                    "holding them until it is back", self.worker_id, self.run_id,
                    len(append.entries), first)  # fmt: skip
        while self.state.phase is Phase.RUNNING:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)
            try:
                result = await self.store.append(again)
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
        if phase is Phase.ENDED:
            raise RunSuspended("already parked by a sibling")
        if phase is Phase.CHECKING:
            raise ReplayEnd(self.position)
        with self.buffer_lock:
            buffered, self.buffer = self.buffer, []
            blobs, self.blobs = self.blobs, []
            self.precious = False
        return Append(
            run_id=self.run_id,
            epoch=self.epoch,
            entries=[*buffered, *entries],
            fields={"updated_at": self.now()},
            blobs=blobs,
            blob_threshold=self.runtime.blob_threshold,
            stop_if_requested=stop_if_requested,
            inline_ok=len(self.runtime.active) <= 1,
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
            self.buffer = append.entries[: len(append.entries) - added] + self.buffer
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
            phase = Phase.ENDED if ended else None
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
        me = asyncio.current_task()
        if me is not None:
            self.suspending.add(me)
        try:
            await self.settle_inflight()
        finally:
            if me is not None:
                self.suspending.discard(me)
        if self.state.phase is Phase.ENDED:  # parked by a sibling meanwhile: the run stays so
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
        self.update(phase=Phase.ENDED)  # the write's answer said so already
        return RunSuspended(reason)

    async def settle_inflight(self) -> None:
        """Let sibling steps started with asyncio.gather record their outcomes first."""
        me = asyncio.current_task()
        pending = [f for f, task in self.inflight.items()
                   if task is not me and task not in self.suspending and not f.done()]  # fmt: skip
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- running coroutines from sync workflows --------------------------------------

    def call(self, coro: Coroutine[Any, Any, T], *, track: bool = False) -> Any:
        """Await `coro` in async workflows; block on it from a sync workflow's thread.

        `track` marks a step execution, which a sibling's suspension waits for.
        """
        if track:
            coro = self._tracked(coro)
        if not self.sync_mode:
            return coro
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    async def _tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        done: asyncio.Future[None] = self.loop.create_future()
        self.inflight[done] = asyncio.current_task()
        try:
            return await coro
        finally:
            self.inflight.pop(done, None)
            done.set_result(None)


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


def monotonic() -> float:
    return time.monotonic()
