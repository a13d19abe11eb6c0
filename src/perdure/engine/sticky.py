"""Parked runs kept suspended in memory by the worker process that parked them (a sticky
cache, as Temporal keeps workflow state): their next wake-up goes on from the wait instead
of replaying the journal from the top.

An async workflow's coroutine is driven by a `Driver` that forwards what the coroutine
awaits to the task running it; at a park point the driver returns and the coroutine stays
suspended as a plain object: no task, no thread, no lease. The journal stays the truth:
an entry is reused only if the run's next claim has the next lease epoch, in this event
loop, and the journal gained nothing since but this execution's own entries (a foreign
write, a takeover, a cancel or a deploy in between means a normal replay). The cache is
bounded (runs and an estimate of their entries' bytes); the least recently parked go first.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..store.base import CANCELLING, RunRow
from .context import RunContext, activate
from .state import Phase

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")

MAX_RUNS = 500  # parked runs kept per process (each ~6 KiB: bench.idle)
MAX_BYTES = 32 * 2**20  # estimated bytes of the kept runs, per process
RUN_BYTES = 16 * 2**10  # estimate for one kept run's frames and context besides entries
ENTRY_BYTES = 200  # estimate for one kept Entry besides its data
HORIZON = 300.0  # seconds: a run parked on a timer further off is not kept in memory
OPERATOR_KINDS = frozenset({"run.paused", "run.resumed", "run.pause_requested"})

_PARK = object()  # yielded up to the driver: the workflow parks here, in memory


class _ParkPoint:
    """Awaited where a parked workflow waits; the driver hands control back from here."""

    def __await__(self) -> Generator[Any, Any, None]:
        yield _PARK


class Parked:
    """What `Driver` returns when the workflow parked in memory (not finished)."""


PARKED = Parked()


class Driver:
    """Runs a workflow coroutine inside the awaiting task, in a context of its own, so it can
    be left suspended at a park point and resumed later by another task."""

    def __init__(self, coro: Coroutine[Any, Any, Any], ctx: RunContext) -> None:
        self.coro = coro
        self.context = contextvars.copy_context()
        self.context.run(activate, ctx)

    def __await__(self) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                if error is None:
                    yielded = self.context.run(self.coro.send, value)
                else:
                    yielded = self.context.run(self.coro.throw, error)
            except StopIteration as done:
                return done.value
            if yielded is _PARK:
                return PARKED
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                self.close()
                raise
            except BaseException as exc:  # e.g. the task was cancelled: the workflow sees it
                value, error = None, exc

    def close(self) -> None:
        """Drop the suspended workflow (its `finally` blocks run now; what they raise is logged)."""
        try:
            self.context.run(self.coro.close)
        except BaseException as exc:
            log.debug("closing a parked workflow raised %r", exc)


@dataclass(slots=True)
class Kept:
    """One parked run: its context and driver, the lease epoch it parked under, and the last
    journal seq known to be accounted for."""

    ctx: RunContext
    driver: Driver
    epoch: int
    last_seq: int
    size: int


class Cache:
    """The parked runs of one runtime, least recently parked first."""

    def __init__(self) -> None:
        self.kept: OrderedDict[str, Kept] = OrderedDict()
        self.bytes = 0
        self.resumed = 0  # wake-ups served from memory (for tests and the bench)
        self.missed = 0  # cached runs that had to replay after all

    def put(self, kept: Kept) -> None:
        self.drop(kept.ctx.run_id)
        self.kept[kept.ctx.run_id] = kept
        self.bytes += kept.size
        while self.kept and (len(self.kept) > MAX_RUNS or self.bytes > MAX_BYTES):
            self.drop(next(iter(self.kept)))

    def pop(self, run_id: str) -> Kept | None:
        kept = self.kept.pop(run_id, None)
        if kept is not None:
            self.bytes -= kept.size
        return kept

    def drop(self, run_id: str) -> None:
        kept = self.pop(run_id)
        if kept is not None:
            kept.driver.close()

    def clear(self) -> None:
        for run_id in list(self.kept):
            self.drop(run_id)


_ATTRIBUTE = "_perdure_sticky"  # held by the runtime itself, so it goes with the runtime


def cache_of(runtime: Runtime) -> Cache:
    """The runtime's cache (kept on the runtime: the kept contexts refer back to it, so a
    table keyed by runtime would keep every runtime alive)."""
    cache = getattr(runtime, _ATTRIBUTE, None)
    if not isinstance(cache, Cache):
        cache = Cache()
        setattr(runtime, _ATTRIBUTE, cache)
    return cache


_drivers: dict[RunContext, Driver] = {}  # the runs being driven now (registered by the runner)


def start(ctx: RunContext, coro: Coroutine[Any, Any, Any]) -> Driver:
    """A driver for an async workflow's coroutine, registered for `ctx` until `stop`."""
    driver = _drivers[ctx] = Driver(coro, ctx)
    return driver


def resume(ctx: RunContext, driver: Driver) -> Driver:
    _drivers[ctx] = driver
    return driver


def stop(ctx: RunContext) -> None:
    """The execution ended without parking in memory: a workflow left unfinished (a deadline
    met on waking, say) is closed now, not whenever it is collected."""
    driver = _drivers.pop(ctx, None)
    if driver is not None:
        driver.close()


def can_park(ctx: RunContext) -> bool:
    """True if the workflow may park in memory here: an async workflow driven by a `Driver`,
    parking from its own task with no sibling step in flight."""
    return (
        ctx in _drivers
        and not ctx.sync_mode
        and ctx.state.phase is not Phase.CHECKING
        and not ctx.state.hold
        and not ctx.inflight
        and asyncio.current_task() is ctx.task
    )


async def park(ctx: RunContext, wake_at: float | None = None) -> bool:
    """After a parked state was committed: stay suspended in memory until this process claims
    the run again (True: go on, under the new lease), or give up (False: unwind to replay).
    A run parked on a timer stays in memory only if it wakes within HORIZON: a long sleep
    would hold memory for nothing a replay at its wake-up cannot do as cheaply."""
    if wake_at is not None and wake_at - ctx.now() > HORIZON:
        return False
    if not can_park(ctx):
        return False
    await _ParkPoint()
    return True


def size_of(ctx: RunContext) -> int:
    entries = sum(len(v) for v in ctx.by_position.values())
    data = sum(len(e.data or "") for v in ctx.by_position.values() for e in v)
    return RUN_BYTES + entries * ENTRY_BYTES + data


def keep(runtime: Runtime, ctx: RunContext, last_seq: int) -> None:
    """Keep a run that parked in memory, dropping the entries of positions it is past."""
    driver = _drivers.pop(ctx, None)
    if driver is None:
        return
    cut = ctx.position - 1  # the position it waits at is read again when it goes on
    ctx.by_position = {pos: found for pos, found in ctx.by_position.items() if pos >= cut}
    ctx.task = None
    cache_of(runtime).put(Kept(ctx, driver, ctx.epoch, last_seq, size_of(ctx)))


async def take(runtime: Runtime, run: RunRow, recovered: bool) -> Kept | None:
    """The kept state of `run` if it may go on from memory under this claim, else None
    (a kept state that may not is dropped)."""
    cache = cache_of(runtime)
    kept = cache.pop(run.id)
    if kept is None:
        return None
    ok = (
        not recovered
        and run.status != CANCELLING
        and run.lease_epoch == kept.epoch + 1
        and kept.ctx.loop is asyncio.get_running_loop()
        and run.code_version == kept.ctx.run.code_version
    )
    if ok:
        tail = await runtime.store.journal(run.id, kept.last_seq)
        ok = all(
            e.epoch == kept.epoch or (e.epoch is None and e.kind in OPERATOR_KINDS) for e in tail
        )
        if tail:
            kept.last_seq = tail[-1].seq
    if not ok:
        cache.missed += 1
        kept.driver.close()
        return None
    cache.resumed += 1
    return kept


def rearm(kept: Kept, run: RunRow, *, worker_id: str, clock: Any) -> RunContext:
    """Point a kept context at its new claim (lease epoch, run row, worker)."""
    ctx = kept.ctx
    ctx.run = run
    ctx.epoch = run.lease_epoch
    ctx.worker_id = worker_id
    ctx.clock = clock
    ctx.rearm(run)
    return ctx
