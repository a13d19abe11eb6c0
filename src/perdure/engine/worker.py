"""The worker: claims runnable runs under leases, runs them, heartbeats, drains on stop.

Loops (claim, heartbeat) run as tasks supervised together: if one fails, the
worker stops. Recovery is bulk: one claim takes every expired lease it can fit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import StoreError
from ..store.base import CANCELLING, Claim
from . import observers
from .client import Client
from .clock import Clock, SystemClock
from .context import RunContext, SimulatedCrash
from .peers import release_dead_peers
from .runner import execute
from .services import supervise

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")
PRESENCE = 10.0  # seconds between a worker's registry updates (less with a short lease)


def make_worker_id() -> str:
    """host:pid:random, so a restarted process never reuses a lease owner name."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker runs.

    Args:
        concurrency: runs executed at once.
        lease: seconds a claim lasts without a heartbeat; heartbeats every third of it.
        poll: longest idle wait between claims when nothing signals new work.
        grace: seconds running steps get to finish after SIGTERM/SIGINT.
        inline_sleep: sleeps and retry delays up to this long stay in process.
        max_recoveries: recoveries in a row a run may crash before it is made `dead`
            instead of replayed again (None: never).
        gc_every: seconds between background gc passes applying workflows' `retention`
            (None or 0: no background gc; `perdure gc` still works).
    """

    concurrency: int = 16
    lease: float = 30.0
    poll: float = 0.5
    grace: float = 30.0
    inline_sleep: float = 1.0
    max_recoveries: int | None = 5
    gc_every: float | None = 300.0


class Worker:
    """Runs an app's workflows from its store until stopped."""

    def __init__(
        self, runtime: Runtime, options: WorkerOptions | None = None, *, clock: Clock | None = None
    ) -> None:
        self.runtime = runtime
        self.options = options or WorkerOptions()
        self.clock = clock or runtime.clock
        self.id = make_worker_id()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.contexts: dict[str, RunContext] = {}
        self.stopping = asyncio.Event()
        self.executor = ThreadPoolExecutor(
            max_workers=max(4, self.options.concurrency), thread_name_prefix="perdure-wf"
        )
        self.claimed = 0
        self.finished = 0
        self.crash_after_intent: frozenset[str] = frozenset()
        self.crashed: BaseException | None = None
        if isinstance(self.clock, SystemClock):
            self.inline_sleep = self.options.inline_sleep
        else:
            self.inline_sleep = 0.0  # a driven clock cannot drive asyncio.sleep

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> None:
        """Claim and run until `stop()`; then drain for `grace` seconds and release leases."""
        await self.runtime.open_store()
        self.runtime.listen_work()
        loops = [
            asyncio.create_task(self._claim_loop(), name="perdure-claim"),
            asyncio.create_task(self._heartbeat_loop(), name="perdure-heartbeat"),
            asyncio.create_task(self._presence_loop(), name="perdure-presence"),
            asyncio.create_task(self._peers_loop(), name="perdure-peers"),
        ]
        if self.options.gc_every:
            loops.append(asyncio.create_task(self._gc_loop(), name="perdure-gc"))
        for service in self.runtime.services:
            loops.append(asyncio.create_task(supervise(service, self), name=service.name))
        stop_wait = asyncio.create_task(self.stopping.wait())
        try:
            done, _ = await asyncio.wait([*loops, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop_wait and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.stopping.set()
            await self._drain()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, stop_wait, return_exceptions=True)
            self.executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self.stopping.set()
        self.runtime.notify()

    async def _drain(self) -> None:
        if self.crashed is not None:
            return
        running = list(self.tasks.values())
        if running:
            log.info(
                "worker %s: waiting up to %.0fs for %d run(s)",
                self.id,
                self.options.grace,
                len(running),
            )
            await asyncio.wait(running, timeout=self.options.grace)
        leftover = [rid for rid, t in self.tasks.items() if not t.done()]
        for rid in leftover:
            ctx = self.contexts.get(rid)
            if ctx is not None:
                ctx.lost = True
            self.tasks[rid].cancel()
        if leftover:
            await asyncio.gather(*(self.tasks[r] for r in leftover), return_exceptions=True)
            try:
                await self.runtime.store.release(self.id, leftover)
            except StoreError as exc:  # the leases will simply expire
                log.warning("worker %s: could not release leases (%s)", self.id, exc)

    # -- claiming ----------------------------------------------------------------------

    async def claim_once(self) -> int:
        """Claim as many runnable runs as there are free slots and start them."""
        free = self.options.concurrency - len(self.tasks)
        if free <= 0 or self.stopping.is_set():
            return 0
        held = collections.Counter(ctx.run.queue for ctx in self.contexts.values())
        claims = await self.runtime.store.claim(
            self.id,
            self.clock.now(),
            self.options.lease,
            free,
            list(self.runtime.workflows),
            list(self.runtime.queues.values()),
            held,
        )
        for claim in claims:
            self._start(claim)
        return len(claims)

    def _start(self, claim: Claim) -> None:
        run_id = claim.run.id
        self.claimed += 1
        if claim.recovered_from:
            log.info("worker %s recovers run %s from %s", self.id, run_id, claim.recovered_from)
            observers.run_recovered(run_id, self.id, claim.recovered_from)
        task = asyncio.create_task(
            execute(
                self.runtime,
                claim,
                worker_id=self.id,
                clock=self.clock,
                inline_sleep=self.inline_sleep,
                executor=self.executor,
                contexts=self.contexts,
                crash_after_intent=self.crash_after_intent,
                max_recoveries=self.options.max_recoveries,
            ),
            name=f"perdure-run-{run_id}",
        )
        self.tasks[run_id] = task
        task.add_done_callback(functools.partial(self._done, run_id))

    def _done(self, run_id: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(run_id, None)
        self.finished += 1
        error = None if task.cancelled() else task.exception()
        if isinstance(error, SimulatedCrash):
            self._die(error)
        elif error is not None:
            log.error("run %s: engine error", run_id, exc_info=error)
        self.runtime.notify()

    def _die(self, error: BaseException) -> None:
        """Crash injection: stop at once, writing nothing more and releasing no lease."""
        self.crashed = error
        self.stopping.set()
        for rid, task in self.tasks.items():
            ctx = self.contexts.get(rid)
            if ctx is not None:
                ctx.lost = True
            task.cancel()

    async def _claim_loop(self) -> None:
        backoff = 0.05
        while not self.stopping.is_set():
            try:
                if await self.claim_once():
                    await asyncio.sleep(0)
                    continue
                wait = await self._idle_wait()
                backoff = 0.05
            except StoreError as exc:  # e.g. the database restarts: keep trying, slower
                log.warning(
                    "worker %s: cannot claim (%s); retrying in %.2fs", self.id, exc, backoff
                )
                wait, backoff = backoff, min(backoff * 2, 2.0)
            await self.runtime.wait_work(wait)

    async def _idle_wait(self) -> float:
        wait = self.options.poll
        if len(self.tasks) >= self.options.concurrency:
            return wait  # full: a finishing run wakes the loop; no timer matters until then
        wake = await self.runtime.store.next_wake(list(self.runtime.workflows))
        if wake is not None:
            wait = min(wait, max(0.0, wake - self.clock.now()) + 0.001)
        return wait

    # -- leases ----------------------------------------------------------------------

    async def heartbeat_once(self) -> None:
        held = list(self.tasks)
        if not held:
            return
        states = await self.runtime.store.heartbeat(
            self.id, held, self.clock.now() + self.options.lease
        )
        alive = {s.run_id: s for s in states}
        for run_id in held:
            ctx = self.contexts.get(run_id)
            state = alive.get(run_id)
            task = self.tasks.get(run_id)
            if ctx is None or task is None:
                continue
            if state is None:
                log.warning("worker %s lost the lease of run %s", self.id, run_id)
                observers.lease_lost(run_id, self.id, "heartbeat")
                ctx.lost = True
                task.cancel()
                continue
            ctx.pause_requested = state.pause_requested
            ctx.hold_requested = ctx.hold_requested or state.hold
            if state.status == CANCELLING:
                ctx.request_cancel()

    async def _heartbeat_loop(self) -> None:
        interval = self.options.lease / 3
        while not self.stopping.is_set():
            await asyncio.sleep(min(interval, 1.0) if self.tasks else interval)
            try:
                await self.heartbeat_once()
            except StoreError as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.id, exc)

    async def _peers_loop(self) -> None:
        """Now and every lease/3 seconds: recover at once the runs of dead local workers."""
        while not self.stopping.is_set():
            try:
                if await release_dead_peers(self.runtime.store, self.id, self.clock.now()):
                    self.runtime.notify()
            except StoreError as exc:
                log.warning("worker %s: cannot check for dead workers (%s)", self.id, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.options.lease / 3)

    async def _presence_loop(self) -> None:
        """Tell the store this worker exists and is alive (idle or not), every PRESENCE
        seconds at most; on the way out, that it stopped."""
        from ..store.workers_sql import WorkerRow

        host, pid, _ = self.id.split(":", 2)
        every = min(self.options.lease / 3, PRESENCE)
        started = self.clock.now()
        try:
            while not self.stopping.is_set():
                row = WorkerRow(self.id, host, int(pid), started, self.clock.now(),
                                self.options.concurrency, len(self.tasks))  # fmt: skip
                try:
                    await self.runtime.store.worker_beat(row)
                except StoreError as exc:
                    log.warning("worker %s: presence not recorded (%s)", self.id, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), every)
        finally:
            if self.crashed is None:  # a (simulated) crash writes nothing more, like kill -9
                with contextlib.suppress(StoreError, asyncio.CancelledError):
                    await self.runtime.store.worker_stopped(self.id, self.clock.now())

    # -- retention ---------------------------------------------------------------------

    async def _gc_loop(self) -> None:
        """Apply retention now and every `gc_every` seconds; a failed pass is only logged."""
        every = self.options.gc_every or 0.0
        while not self.stopping.is_set():
            try:
                report = await Client(self.runtime).gc()
                if report.runs:
                    log.info("worker %s: gc %s", self.id, report)
            except Exception as exc:  # gc must never stop the worker
                log.warning(
                    "worker %s: gc pass failed (%s); next in %.0fs",
                    self.id,
                    exc,
                    every,
                    exc_info=not isinstance(exc, StoreError),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), every)

    # -- testing -----------------------------------------------------------------------

    async def run_until_idle(self, max_rounds: int = 10_000) -> int:
        """Claim and run until nothing is runnable at the clock's current time (tests)."""
        await self.runtime.open_store()
        total = 0
        for _ in range(max_rounds):
            started = await self.claim_once()
            total += started
            if not started and not self.tasks:
                return total  # nothing running could still make work runnable
            if self.tasks:
                await asyncio.wait(list(self.tasks.values()), return_when=asyncio.FIRST_COMPLETED)
            if self.crashed is not None:
                if self.tasks:
                    await asyncio.wait(list(self.tasks.values()))
                raise self.crashed
        return total
