"""`App`: the user-facing facade. An engine `Runtime` (store, registries, wake-ups) with
the triggers built on it and a sync API over the async `Client`."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

from .engine.client import Client
from .engine.clock import Clock
from .engine.handles import RunHandle, Workflow
from .engine.retention import GcReport
from .engine.retry import seconds
from .engine.runtime import Runtime
from .engine.worker import Worker, WorkerOptions, run_until_signalled
from .store.base import Entry, RunRow
from .store.blobs import DEFAULT_BLOB_THRESHOLD
from .triggers import plans, schedules
from .triggers.events import EventTriggers
from .triggers.inbox import add_inbox
from .triggers.listing import TriggerStatus, list_triggers
from .triggers.messages import MessageTrigger, add_message_trigger
from .triggers.schedule_sql import ScheduleRow, Schedules, TickRow
from .triggers.table_changes import add_table_change, table_changes
from .triggers.webhooks import Webhooks, add_webhook

P = ParamSpec("P")
R = TypeVar("R")


def _forward(
    target: Callable[Concatenate[Any, P], R], via: str | None = None
) -> Callable[Concatenate[App, P], R]:
    """An App method that calls `target` with the App (or its attribute `via`) first: the
    trigger keeps the one signature and docstring, the App a one-line entry point."""

    def method(app: App, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return target(app if via is None else getattr(app, via), *args, **kwargs)

    params = list(inspect.signature(target).parameters.values())[1:]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = inspect.Signature([self_param, *params])  # type: ignore[attr-defined]
    method.__doc__ = target.__doc__
    method.__wrapped__ = target  # type: ignore[attr-defined]
    return method


class App(Runtime):
    """Workflows and steps registered against one store, the triggers that start them,
    and the sync API to start, inspect and steer runs.

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
        super().__init__(db, clock=clock, blob_threshold=blob_threshold)
        if db is not None:
            self.store  # noqa: B018  # an explicit URL is checked now, not at first use
        self.client = Client(self)
        self.scheduler = schedules.scheduler_of(self)  # every worker fires the schedules
        self.events = EventTriggers(self, self.client)
        self.webhooks = Webhooks(self)  # served by `perdure serve` at /hooks/{name}
        plans.register(self)  # every worker can run plans
        self.message_sources: dict[str, MessageTrigger] = {}  # consumed by every worker

    # -- triggers (each lives in perdure.triggers) ---------------------------------------

    inbox = _forward(add_inbox)
    webhook = _forward(add_webhook, "webhooks")
    schedule = _forward(schedules.declare_schedule)
    plan = _forward(plans.start)
    on_event = _forward(EventTriggers.on, "events")
    on_table_change = _forward(add_table_change)
    on_message = _forward(add_message_trigger)

    def emit(
        self, event_type: str, payload: Any = None, *, event_id: str, run_id: str | None = None
    ) -> list[str]:
        """Ingest an event: start the runs its type triggers (ids `event:{trigger}:{event_id}`),
        or with `run_id` deliver it to that run's `wait_event(event_type)`. Returns run ids."""
        coro = self.events.emit(event_type, payload, event_id=event_id, run_id=run_id)
        return list(self.sync(coro, "App.emit()").run_ids)

    def pause_schedule(self, name: str) -> ScheduleRow:
        """Stop a schedule at once (any worker, any host); `resume_schedule` continues it."""
        return self.sync(schedules.pause(self, name), "App.pause_schedule()")  # type: ignore[no-any-return]

    def resume_schedule(self, name: str) -> ScheduleRow:
        return self.sync(schedules.resume(self, name), "App.resume_schedule()")  # type: ignore[no-any-return]

    def delete_schedule(self, name: str) -> None:
        self.sync(schedules.delete(self, name), "App.delete_schedule()")

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule in the store (declared in code once a worker started, or added)."""
        rows = Schedules(self.store).list_schedules()
        return self.sync(rows, "App.schedules()")  # type: ignore[no-any-return]

    def schedule_ticks(self, name: str, *, limit: int = 50) -> list[TickRow]:
        """A schedule's recent ticks, newest first: fired, skipped, missed or queued, and why."""
        ticks = Schedules(self.store).schedule_ticks(name, limit=limit)
        return self.sync(ticks, "App.schedule_ticks()")  # type: ignore[no-any-return]

    def triggers(self) -> list[TriggerStatus]:
        """Every trigger (schedules, inbox folders, webhooks, events, table changes, message
        sources) with its state, lag and last error."""
        return self.sync(self.triggers_async(), "App.triggers()")  # type: ignore[no-any-return]

    async def triggers_async(self) -> list[TriggerStatus]:
        """`triggers` for async code."""
        sources = getattr(self, "message_sources", ())
        if isinstance(sources, dict):
            sources = list(sources.values())
        return await list_triggers(
            self, webhooks=self.webhooks, events=self.events.known, sources=sources
        )

    def install_triggers(self) -> list[str]:
        """Install (or check) the trigger of every `on_table_change` on its table now, as a
        worker does at start; returns the names of those that had to change. A table that
        does not exist, or an SQLite store, raises ConfigError naming the trigger."""

        async def install() -> list[str]:
            return [c.trigger.name for c in table_changes(self) if await c.install()]

        return self.sync(install(), "App.install_triggers()")  # type: ignore[no-any-return]

    # -- runs ----------------------------------------------------------------------------

    def start(
        self,
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

        `queue` overrides the workflow's queue; higher `priority` runs are claimed first;
        runs sharing a `partition_key` in a queue run one at a time. `timeout` bounds the
        wait for the store: an SQLite store whose write lock another process holds longer
        raises StoreUnavailable naming that process, and nothing is written (None: the
        store's busy timeout, 60 s on SQLite).
        """
        return self.sync(  # type: ignore[no-any-return]
            self.start_async(
                workflow,
                *args,
                run_id=run_id,
                deadline=deadline,
                queue=queue,
                priority=priority,
                partition_key=partition_key,
                timeout=timeout,
                **kwargs,
            ),
            "App.start()",
        )

    async def start_async(
        self,
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
        """`start` for async code."""
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

    def handle(self, run_id: str) -> RunHandle:
        """A handle on an existing run (checked when used)."""
        return RunHandle(self.client, run_id)

    def get_run(self, run_id: str) -> RunRow:
        return self.sync(self.client.get(run_id), "App.get_run()")  # type: ignore[no-any-return]

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
        return self.sync(  # type: ignore[no-any-return]
            self.client.list_runs(statuses=statuses, workflow=workflow, ids=ids, limit=limit),
            "App.list_runs()",
        )

    def statuses(self, ids: Sequence[str]) -> dict[str, str | None]:
        """The status of each run id in one call; None for an id no run has."""
        return self.sync(self.client.statuses(ids), "App.statuses()")  # type: ignore[no-any-return]

    def journal(self, run_id: str) -> list[Entry]:
        return self.sync(self.client.journal(run_id), "App.journal()")  # type: ignore[no-any-return]

    def send_event(
        self, run_id: str, name: str, payload: Any = None, *, key: str | None = None
    ) -> None:
        """Deliver an event; a run that waits for it wakes, one that has not yet waited keeps it.
        `key` (e.g. the event's id at its source) makes a repeated delivery a no-op."""
        self.sync(self.client.send_event(run_id, name, payload, key=key), "App.send_event()")

    def cancel(self, run_id: str) -> str:
        return self.sync(self.client.cancel(run_id), "App.cancel()")  # type: ignore[no-any-return]

    def pause(self, run_id: str, *, now: bool = False) -> str:
        """Pause a run (`now`: abort its calls in flight that allow it; see `Client.pause`)."""
        return self.sync(self.client.pause(run_id, now=now), "App.pause()")  # type: ignore[no-any-return]

    def resume(self, run_id: str) -> str:
        return self.sync(self.client.resume(run_id), "App.resume()")  # type: ignore[no-any-return]

    def pause_workflow(self, name: str, *, now: bool = False) -> bool:
        """Pause every run of a workflow at once, parked or running (see `Client.set_pause`;
        `now`: abort their calls in flight that allow it); False if it was already paused."""
        paused = self.client.set_pause("workflow", name, True, now=now)
        return bool(self.sync(paused, "App.pause_workflow()"))

    def resume_workflow(self, name: str) -> bool:
        return self.sync(self.client.set_pause("workflow", name, False), "App.resume_workflow()")  # type: ignore[no-any-return]

    def pause_worker(self, worker: str, *, now: bool = False) -> bool:
        """Stop a worker (by id, or every worker of a host) claiming and running runs; its
        runs stop at their next step (`now`: their abortable calls in flight are aborted)
        and go back to the store until `resume_worker`."""
        paused = self.client.set_pause("worker", worker, True, now=now)
        return bool(self.sync(paused, "App.pause_worker()"))

    def resume_worker(self, worker: str) -> bool:
        return self.sync(self.client.set_pause("worker", worker, False), "App.resume_worker()")  # type: ignore[no-any-return]

    def pauses(self) -> list[tuple[str, str, float]]:
        """What is paused as a whole: (scope workflow|worker, name, since)."""
        return self.sync(self.store.list_pauses(), "App.pauses()")  # type: ignore[no-any-return]

    def resolve(
        self,
        run_id: str,
        step: int | str,
        *,
        value: Any = None,
        retry: bool = False,
        fail: bool = False,
    ) -> str:
        """Settle a needs_attention step: `value=` marks it done, `retry=True`, or `fail=True`."""
        has_value = not retry and not fail
        return self.sync(  # type: ignore[no-any-return]
            self.client.resolve(
                run_id, step, value=value, has_value=has_value, retry=retry, fail=fail
            ),
            "App.resolve()",
        )

    def gc(self, *, batch: int = 200) -> GcReport:
        """Delete finished runs beyond their workflow's `retention` (see `Retention`).

        Each batch of `batch` runs, with their journals, events and no longer
        referenced blobs, is deleted in one transaction. Returns what was deleted.
        """
        return self.sync(self.client.gc(batch=batch), "App.gc()")  # type: ignore[no-any-return]

    def fork(self, run_id: str, from_step: int, new_id: str | None = None) -> RunHandle:
        """A new run reusing the first `from_step` outcomes of `run_id`; the rest runs anew."""
        run = self.sync(self.client.fork(run_id, from_step, new_id), "App.fork()")
        return RunHandle(self.client, run.id)

    # -- workers -----------------------------------------------------------------------

    def worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> Worker:
        """A worker for this app (await `worker.run()`); options as in `WorkerOptions`."""
        return Worker(self, options or WorkerOptions(**kwargs))

    def run_worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> None:
        """Run a worker in this thread until SIGTERM/SIGINT: no new step starts, runs are
        handed back at their next step boundary, and after `grace` (or a second signal)
        what still executes is left to recovery, journaled as stopped. A sync step cut off
        that way keeps its thread until it returns (`perdure worker` exits without it)."""
        self._portal.call(_noop(), "App.run_worker()")  # refuses inside a running loop
        run_until_signalled(self.worker(options, **kwargs))


async def _noop() -> None:
    return None
