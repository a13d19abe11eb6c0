"""`App`: the user-facing facade. It holds an engine `Runtime` (store, registries, triggers,
wake-ups) as `app.runtime`, and offers registration, the trigger entry points and a sync
API over the async `Client`; the engine's plumbing stays on the runtime."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

from .engine.client import Client
from .engine.clock import Clock
from .engine.handles import RunHandle, Workflow
from .engine.retention import GcReport
from .engine.retry import seconds
from .engine.runtime import Runtime
from .engine.triggers import TriggerStatus
from .engine.worker import Worker, WorkerOptions, run_until_signalled
from .store.base import Entry, RunRow
from .store.blobs import DEFAULT_BLOB_THRESHOLD
from .triggers import events, plans, schedules
from .triggers.inbox import add_inbox
from .triggers.messages import add_message_trigger
from .triggers.schedule_sql import ScheduleRow, Schedules, TickRow
from .triggers.table_changes import TableChange, add_table_change
from .triggers.webhooks import add_webhook

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _forward(target: Callable[Concatenate[Runtime, P], R]) -> Callable[Concatenate[App, P], R]:
    """An App method that calls `target` with the App's runtime first: the trigger keeps
    the one signature and docstring, the App a one-line entry point."""

    def method(app: App, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return target(app.runtime, *args, **kwargs)

    params = list(inspect.signature(target).parameters.values())[1:]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return _shown_as(method, target, inspect.Signature([self_param, *params]))


def _blocking(
    target: Callable[Concatenate[App, P], Coroutine[Any, Any, R]], what: str
) -> Callable[Concatenate[App, P], R]:
    """The blocking twin of an async App method: the same arguments (written once, on the
    async one) and docstring; it runs the coroutine to its end (refused inside a loop)."""

    def method(app: App, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return app.runtime.sync(target(app, *args, **kwargs), what)

    return _shown_as(method, target, inspect.signature(target))


def _shown_as(method: F, target: Callable[..., Any], signature: inspect.Signature) -> F:
    """`method` with `target`'s docstring and `signature`, as help() and editors show it."""
    shown: Any = method
    shown.__signature__ = signature
    shown.__doc__ = target.__doc__
    return method


class App:
    """Workflows and steps registered against one store, the triggers that start them,
    and the sync API to start, inspect and steer runs (`client`: the same as coroutines).
    What the engine runs on (the store, wake-ups, the runs held here) is `runtime`.

    Args:
        db: store URL; default `PERDURE_DB`, else `sqlite:///.perdure/perdure.db`, read
            when the store is first used (or pass it later to `open`), so one module's
            workflows can serve the store a test or a tenant chooses.
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
        self.runtime = Runtime(db, clock=clock, blob_threshold=blob_threshold)
        if db is not None:
            self.runtime.store  # noqa: B018  # an explicit URL is checked now, not at first use
        self.client = Client(self.runtime)
        self.workflow = self.runtime.workflow
        self.step = self.runtime.step
        self.queue = self.runtime.queue
        schedules.scheduler_of(self.runtime)  # every worker fires the schedules in the store
        plans.register(self.runtime)  # every worker can run plans

    # -- the store ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store URL: the one given (or opened), else `PERDURE_DB`, else the default."""
        return self.runtime.url

    @property
    def clock(self) -> Clock:
        """Where all engine time comes from; tests set a `perdure.testing.TestClock`."""
        return self.runtime.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.runtime.clock = clock

    def open(self, url: str | None = None) -> App:
        """Bind to the store at `url` (default: `PERDURE_DB`, else the embedded default).

        Refused once the store is in use with another URL: runs, leases and wake-ups of
        one process belong to one store."""
        self.runtime.open(url)
        return self

    def close(self) -> None:
        """Release the store connection and background threads."""
        self.runtime.close()

    def _sync(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        return self.runtime.sync(coro, what)

    # -- triggers (each lives in perdure.triggers) ---------------------------------------

    inbox = _forward(add_inbox)
    webhook = _forward(add_webhook)
    schedule = _forward(schedules.declare_schedule)
    plan = _forward(plans.start)
    on_event = _forward(events.on_event)
    on_table_change = _forward(add_table_change)
    on_message = _forward(add_message_trigger)

    def emit(
        self, event_type: str, payload: Any = None, *, event_id: str, run_id: str | None = None
    ) -> list[str]:
        """Ingest an event: start the runs its type triggers (ids `event:{trigger}:{event_id}`),
        or with `run_id` deliver it to that run's `wait_event(event_type)`. Returns run ids."""
        coro = events.emit(self.runtime, event_type, payload, event_id=event_id, run_id=run_id)
        return list(self._sync(coro, "App.emit()").run_ids)

    def pause_schedule(self, name: str) -> ScheduleRow:
        """Stop a schedule at once (any worker, any host); `resume_schedule` continues it."""
        return self._sync(schedules.pause(self.runtime, name), "App.pause_schedule()")

    def resume_schedule(self, name: str) -> ScheduleRow:
        return self._sync(schedules.resume(self.runtime, name), "App.resume_schedule()")

    def delete_schedule(self, name: str) -> None:
        self._sync(schedules.delete(self.runtime, name), "App.delete_schedule()")

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule in the store (declared in code once a worker started, or added)."""
        return self._sync(Schedules(self.runtime.store).list_schedules(), "App.schedules()")

    def schedule_ticks(self, name: str, *, limit: int = 50) -> list[TickRow]:
        """A schedule's recent ticks, newest first: fired, skipped, missed or queued, and why."""
        return self._sync(
            Schedules(self.runtime.store).schedule_ticks(name, limit=limit), "App.schedule_ticks()"
        )

    def triggers(self) -> list[TriggerStatus]:
        """Every trigger (schedules, inbox folders, webhooks, events, table changes, message
        sources) with its state, lag and last error (async code: `runtime.triggers.statuses`)."""
        return self._sync(self.runtime.triggers.statuses(), "App.triggers()")

    def install_triggers(self) -> list[str]:
        """Install (or check) the trigger of every `on_table_change` on its table now, as a
        worker does at start; returns the names of those that had to change. A table that
        does not exist, or an SQLite store, raises ConfigError naming the trigger."""

        async def install() -> list[str]:
            changes = self.runtime.triggers.of(TableChange).values()
            return [c.name for c in changes if await c.install()]

        return self._sync(install(), "App.install_triggers()")

    # -- runs ----------------------------------------------------------------------------

    async def start_async(
        self,
        /,
        workflow: Workflow[..., Any] | str,
        *args: Any,
        run_id: str | None = None,
        deadline: float | timedelta | None = None,
        queue: str | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> RunHandle:
        """Start a run; an existing `run_id` returns that run's handle (idempotent start).
        `start` blocks until it is done; `start_async` is for async code.

        `queue` overrides the workflow's queue; higher `priority` runs are claimed first;
        runs sharing a `partition_key` in a queue run one at a time. `timeout` bounds the
        wait for the store: an SQLite store whose write lock another process holds longer
        raises StoreUnavailable naming that process, and nothing is written (None: the
        store's busy timeout, 60 s on SQLite).
        """
        name = workflow if isinstance(workflow, str) else workflow.name
        run = await self.client.start(
            name,
            args,
            kwargs,
            run_id=run_id,
            deadline=seconds(deadline),
            queue=queue,
            priority=priority,
            partition_key=partition_key,
            timeout=timeout,
        )
        return RunHandle(self.client, run.id)

    start = _blocking(start_async, "App.start()")

    def handle(self, run_id: str) -> RunHandle:
        """A handle on an existing run (checked when used)."""
        return RunHandle(self.client, run_id)

    def get_run(self, run_id: str) -> RunRow:
        return self._sync(self.client.get(run_id), "App.get_run()")

    def list_runs(
        self,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        ids: Sequence[str] = (),
        limit: int = 100,
    ) -> list[RunRow]:
        """Runs newest first, filtered by status, workflow and run ids (unknown ids are
        left out)."""
        return self._sync(
            self.client.list_runs(statuses=statuses, workflow=workflow, ids=ids, limit=limit),
            "App.list_runs()",
        )

    def statuses(self, ids: Sequence[str]) -> dict[str, str | None]:
        """The status of each run id in one call; None for an id no run has."""
        return self._sync(self.client.statuses(ids), "App.statuses()")

    def journal(self, run_id: str) -> list[Entry]:
        return self._sync(self.client.journal(run_id), "App.journal()")

    def send_event(
        self, run_id: str, name: str, payload: Any = None, *, key: str | None = None
    ) -> None:
        """Deliver an event; a run that waits for it wakes, one that has not yet waited keeps it.
        `key` (e.g. the event's id at its source) makes a repeated delivery a no-op."""
        self._sync(self.client.send_event(run_id, name, payload, key=key), "App.send_event()")

    def cancel(self, run_id: str) -> str:
        return self._sync(self.client.cancel(run_id), "App.cancel()")

    def pause(self, run_id: str, *, now: bool = False) -> str:
        """Pause a run (`now`: abort its calls in flight that allow it; see `Client.pause`)."""
        return self._sync(self.client.pause(run_id, now=now), "App.pause()")

    def resume(self, run_id: str) -> str:
        return self._sync(self.client.resume(run_id), "App.resume()")

    def pause_workflow(self, name: str, *, now: bool = False) -> bool:
        """Pause every run of a workflow at once, parked or running (see `Client.set_pause`;
        `now`: abort their calls in flight that allow it); False if it was already paused."""
        paused = self.client.set_pause("workflow", name, True, now=now)
        return bool(self._sync(paused, "App.pause_workflow()"))

    def resume_workflow(self, name: str) -> bool:
        return self._sync(self.client.set_pause("workflow", name, False), "App.resume_workflow()")

    def pause_worker(self, worker: str, *, now: bool = False) -> bool:
        """Stop a worker (by id, or every worker of a host) claiming and running runs; its
        runs stop at their next step (`now`: their abortable calls in flight are aborted)
        and go back to the store until `resume_worker`."""
        paused = self.client.set_pause("worker", worker, True, now=now)
        return bool(self._sync(paused, "App.pause_worker()"))

    def resume_worker(self, worker: str) -> bool:
        return self._sync(self.client.set_pause("worker", worker, False), "App.resume_worker()")

    def pauses(self) -> list[tuple[str, str, float]]:
        """What is paused as a whole: (scope workflow|worker, name, since)."""
        return self._sync(self.runtime.store.list_pauses(), "App.pauses()")

    def resolve(
        self,
        run_id: str,
        step: int | str,
        *,
        value: Any = None,
        retry: bool = False,
        fail: bool = False,
        probe: bool = False,
    ) -> str:
        """Settle a needs_attention step: `value=` marks it done, `retry=True`, `fail=True`,
        or `probe=True` (its probe is asked again by the worker that takes the run)."""
        has_value = not retry and not fail and not probe
        return self._sync(
            self.client.resolve(
                run_id, step, value=value, has_value=has_value, retry=retry, fail=fail,
                probe=probe,
            ),
            "App.resolve()",
        )  # fmt: skip

    def gc(self, *, batch: int = 200) -> GcReport:
        """Delete finished runs beyond their workflow's `retention` (see `Retention`).

        Each batch of `batch` runs, with their journals, events and no longer
        referenced blobs, is deleted in one transaction. Returns what was deleted.
        """
        return self._sync(self.client.gc(batch=batch), "App.gc()")

    def fork(self, run_id: str, from_step: int, new_id: str | None = None) -> RunHandle:
        """A new run reusing the first `from_step` outcomes of `run_id`; the rest runs anew."""
        run = self._sync(self.client.fork(run_id, from_step, new_id), "App.fork()")
        return RunHandle(self.client, run.id)

    # -- workers -----------------------------------------------------------------------

    def worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> Worker:
        """A worker for this app (await `worker.run()`); options as in `WorkerOptions`."""
        return Worker(self.runtime, options or WorkerOptions(**kwargs))

    def run_worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> None:
        """Run a worker in this thread until SIGTERM/SIGINT: no new step starts, runs are
        handed back at their next step boundary, and after `grace` (or a second signal)
        what still executes is left to recovery, journaled as stopped. A sync step cut off
        that way keeps its thread until it returns (`perdure worker` exits without it)."""
        self._sync(_noop(), "App.run_worker()")  # refuses inside a running loop
        run_until_signalled(self.worker(options, **kwargs))


async def _noop() -> None:
    return None
