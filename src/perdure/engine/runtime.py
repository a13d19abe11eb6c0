"""`Runtime`: what the engine runs on — the store, the clock, the registries of workflows,
steps and queues, wake-up signals, the runs this process holds, and its triggers.

The worker, client, runner and steps take a Runtime, never the user-facing `App`
(which holds one, in `perdure.app`, with the trigger entry points and the sync facade).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

from ..errors import ConfigError, StoreUnavailable
from ..store import open_store, store_url
from ..store.base import QueueSpec, RunRow, Store
from ..store.blobs import DEFAULT_BLOB_THRESHOLD
from ..store.roles import Notices
from .clock import Clock, SystemClock, follow_server
from .effects import Effect, check_effect
from .portal import Portal
from .probes import probe_of
from .registry import StepDef, WorkflowDef, qualified_name
from .retention import Retention
from .retry import DEFAULT_RETRY, NO_RETRY, Retry, seconds
from .services import Service
from .signal import Signal
from .steps import Step
from .triggers import Triggers

if TYPE_CHECKING:
    from .context import RunContext
    from .handles import Workflow

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Taker(Protocol):
    """A worker of this process that takes runs as they are created (worker.py)."""

    def reserve(self, workflow: str, queue: str, partition_key: str | None) -> bool: ...
    def lease_from(self, now: float) -> tuple[str, float]: ...
    async def adopt(
        self, run: RunRow | None, empty_journal: bool, unsure: bool = False
    ) -> None: ...


class HasRuntime(Protocol):
    """What holds a runtime: the user-facing `App` (`app.runtime`)."""

    @property
    def runtime(self) -> Runtime: ...


def runtime_of(app: Runtime | HasRuntime) -> Runtime:
    """`app` itself if it is a Runtime, else the one it holds: an engine object users build
    from their App (`perdure.Client(app)`) takes either, and keeps the Runtime."""
    return app if isinstance(app, Runtime) else app.runtime


ENDED_KEPT = 256  # rows of ended runs kept for result() waiters
ENDED_TEXT = 4096  # characters of result and error beyond which such a row is not kept


class Runtime:
    """Workflows and steps registered against one store (resolved when first used).

    Args:
        db: store URL; default `PERDURE_DB`, else `sqlite:///.perdure/perdure.db`. It is
            read when the store is first used, so a module can define workflows on an
            App before the URL is known; `open(url)` picks it explicitly.
        clock: where all engine time comes from (tests pass a driven clock).
        blob_threshold: payloads larger than this many bytes of JSON go to the blob table.
    """

    def __init__(
        self,
        db: str | None = None,
        *,
        clock: Clock | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
    ) -> None:
        self._db = db
        self._store: Store | None = None
        self.clock: Clock = clock or SystemClock()
        self.blob_threshold = blob_threshold
        self.workflows: dict[str, WorkflowDef] = {}
        self.steps: dict[str, StepDef] = {}
        self.queues: dict[str, QueueSpec] = {}
        self.triggers = Triggers(self)  # every trigger (the kinds live in perdure.triggers)
        self.on_notify: list[Callable[[], None]] = []  # called on every change (any thread)
        self.step_executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="perdure-step")
        # runs held by workers in this process, so operator calls reach them at once
        self.active: dict[str, RunContext] = {}
        # the last rows of runs that ended in this process, as written: result() reads no more
        self.ended: OrderedDict[str, RunRow] = OrderedDict()
        # the rows, as claimed, of runs a worker of this process executes (from the moment it
        # took the run to its task's end): their end is known here, result() need not read
        self.claimed: dict[str, RunRow] = {}
        self.takers: list[Taker] = []  # claiming workers of this process
        self._portal = Portal()
        self._work = Signal()
        self._change = Signal()
        self._opened = False

    # -- the store ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store URL: the one given (or opened), else `PERDURE_DB`, else the default."""
        if self._db is None:
            self._db = store_url(None)
        return self._db

    @property
    def store(self) -> Store:
        """The store, built from `url` on first use (not connected until `open_store`)."""
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def open(self, url: str | None = None) -> Runtime:
        """Bind to the store at `url` (default: `PERDURE_DB`, else the embedded default).

        Refused once the store is in use with another URL: runs, leases and wake-ups of
        one process belong to one store."""
        wanted = store_url(url)
        if self._store is not None and wanted != self.url:
            raise ConfigError(
                f"this app already uses the store {self.url!r}; open({wanted!r}) would "
                "move it mid-flight: build a second App for a second store"
            )
        self._db = wanted
        return self

    async def open_store(self) -> None:
        if not self._opened:
            store = self.store
            await store.open()
            if isinstance(store, Notices):  # other processes' new work wakes this one's workers
                store.listen(self)
            await _first_clock(self.clock, store)
            self._opened = True

    def close(self) -> None:
        """Release the store connection and background threads."""
        if self._store is not None:
            self.sync(self._store.close(), "App.close()")
        self._portal.close()
        self.step_executor.shutdown(wait=False)
        self._opened = False

    def sync(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run `coro` to completion from sync code (refused inside a running event loop)."""
        return self._portal.call(coro, what)

    # -- wake-ups ----------------------------------------------------------------------

    def notify(self) -> None:
        """Tell in-process workers that there may be new work (and waiters of a change)."""
        self._work.fire()
        self.notify_change()

    def notify_change(self) -> None:
        """Tell in-process waiters (`result()`, streams, `on_notify`) that a run changed."""
        self._change.fire()
        for listener in self.on_notify:
            listener()

    def ended_elsewhere(self) -> None:
        """Another process ended a run: its waiters here read it; workers claim only if a
        queue with limits may have a slot free (a run's end frees nothing else they count)."""
        if self.queues:
            self.notify()
        else:
            self.notify_change()

    def run_ended(self, row: RunRow) -> None:
        """A run ended in this process (`row`: as its ending write left it): its waiters find
        it here (a row with a large result or error is not kept; they read it)."""
        if len(row.result or "") + len(row.error or "") > ENDED_TEXT:
            self.ended.pop(row.id, None)
            return
        self.ended[row.id] = row
        self.ended.move_to_end(row.id)
        while len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)

    def taker(self, workflow: str, queue: str, partition_key: str | None) -> Taker | None:
        """A worker of this process that promised a slot to a run being created (so it is
        created claimed by it, with no claim), or None: the run is created pending."""
        return next((t for t in self.takers if t.reserve(workflow, queue, partition_key)), None)

    def work_signals(self) -> int:
        """How many times new work was signalled so far (a worker that found nothing
        runnable after the N-th knows nothing new until the N+1-th)."""
        return self._work.fired

    def listen_work(self) -> None:
        self._work.listen()

    async def wait_work(self, timeout: float) -> None:
        await self._work.wait(timeout)

    async def wait_change(self, timeout: float, since: int | None = None) -> None:
        """Wait for a change (with `since`: one after `changes()` said `since`) or `timeout`."""
        await self._change.wait(timeout, since)

    def changes(self) -> int:
        """How many changes were signalled so far (for `wait_change(since=...)`)."""
        return self._change.fired

    @property
    def services(self) -> list[Service]:
        """The loops every worker of this process runs: the triggers that watch something."""
        return self.triggers.loops()

    # -- registration --------------------------------------------------------------

    @overload
    def step(self, fn: Callable[P, R], /) -> Step[P, R]: ...
    @overload
    def step(
        self,
        *,
        name: str | None = None,
        effect: Effect = "once",
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
        commit: bool = False,
        probe: Callable[..., Any] | None = None,
        probe_timeout: float | timedelta | None = None,
    ) -> Callable[[Callable[P, R]], Step[P, R]]: ...

    def step(  # type: ignore[misc]  # mypy cannot match ParamSpec across the overloads
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        effect: Effect = "once",
        retry: Retry | None = None,
        timeout: float | timedelta | None = None,
        commit: bool = False,
        probe: Callable[..., Any] | None = None,
        probe_timeout: float | timedelta | None = None,
    ) -> Step[P, R] | Callable[[Callable[P, R]], Step[P, R]]:
        """Register a step. `effect` says what recovery may do (default `once`: never repeat).

        `retry` defaults to 3 attempts for read/idempotent/keyed/transactional and to
        a single attempt for `once`; `timeout` bounds each attempt. `commit=True` commits
        the outcome before the workflow goes on even when recovery could re-run the step
        (an expensive result, such as a billed model call, is then never bought twice).
        `probe` (a `once` step's): a read-only function recovery calls with the step's
        arguments to ask whether an interrupted effect happened, answering a `ProbeAnswer`
        (engine/probes.py); it may take `probe_timeout` seconds (default 30).
        """

        def wrap(func: Callable[P, R]) -> Step[P, R]:
            step_name = name or qualified_name(func)
            kind = check_effect(effect, f"step {step_name!r}")
            if kind == "transactional" and inspect.iscoroutinefunction(func):
                raise ConfigError(
                    f"step {step_name!r}: transactional steps run inside the store's transaction "
                    "and must be plain (sync) functions"
                )
            policy = retry or (NO_RETRY if kind == "once" else DEFAULT_RETRY)
            asks = probe_of(step_name, kind, probe, seconds(probe_timeout))
            definition = StepDef(step_name, func, kind, policy, seconds(timeout), commit, asks)
            if step_name in self.steps and self.steps[step_name].fn is not func:
                raise ConfigError(f"two steps are named {step_name!r}; pass name=... to one")
            self.steps[step_name] = definition
            return Step(definition)

        return wrap(fn) if fn is not None else wrap

    @overload
    def workflow(self, fn: Callable[P, R], /) -> Workflow[P, R]: ...
    @overload
    def workflow(
        self,
        *,
        name: str | None = None,
        version: str = "",
        deadline: float | timedelta | None = None,
        retention: Retention | None = None,
        queue: str = "default",
        upgrade: str = "auto",
    ) -> Callable[[Callable[P, R]], Workflow[P, R]]: ...

    def workflow(  # type: ignore[misc]  # mypy cannot match ParamSpec across the overloads
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        version: str = "",
        deadline: float | timedelta | None = None,
        retention: Retention | None = None,
        queue: str = "default",
        upgrade: str = "auto",
    ) -> Workflow[P, R] | Callable[[Callable[P, R]], Workflow[P, R]]:
        """Register a workflow. `version` labels the code (default: a hash of its source);
        `deadline` fails runs that are not done that long after they start; `retention`
        says how long finished runs are kept before gc deletes them (default: forever);
        `upgrade` says what a worker of this code does with a run of another version:
        "auto" upgrades it if its journal replays cleanly, else leaves it for a worker of
        its version or parks it; "pinned" never upgrades; "latest" runs it unchecked."""
        from .handles import Workflow
        from .versions import check_upgrade

        if retention is not None and not isinstance(retention, Retention):
            raise ConfigError(
                f"retention={retention!r}: pass perdure.Retention(keep_days=..., keep_last=...)"
            )

        def wrap(func: Callable[P, R]) -> Workflow[P, R]:
            wf_name = name or qualified_name(func)
            definition = WorkflowDef(wf_name, func, version, seconds(deadline), retention, queue,
                                     check_upgrade(upgrade, wf_name))  # fmt: skip
            if wf_name in self.workflows and self.workflows[wf_name].fn is not func:
                raise ConfigError(f"two workflows are named {wf_name!r}; pass name=... to one")
            self.workflows[wf_name] = definition
            return Workflow(self, definition)

        return wrap(fn) if fn is not None else wrap

    def queue(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        per_worker: int | None = None,
        rate: tuple[int, float | timedelta] | None = None,
    ) -> QueueSpec:
        """Declare limits for a named queue (workflows join one with `queue=`).

        Args:
            concurrency: runs of the queue running at once across every worker and host.
            per_worker: runs of the queue one worker runs at once.
            rate: `(n, period)`: at most n runs of the queue start per period (seconds or
                a timedelta). Sleeping or waiting runs hold no slot.
        """
        for label, value in (("concurrency", concurrency), ("per_worker", per_worker)):
            if value is not None and value < 1:
                raise ConfigError(f"queue {name!r}: {label} must be at least 1")
        count, period = rate if rate is not None else (None, 1.0)
        if count is not None and (count < 1 or (seconds(period) or 0) <= 0):
            raise ConfigError(f"queue {name!r}: rate must be (n >= 1, period > 0)")
        spec = QueueSpec(name, concurrency, per_worker, count, seconds(period) or 1.0)
        self.queues[name] = spec
        return spec


async def _first_clock(clock: Clock, store: Store) -> None:
    """Follow the server's time before any claim (a server's time is every host's time).
    The server lost just after the store opened (a restart) is waited for a few seconds,
    as the store thread reconnects; still away, it is the one-line start-up error a
    worker exits 2 on (never claiming with a clock not set to the server's)."""
    delay = 0.05
    while True:
        try:
            await follow_server(clock, store)
            return
        except StoreUnavailable as exc:
            if delay > 2.0:
                where = store.url
                raise ConfigError(
                    f"cannot connect to PostgreSQL at {where}: lost during start-up ({exc})"
                ) from None
            await asyncio.sleep(delay)
            delay *= 2
