"""The worker: claims runnable runs under leases, runs them, heartbeats, drains on stop.

Loops (claim, heartbeat) run as tasks supervised together: if one fails, the
worker stops. Recovery is bulk: one claim takes every expired lease it can fit.

A graceful stop (`stop()`, SIGTERM/SIGINT) claims nothing more and starts no new
step: each run is handed back (its buffered outcomes committed, its lease
released) at its next step boundary. Leases keep being renewed meanwhile. When
the grace ends, or at a second `stop()`, the steps still executing are abandoned:
the journal says they were stopped, not crashed, and their runs are released.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import logging
import os
import re
import signal
import socket
import sys
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from ..errors import ConfigError, PerdureError, StoreError
from ..store.base import CANCELLING, Claim, RunRow
from . import aborts, observers
from .client import Client
from .clock import MAX_SKEW, Clock, SystemClock, follow_server
from .context import RunContext, SimulatedCrash
from .peers import (
    PRESENCE,
    RUNNING,
    SILENT_AFTER,
    PeerWatch,
    pid_gone,
    release_dead_peers,
    this_process,
)
from .runner import execute
from .services import Starting, not_working, supervise
from .state import Phase
from .versions import check_build, default_build, held_versions, record_build, routing

if TYPE_CHECKING:
    from ..store.workers_sql import WorkerRow
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")
_LIVE_IDS: set[str] = set()  # ids registered by workers of this process that still run


def make_worker_id() -> str:
    """host:pid:random, so a restarted process never reuses a lease owner name."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def public_url(url: str) -> str:
    """A store URL fit to print: no password, no query option but the schema."""
    base, _, query = url.partition("?")
    base = re.sub(r"(://[^:/@]*):[^@/]*@", r"\1@", base)
    kept = urlencode([(k, v) for k, v in parse_qsl(query) if k == "schema"])
    return f"{base}?{kept}" if kept else base


def id_reusable(row: WorkerRow, now: float) -> bool:
    """May a starting worker take the id `row` was registered under? Only if that worker
    stopped, or is provably dead (this host, pid gone), or is of another host and silent."""
    if row.stopped_at is not None:
        return True
    if row.host == socket.gethostname():
        if row.pid == os.getpid():
            return row.id not in _LIVE_IDS  # this pid's earlier life (a container restart)
        return pid_gone(row.pid)
    return now - row.heartbeat_at > SILENT_AFTER


def check_worker_id(worker_id: str) -> str:
    """`worker_id` if it can name a worker (printable, no spaces), else a ConfigError."""
    if (
        not worker_id
        or len(worker_id) > 200
        or not worker_id.isprintable()
        or any(c.isspace() for c in worker_id)
    ):
        raise ConfigError(f"worker id {worker_id!r}: use 1-200 printable characters without spaces")
    return worker_id


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker runs.

    Args:
        id: the worker's name (lease owner, `perdure workers`, `pause --worker`); unique
            among live workers of the store. None: `host:pid:random`.
        concurrency: runs executed at once.
        lease: seconds a claim lasts without a heartbeat; heartbeats every third of it.
        poll: longest idle wait between claims when nothing signals new work.
        grace: seconds running steps get to finish after SIGTERM/SIGINT.
        inline_sleep: sleeps and retry delays up to this long stay in process.
        max_recoveries: recoveries in a row a run may crash before it is made `dead`
            instead of replayed again (None: never).
        gc_every: seconds between background gc passes applying workflows' `retention`
            (None or 0: no background gc; `perdure gc` still works).
        announce: print one `ready worker=... store=... concurrency=...` line on stdout
            once claiming and its message triggers consume (10 s at most; those that do
            not are named: `not_consuming=NAME:STATE,...`), for supervisors and scripts.
        build: the name of the code it runs, kept with its presence record with the
            version of each workflow it holds (None: a hash of those versions); two live
            workers of one build must hold the same code.
    """

    id: str | None = None
    concurrency: int = 16
    lease: float = 30.0
    poll: float = 0.5
    grace: float = 30.0
    inline_sleep: float = 1.0
    max_recoveries: int | None = 5
    gc_every: float | None = 300.0
    announce: bool = False
    build: str | None = None


class Worker:
    """Runs an app's workflows from its store until stopped."""

    def __init__(
        self, runtime: Runtime, options: WorkerOptions | None = None, *, clock: Clock | None = None
    ) -> None:
        self.runtime = runtime
        self.options = options or WorkerOptions()
        self.clock = clock or runtime.clock
        self.id = check_worker_id(self.options.id) if self.options.id else make_worker_id()
        workflows = runtime.workflows
        self.build = (
            check_build(self.options.build) if self.options.build else default_build(workflows)
        )
        self.version_since: dict[str, float] = {}  # when each of its versions was first deployed
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.contexts: dict[str, RunContext] = {}
        self.stopping = asyncio.Event()  # no new claim, no new step
        self.stop_now = asyncio.Event()  # a second stop: abandon what still executes
        self.ready = asyncio.Event()  # claiming, its starting services answered (`_announce`)
        self.executor = ThreadPoolExecutor(
            max_workers=max(4, self.options.concurrency), thread_name_prefix="perdure-wf"
        )
        self.started_at = self.clock.now()
        self.claimed = 0
        self.finished = 0
        self.abandoned = 0  # steps left executing when the drain ended
        self.crash_after_intent: frozenset[str] = frozenset()
        self.crashed: BaseException | None = None
        self.claim_unsure = False  # the last claim failed: it may have taken runs unseen
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop it claims on
        # the worker's own context: every run's task starts from it, never from the context
        # of whoever made the run runnable (a caller's store wait bound, its run or step)
        self.context = contextvars.copy_context()
        self.reserved = 0  # slots promised to runs being created claimed by it (`reserve`)
        # (work signals, loop time): its last claim looked and left no runnable run
        # behind; it holds until new work is signalled or that time (a timer, a poll)
        self.drained: tuple[int, float] | None = None
        self.peers: PeerWatch | None = None  # set at start: the watch for dead workers
        if isinstance(self.clock, SystemClock):
            self.inline_sleep = self.options.inline_sleep
        else:
            self.inline_sleep = 0.0  # a driven clock cannot drive asyncio.sleep

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> None:
        """Claim and run until `stop()`; then drain for `grace` seconds and release leases.

        Raises:
            PerdureError: the chosen `id` belongs to a live worker.
        """
        await self.runtime.open_store()
        await self._register()
        try:
            await self._start_peers()
            await self._serve()
        finally:
            _LIVE_IDS.discard(self.id)

    async def _serve(self) -> None:
        self.runtime.listen_work()
        # stop with the first signal; the heartbeat and presence loops go on while draining
        stoppable = [
            asyncio.create_task(self._claim_loop(), name="perdure-claim"),
            asyncio.create_task(self._peers_loop(), name="perdure-peers"),
        ]
        lasting = [
            asyncio.create_task(self._heartbeat_loop(), name="perdure-heartbeat"),
            asyncio.create_task(self._presence_loop(), name="perdure-presence"),
        ]
        if self.options.gc_every:
            stoppable.append(asyncio.create_task(self._gc_loop(), name="perdure-gc"))
        for service in self.runtime.services:
            stoppable.append(asyncio.create_task(supervise(service, self), name=service.name))
        stop_wait = asyncio.create_task(self.stopping.wait())
        self.loop = asyncio.get_running_loop()
        self.context = contextvars.copy_context()
        starting = [s for s in self.runtime.services if isinstance(s, Starting)]
        announce = asyncio.create_task(self._announce(starting), name="perdure-ready")
        self.runtime.takers.append(self)
        loops = [*stoppable, *lasting]
        try:
            done, _ = await asyncio.wait([*loops, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop_wait and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.runtime.takers.remove(self)
            announce.cancel()
            if not self.stopping.is_set():  # a loop failed: stop as if signalled
                self.stop()
            # a claim in flight must finish, or its runs would wait out their leases; they
            # start as the worker stops and are handed back at once
            await asyncio.wait(stoppable[:1], timeout=max(5.0, self.options.lease / 3))
            await self._drain()  # services and gc saw `stopping` too; what is left is cut
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, stop_wait, return_exceptions=True)
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def _register(self) -> None:
        """Enter the worker registry; a chosen id a live worker holds is refused."""
        from ..store.workers_sql import WorkerRow

        self.started_at = self.clock.now()
        now = self.started_at
        row = WorkerRow(self.id, socket.gethostname(), os.getpid(), now, now,
                        self.options.concurrency, 0, proc=this_process())  # fmt: skip
        if self.options.id is None:  # host:pid:random is unique by construction
            try:
                await self.runtime.store.worker_beat(row)  # known before its first claim
            except StoreError as exc:  # the presence loop registers it then
                log.warning("worker %s: presence not recorded (%s)", self.id, exc)
            await self._register_build(now)
            return
        holder = await self.runtime.store.worker_register(row)
        if holder is not None and id_reusable(holder, now):  # stopped or dead: take its place
            holder = await self.runtime.store.worker_register(row, replaces=holder)
        if holder is not None:
            raise PerdureError(
                f"worker id {self.id!r} is taken by a live worker (host {holder.host}, "
                f"pid {holder.pid}, last seen {max(0.0, now - holder.heartbeat_at):.0f}s ago); "
                "stop it or choose another --id"
            )
        _LIVE_IDS.add(self.id)
        await self._register_build(now)
        # the runs a dead previous holder of this id still leases: recover them now
        held = [r.id for r in await self.runtime.store.list_runs(statuses=RUNNING, limit=100_000)
                if r.lease_owner == self.id and (r.lease_until or 0) > now]  # fmt: skip
        if held:
            log.info("worker %s: recovering the %d run(s) this id held before", self.id,
                     len(held))  # fmt: skip
            await self.runtime.store.release(self.id, held)
            self.runtime.notify()

    async def _register_build(self, now: float) -> None:
        """Record its build and workflow versions with its presence; refused (nothing
        claimed) if a live worker runs that build with other code."""
        versions = held_versions(self.runtime.workflows)
        try:
            since, other = await record_build(
                self.runtime.store, self.id, self.build, versions, now, now - SILENT_AFTER
            )
        except StoreError as exc:  # claims route as if its versions were the newest
            log.warning("worker %s: build not recorded (%s)", self.id, exc)
            return
        if other is not None:
            from ..store.workers_sql import WorkerRow

            _LIVE_IDS.discard(self.id)
            gone = WorkerRow(self.id, socket.gethostname(), os.getpid(), now, now,
                             self.options.concurrency, 0, stopped_at=now)  # fmt: skip
            with contextlib.suppress(StoreError):
                await self.runtime.store.worker_beat(gone)
            raise PerdureError(
                f"build {self.build!r} is run by live worker {other} with other code: give "
                "this code another --build, or deploy the same code to both"
            )
        self.version_since = since

    async def _start_peers(self) -> None:
        """Before the first claim: hold this worker's session (PostgreSQL), then hand back
        at once the runs of workers already proven dead (a restart after kill -9)."""
        from ..store.workers_sql import WorkerRow

        row = WorkerRow(self.id, socket.gethostname(), os.getpid(), self.started_at,
                        self.started_at, self.options.concurrency, 0)  # fmt: skip
        store = self.runtime.store
        try:
            self.peers = PeerWatch(store, self.id, sessions=await store.worker_session(row))
            now = self.clock.now()
            if await self.peers.check(now) + await release_dead_peers(store, self.id, now):
                self.runtime.notify()
        except StoreError as exc:  # the peers loop tries again
            log.warning("worker %s: cannot check for dead workers (%s)", self.id, exc)
            self.peers = self.peers or PeerWatch(store, self.id, sessions=False)

    async def _announce(self, starting: Sequence[Starting]) -> None:
        """Ready once its services that take a moment to start (message triggers) work,
        or READY_WAIT seconds at most: the line then names those not working
        (`not_consuming=orders:refused,...`), and the log says why. It claims meanwhile."""
        idle = await not_working(starting, self.stopping) if starting else {}
        if self.stopping.is_set():
            return  # stopped before it was ready: never ready
        self.ready.set()
        log.info("worker %s: claiming (concurrency %d)", self.id, self.options.concurrency)
        for name, state in idle.items():
            log.warning("worker %s: ready, but trigger %r is not consuming (%s)", self.id, name,
                        state)  # fmt: skip
        if self.options.announce:
            line = (
                f"ready worker={self.id} store={public_url(self.runtime.url)} "
                f"concurrency={self.options.concurrency}"
            )
            if idle:
                shown = ",".join(f"{n}:{s.split(' ', 1)[0]}" for n, s in idle.items())
                line += f" not_consuming={shown}"
            print(line, file=sys.stdout, flush=True)

    def stop(self) -> None:
        """Stop gracefully: claim nothing more, start no new step, hand runs back at their
        next step boundary, abandon after `grace` seconds. A second call stops now."""
        if self.stopping.is_set():
            if not self.stop_now.is_set():
                log.warning(
                    "worker %s: second signal: stopping now, %d step(s) executing left to recovery",
                    self.id,
                    self.executing(),
                )
                self.stop_now.set()
            return
        self.stopping.set()
        for ctx in self.contexts.values():
            ctx.update(hold=True)  # each hands its run back at the next step boundary
        if self.tasks:
            log.info(
                "worker %s: stopping: no new steps; waiting up to %gs for %d run(s) to "
                "reach a step boundary (a second signal stops at once)",
                self.id,
                self.options.grace,
                len(self.tasks),
            )
        else:
            log.info("worker %s: stopping", self.id)
        self.runtime.notify()

    def executing(self) -> int:
        """How many steps are executing in this worker right now."""
        return sum(len(ctx.executing) for ctx in self.contexts.values())

    async def _drain(self) -> None:
        if self.crashed is not None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.grace
        now_wait = asyncio.create_task(self.stop_now.wait())
        try:
            while self.tasks and not self.stop_now.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait(
                    [*self.tasks.values(), now_wait],
                    timeout=left,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            now_wait.cancel()
        leftover = [rid for rid, t in self.tasks.items() if not t.done()]
        if not leftover:
            return
        if not self.stop_now.is_set():
            log.warning(
                "worker %s: grace of %gs ended: %d step(s) executing left to recovery",
                self.id,
                self.options.grace,
                self.executing(),
            )
        why = (
            "second signal" if self.stop_now.is_set() else f"grace of {self.options.grace:g}s ended"
        )
        reason = f"{why} while stopping worker {self.id}"
        for rid in leftover:
            ctx = self.contexts.get(rid)
            if ctx is not None:
                self.abandoned += await ctx.abandon(reason)
            self.tasks[rid].cancel()
        await asyncio.gather(*(self.tasks[r] for r in leftover), return_exceptions=True)
        try:
            await self.runtime.store.release(self.id, leftover)
        except StoreError as exc:  # the leases will simply expire
            log.warning("worker %s: could not release leases (%s)", self.id, exc)

    # -- claiming ----------------------------------------------------------------------

    async def claim_once(self) -> int:
        """Claim as many runnable runs as there are free slots and start them."""
        return (await self._claim())[0]

    async def _claim(self) -> tuple[int, bool | None]:
        """Claim and start runs; also say whether runnable runs were left behind (then
        claim again at once), or None if it did not look (no free slot, or stopping)."""
        free = self.options.concurrency - len(self.tasks) - self.reserved
        if free <= 0 or self.stopping.is_set():
            return 0, None
        self.drained = None  # while it looks, a start must not take a slot it counts
        held = collections.Counter(ctx.run.queue for ctx in self.contexts.values())
        claims = await self.runtime.store.claim(
            self.id,
            self.clock.now(),
            self.options.lease,
            free,
            list(self.runtime.workflows),
            list(self.runtime.queues.values()),
            held,
            executing=list(self.tasks),  # never its own, even if their lease ran out
            own=self.claim_unsure,  # a claim cut off unanswered may have taken some
            routing=routing(
                self.runtime.workflows, self.version_since, self.clock.now() - SILENT_AFTER
            ),
        )
        self.claim_unsure = False
        for claim in claims:
            self._start(claim)
        return len(claims), len(claims) >= free and claims.more

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
                stopping=self.stopping,
                crash_after_intent=self.crash_after_intent,
                max_recoveries=self.options.max_recoveries,
                lease=self.options.lease,
            ),
            name=f"perdure-run-{run_id}",
            context=self.context.copy(),  # e.g. a run adopted inside a bounded App.start()
        )
        self.tasks[run_id] = task
        self.runtime.claimed[run_id] = claim.run
        task.add_done_callback(functools.partial(self._done, run_id, claim.run))

    def _done(self, run_id: str, row: RunRow, task: asyncio.Task[None]) -> None:
        full = len(self.tasks) >= self.options.concurrency
        if self.tasks.get(run_id) is task:  # not a later task of the same run
            del self.tasks[run_id]
        if self.runtime.claimed.get(run_id) is row:  # not a later claim of it in this process
            del self.runtime.claimed[run_id]
        self.finished += 1
        error = None if task.cancelled() else task.exception()
        if isinstance(error, SimulatedCrash):
            self._die(error)
        elif error is not None:
            log.error("run %s: engine error", run_id, exc_info=error)
        if (full and not self.nothing_runnable()) or self.runtime.queues:
            self.runtime.notify()  # a slot of the worker, or of a queue, came free

    def _die(self, error: BaseException) -> None:
        """Crash injection: stop at once, writing nothing more and releasing no lease."""
        self.crashed = error
        self.stopping.set()
        for rid, task in self.tasks.items():
            ctx = self.contexts.get(rid)
            if ctx is not None:
                ctx.update(phase=Phase.LOST)
            task.cancel()

    async def _claim_loop(self) -> None:
        backoff = 0.05
        while not self.stopping.is_set():
            try:
                signals = self.runtime.work_signals()  # before the claim looks
                _, more = await self._claim()
                if more:  # there may be more: claim again (after the started runs began)
                    await asyncio.sleep(0)
                    continue
                wait = await self._idle_wait(looked=more is not None)
                if more is not None:  # it looked and left nothing runnable behind
                    # past a due timer it is not; past the poll, a moment more, so a start
                    # as the next poll's claim begins finds the knowledge still good
                    grace = 0.05 if wait >= self.options.poll else 0.0
                    self.drained = (signals, asyncio.get_running_loop().time() + wait + grace)
                backoff = 0.05
            except StoreError as exc:  # e.g. the database restarts: keep trying, slower
                self.claim_unsure = True  # it may have landed, its answer lost
                log.warning(
                    "worker %s: cannot claim (%s); retrying in %.2fs", self.id, exc, backoff
                )
                wait, backoff = backoff, min(backoff * 2, 2.0)
            await self.runtime.wait_work(wait)

    async def _idle_wait(self, looked: bool = False) -> float:
        """How long to wait for new work: the poll interval, or less if a timer is due
        sooner (also when full, if the claim just looked: it bounds `drained`)."""
        wait = self.options.poll
        if len(self.tasks) >= self.options.concurrency and not looked:
            return wait  # full: a finishing run wakes the loop; no timer matters until then
        wake = await self.runtime.store.next_wake(list(self.runtime.workflows))
        if wake is not None:
            wait = min(wait, max(0.0, wake - self.clock.now()) + 0.001)
        return wait

    # -- runs created claimed --------------------------------------------------------

    def reserve(self, workflow: str, queue: str, partition_key: str | None) -> bool:
        """Promise a slot to a run this process is creating on this worker's loop, so it is
        created claimed by this worker: one transaction, no claim, no wake-up.

        Only with a slot free and nothing else runnable as far as this worker knows (its
        last claim found no more, and no work was signalled since), so such a run never
        passes one waiting; and only for a queue with no limits and no partition key,
        which a claim must count.
        """
        if (
            self.stopping.is_set()
            or self.claim_unsure
            or partition_key is not None
            or queue in self.runtime.queues
            or workflow not in self.runtime.workflows
            or self._executing() + self.reserved >= self.options.concurrency
            or not self.nothing_runnable()
        ):
            return False
        self.reserved += 1
        return True

    def _executing(self) -> int:
        """Runs this worker executes. A task that returned counts no more even before its
        done callback ran: a result() waiter woken by the run's end runs first, and its next
        start must find the slot free."""
        count = len(self.tasks)
        if count + self.reserved >= self.options.concurrency:
            count = sum(1 for task in self.tasks.values() if not task.done())
        return count

    def lease_from(self, now: float) -> tuple[str, float]:
        return self.id, now + self.options.lease

    async def adopt(self, run: RunRow | None, empty_journal: bool, unsure: bool = False) -> None:
        """Settle a `reserve`: `run` was created claimed by this worker, or (None) it was
        not; `unsure`: the create failed and may have landed, so the next claim takes up a
        run leased to this worker that it does not execute, at once."""
        self.reserved -= 1
        if run is None:
            if unsure:
                self.claim_unsure = True
                self.runtime.notify()
            return
        if self.stopping.is_set():  # it stopped meanwhile: hand the run back at once
            with contextlib.suppress(StoreError):
                await self.runtime.store.release(self.id, [run.id])
            self.runtime.notify()
            return
        self._start(Claim(run=run, recovered_from=None, empty_journal=empty_journal))

    def nothing_runnable(self) -> bool:
        """True while this worker knows nothing is runnable for it but what it runs: its
        last claim left none behind, no work was signalled since and no timer is due."""
        drained, loop = self.drained, self.loop
        if drained is None or loop is None or drained[0] != self.runtime.work_signals():
            return False
        try:
            return asyncio.get_running_loop() is loop and loop.time() < drained[1]
        except RuntimeError:  # not on a loop: not this worker's
            return False

    # -- leases ----------------------------------------------------------------------

    async def heartbeat_once(self) -> None:
        held = list(self.tasks)
        if not held:
            return
        until = self.clock.now() + self.options.lease
        states = await self.runtime.store.heartbeat(self.id, held, until)
        alive = {s.run_id: s for s in states}
        for run_id in held:
            ctx = self.contexts.get(run_id)
            state = alive.get(run_id)
            task = self.tasks.get(run_id)
            if ctx is None or task is None or (state is None and ctx.state.phase is Phase.RELEASED):
                continue  # gone, or parked by its own write since the heartbeat was sent
            if state is None:
                log.warning("worker %s lost the lease of run %s", self.id, run_id)
                observers.lease_lost(run_id, self.id, "heartbeat")
                ctx.update(phase=Phase.LOST)
                task.cancel()
                continue
            ctx.held_until = max(ctx.held_until, until)
            ctx.update(pause=state.pause_requested, hold=state.hold or None)
            aborts.request(ctx, state.abort)  # pause --now: cut off its abortable calls
            if state.status == CANCELLING:
                ctx.request_cancel()

    async def _heartbeat_loop(self) -> None:
        """Renew held leases until cancelled (after the drain: a draining run keeps its lease)."""
        interval = self.options.lease / 3
        while True:
            await asyncio.sleep(min(interval, 1.0) if self.tasks else interval)
            try:
                await self.heartbeat_once()
            except StoreError as exc:
                log.warning("worker %s: heartbeat failed (%s)", self.id, exc)

    async def _peers_loop(self) -> None:
        """Every PEERS_EVERY seconds: recover at once the runs of workers proven dead (the
        registry's); every lease/3 seconds also those of unregistered dead local owners."""
        peers = self.peers or PeerWatch(self.runtime.store, self.id, sessions=False)
        loop = asyncio.get_running_loop()
        thorough_at, warn_at = loop.time() + self.options.lease / 3, 0.0
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), peers.next_check_in())
            if self.stopping.is_set():
                return
            try:
                now = self.clock.now()
                released = await peers.check(now)
                if loop.time() >= thorough_at:
                    thorough_at = loop.time() + self.options.lease / 3
                    released += await release_dead_peers(self.runtime.store, self.id, now)
                if released:
                    self.runtime.notify()
            except StoreError as exc:
                if loop.time() >= warn_at:  # once a lease/3 at most: an outage is long
                    warn_at = loop.time() + self.options.lease / 3
                    log.warning("worker %s: cannot check for dead workers (%s)", self.id, exc)

    async def _presence_loop(self) -> None:
        """Tell the store this worker exists and is alive (idle, busy or draining), every
        PRESENCE seconds at most; on the way out, that it stopped."""
        from ..store.workers_sql import WorkerRow

        host, pid, proc = socket.gethostname(), os.getpid(), this_process()
        every = min(self.options.lease / 3, PRESENCE)
        started = self.started_at
        told: float | None = None  # the skew last warned about
        try:
            while True:  # until cancelled after the drain: a draining worker is alive
                try:
                    offset = await follow_server(self.clock, self.runtime.store)
                    if (
                        offset is not None
                        and abs(offset) > MAX_SKEW
                        and (told is None or abs(offset - told) > MAX_SKEW)
                    ):
                        told = offset
                        log.warning(
                            "worker %s: this host's clock is %.1fs %s the store server's; "
                            "perdure uses the server's time (set the host's clock: NTP)",
                            self.id, abs(offset), "behind" if offset > 0 else "ahead of",
                        )  # fmt: skip
                    row = WorkerRow(self.id, host, pid, started, self.clock.now(),
                                    self.options.concurrency, len(self.tasks),
                                    clock_offset=offset, proc=proc)  # fmt: skip
                    await self.runtime.store.worker_beat(row)
                except StoreError as exc:
                    log.warning("worker %s: presence not recorded (%s)", self.id, exc)
                await asyncio.sleep(every)
        finally:
            if self.crashed is None:  # a (simulated) crash writes nothing more, like kill -9
                with contextlib.suppress(StoreError, asyncio.CancelledError):
                    now = self.clock.now()
                    stopped = WorkerRow(self.id, host, pid, started, now, self.options.concurrency,
                                        0, stopped_at=now, proc=proc)  # fmt: skip
                    await self.runtime.store.worker_beat(stopped)

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


def run_until_signalled(worker: Worker) -> None:
    """Run `worker` in this thread until SIGTERM/SIGINT (a second one: stop now). Steps it
    abandoned may still be running on their threads when this returns (`worker.abandoned`);
    their runs were handed back to the store."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    asyncio.run(main())
