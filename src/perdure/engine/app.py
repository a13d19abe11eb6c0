"""`App`: the registry of workflows and steps, its store, and the sync facade over `Client`."""

from __future__ import annotations

import asyncio
import inspect
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from ..errors import ConfigError
from ..store import open_store, resolve_url
from ..store.base import Entry, QueueSpec, RunRow, ScheduleRow, Store, TickRow
from ..store.blobs import DEFAULT_BLOB_THRESHOLD, inline_or_blob
from .client import Client, encode_input
from .clock import Clock, SystemClock
from .context import RunContext, current
from .durable import child_result
from .effects import Effect, check_effect
from .portal import Portal
from .registry import StepDef, WorkflowDef, qualified_name
from .retention import GcReport, Retention
from .retry import DEFAULT_RETRY, NO_RETRY, Retry, seconds
from .services import Service
from .signal import Signal
from .steps import Step
from .worker import Worker, WorkerOptions

if TYPE_CHECKING:
    from ..triggers.inbox import Inbox
    from ..triggers.webhooks import Webhook

P = ParamSpec("P")
R = TypeVar("R")


class App:
    """Workflows and steps registered against one store.

    Args:
        db: store URL; default `PERDURE_DB`, else `sqlite:///.perdure/perdure.db`.
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
        self.url = resolve_url(db)
        self.store: Store = open_store(self.url)
        self.clock: Clock = clock or SystemClock()
        self.blob_threshold = blob_threshold
        self.workflows: dict[str, WorkflowDef] = {}
        self.steps: dict[str, StepDef] = {}
        self.client = Client(self)
        self.step_executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="perdure-step")
        self._portal = Portal()
        self._work = Signal()
        self._change = Signal()
        self._opened = False
        self.queues: dict[str, QueueSpec] = {}
        self.services: list[Service] = []  # loops every worker runs (triggers register them)
        self.on_notify: list[Callable[[], None]] = []  # also called by notify() (any thread)
        from ..triggers.schedules import scheduler_of

        self.scheduler = scheduler_of(self)  # every worker fires the store's schedules
        from ..triggers.plans import register as register_plans

        register_plans(self)  # every worker can run plans
        self.hooks: dict[str, Any] = {}  # webhooks by name (perdure.triggers.webhooks)
        # runs held by workers in this process, so operator calls reach them at once
        self.active: dict[str, RunContext] = {}

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
    ) -> Step[P, R] | Callable[[Callable[P, R]], Step[P, R]]:
        """Register a step. `effect` says what recovery may do (default `once`: never repeat).

        `retry` defaults to 3 attempts for read/idempotent/keyed/transactional and to
        a single attempt for `once`; `timeout` bounds each attempt. `commit=True` commits
        the outcome before the workflow goes on even when recovery could re-run the step
        (an expensive result, such as a billed model call, is then never bought twice).
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
            definition = StepDef(step_name, func, kind, policy, seconds(timeout), commit)
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
    ) -> Workflow[P, R] | Callable[[Callable[P, R]], Workflow[P, R]]:
        """Register a workflow. `version` labels the code (default: a hash of its source);
        `deadline` fails runs that are not done that long after they start; `retention`
        says how long finished runs are kept before gc deletes them (default: forever)."""
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigError(
                f"retention={retention!r}: pass perdure.Retention(keep_days=..., keep_last=...)"
            )

        def wrap(func: Callable[P, R]) -> Workflow[P, R]:
            wf_name = name or qualified_name(func)
            definition = WorkflowDef(wf_name, func, version, seconds(deadline), retention, queue)
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

    # -- triggers (each lives in perdure.triggers; these are the App's entry points) ------

    def inbox(
        self,
        folder: str,
        workflow: Workflow[..., Any] | str,
        *,
        name: str | None = None,
        pattern: str | Sequence[str] = "*",
        recursive: bool = False,
        stable: float | timedelta = 1.0,
        poll: float | timedelta = 2.0,
        force_polling: bool = False,
    ) -> Inbox:
        """Start one run of `workflow` per file content dropped in `folder`, from every
        worker; returns the `Inbox` (options and run ids: see `perdure.triggers.inbox`)."""
        from ..triggers.inbox import add_inbox

        return add_inbox(
            self,
            folder,
            workflow,
            name=name,
            pattern=pattern,
            recursive=recursive,
            stable=stable,
            poll=poll,
            force_polling=force_polling,
        )

    def webhook(
        self,
        name: str,
        workflow: Workflow[..., Any] | str,
        *,
        secret: str | None = None,
        secret_env: str | None = None,
        delivery_header: str = "X-Perdure-Delivery",
        signature_header: str = "X-Perdure-Signature",
        max_body: int = 1_048_576,
    ) -> Webhook:
        """Start `workflow` with the JSON body of each signed POST to `/hooks/{name}` on
        `perdure serve`, one run per delivery id (see `perdure.triggers.webhooks`)."""
        from ..triggers.webhooks import add_webhook

        return add_webhook(
            self,
            name,
            workflow,
            secret=secret,
            secret_env=secret_env,
            delivery_header=delivery_header,
            signature_header=signature_header,
            max_body=max_body,
        )

    def schedule(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        catchup: str = "latest",
        catchup_limit: int = 10,
        overlap: str = "skip",
        jitter: float | timedelta = 0.0,
        grace: float | timedelta = 60.0,
        workflow: Workflow[..., Any] | str | None = None,
    ) -> Any:
        """Start a workflow on a cron expression (in `tz`) or `every` N seconds, once per tick
        across all workers; a decorator over `@app.workflow`, or a call with `workflow=`.

        Args:
            args, kwargs: the task spec every run of the schedule receives.
            catchup: ticks later than `grace` (no worker ran them in time): `skip` them,
                fire the `latest` one, or fire `all` (at most `catchup_limit`).
            overlap: a tick while the previous run is unfinished: `skip` it, `queue` it,
                `allow` both, or `cancel_previous`.
            jitter: each tick fires up to this much later (the same delay on every worker).
        """
        from ..triggers.schedules import schedule_decorator

        return schedule_decorator(
            self, cron=cron, every=every, tz=tz, name=name, args=tuple(args), kwargs=kwargs,
            catchup=catchup, catchup_limit=catchup_limit, overlap=overlap, jitter=jitter,
            grace=grace, workflow=workflow,
        )  # fmt: skip

    def on_event(self, event_type: str, *, name: str | None = None) -> Any:
        """Decorator over `@app.workflow`: each event of `event_type` emitted with `emit`
        starts one run (given the payload), once per event id however often it arrives."""
        from ..triggers.events import on_event

        return on_event(self, event_type, name)

    def emit(
        self, event_type: str, payload: Any = None, *, event_id: str, run_id: str | None = None
    ) -> list[str]:
        """Ingest an event: start the runs its type triggers (ids `event:{trigger}:{event_id}`),
        or with `run_id` deliver it to that run's `wait_event(event_type)`. Returns run ids."""
        from ..triggers.events import emit

        done = self.sync(
            emit(self, event_type, payload, event_id=event_id, run_id=run_id), "App.emit()"
        )
        return list(done.run_ids)

    def plan(
        self,
        name: str,
        batches: Sequence[Sequence[Any]],
        *,
        check: Workflow[..., Any] | str | None = None,
        on_failure: str = "stop",
    ) -> RunHandle:
        """Start the plan run `plan:{name}`: each batch's runs (items `(workflow, args,
        kwargs)`, a dict, or a workflow) start once the previous batch finished and its
        `check(index, results)` returned true; `on_failure`: `stop` or `continue`."""
        from ..triggers import plans

        return plans.start(self, name, batches, check=check, on_failure=on_failure)

    def pause_schedule(self, name: str) -> ScheduleRow:
        """Stop a schedule at once (any worker, any host); `resume_schedule` continues it."""
        from ..triggers import schedules

        return self.sync(schedules.pause(self, name), "App.pause_schedule()")  # type: ignore[no-any-return]

    def resume_schedule(self, name: str) -> ScheduleRow:
        from ..triggers import schedules

        return self.sync(schedules.resume(self, name), "App.resume_schedule()")  # type: ignore[no-any-return]

    def delete_schedule(self, name: str) -> None:
        from ..triggers import schedules

        self.sync(schedules.delete(self, name), "App.delete_schedule()")

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule in the store (declared in code once a worker started, or added)."""
        return self.sync(self.store.list_schedules(), "App.schedules()")  # type: ignore[no-any-return]

    def schedule_ticks(self, name: str, *, limit: int = 50) -> list[TickRow]:
        """A schedule's recent ticks, newest first: fired, skipped, missed or queued, and why."""
        return self.sync(self.store.schedule_ticks(name, limit=limit), "App.schedule_ticks()")  # type: ignore[no-any-return]

    # -- store and wake-ups --------------------------------------------------------

    async def open_store(self) -> None:
        if not self._opened:
            await self.store.open()
            subscribe = getattr(self.store, "subscribe", None)
            if subscribe is not None:  # other processes' new work wakes this one's workers
                subscribe(self.notify)
            self._opened = True

    def notify(self) -> None:
        """Tell in-process workers that there may be new work."""
        self._work.fire()
        self._change.fire()
        for listener in self.on_notify:
            listener()

    def notify_change(self) -> None:
        self._change.fire()

    def listen_work(self) -> None:
        self._work.listen()

    async def wait_work(self, timeout: float) -> None:
        await self._work.wait(timeout)

    async def wait_change(self, timeout: float) -> None:
        await self._change.wait(timeout)

    def sync(self, coro: Any, what: str) -> Any:
        return self._portal.call(coro, what)

    def close(self) -> None:
        """Release the store connection and background threads."""
        self.sync(self.store.close(), "App.close()")
        self._portal.close()
        self.step_executor.shutdown(wait=False)
        self._opened = False

    # -- sync facade -------------------------------------------------------------------

    def start(
        self,
        workflow: Workflow[..., Any] | str,
        *args: Any,
        run_id: str | None = None,
        deadline: float | timedelta | None = None,
        queue: str | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        **kwargs: Any,
    ) -> RunHandle:
        """Start a run; an existing `run_id` returns that run's handle (idempotent start).

        `queue` overrides the workflow's queue; higher `priority` runs are claimed first;
        runs sharing a `partition_key` in a queue run one at a time.
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
        )
        return RunHandle(self, run.id)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on an existing run (checked when used)."""
        return RunHandle(self, run_id)

    def get_run(self, run_id: str) -> RunRow:
        return self.sync(self.client.get(run_id), "App.get_run()")  # type: ignore[no-any-return]

    def list_runs(
        self, *, statuses: Sequence[str] = (), workflow: str | None = None, limit: int = 100
    ) -> list[RunRow]:
        return self.sync(  # type: ignore[no-any-return]
            self.client.list_runs(statuses=statuses, workflow=workflow, limit=limit),
            "App.list_runs()",
        )

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

    def pause(self, run_id: str) -> str:
        return self.sync(self.client.pause(run_id), "App.pause()")  # type: ignore[no-any-return]

    def resume(self, run_id: str) -> str:
        return self.sync(self.client.resume(run_id), "App.resume()")  # type: ignore[no-any-return]

    def pause_workflow(self, name: str) -> bool:
        """Pause every run of a workflow at once, parked or running (see `Client.set_pause`);
        False if it was already paused."""
        return self.sync(self.client.set_pause("workflow", name, True), "App.pause_workflow()")  # type: ignore[no-any-return]

    def resume_workflow(self, name: str) -> bool:
        return self.sync(self.client.set_pause("workflow", name, False), "App.resume_workflow()")  # type: ignore[no-any-return]

    def pause_worker(self, worker: str) -> bool:
        """Stop a worker (by id, or every worker of a host) claiming and running runs; its
        runs stop at their next step and go back to the store until `resume_worker`."""
        return self.sync(self.client.set_pause("worker", worker, True), "App.pause_worker()")  # type: ignore[no-any-return]

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
        return RunHandle(self, run.id)

    # -- workers -----------------------------------------------------------------------

    def worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> Worker:
        """A worker for this app (await `worker.run()`); options as in `WorkerOptions`."""
        return Worker(self, options or WorkerOptions(**kwargs))

    def run_worker(self, options: WorkerOptions | None = None, **kwargs: Any) -> None:
        """Run a worker in this thread until SIGTERM/SIGINT, then drain and release leases."""
        worker = self.worker(options, **kwargs)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop)
            await worker.run()

        self._portal.call(_noop(), "App.run_worker()")  # refuses inside a running loop
        asyncio.run(main())


async def _noop() -> None:
    return None


class RunHandle:
    """A run, by id: ask its status, wait for its result, signal it."""

    def __init__(self, app: App, run_id: str) -> None:
        self.app = app
        self.id = run_id

    def __repr__(self) -> str:
        return f"RunHandle({self.id!r})"

    def status(self) -> str:
        return self.app.get_run(self.id).status

    async def status_async(self) -> str:
        return (await self.app.client.get(self.id)).status

    def result(self, timeout: float | timedelta | None = None) -> Any:
        """Block until the run finishes: its result, or `RunFailed`; `WaitTimeout` on timeout."""
        return self.app.sync(
            self.app.client.result(self.id, seconds(timeout)), "RunHandle.result()"
        )

    async def result_async(self, timeout: float | timedelta | None = None) -> Any:
        return await self.app.client.result(self.id, seconds(timeout))

    def send_event(self, name: str, payload: Any = None) -> None:
        self.app.send_event(self.id, name, payload)

    def cancel(self) -> str:
        return self.app.cancel(self.id)


class Workflow(Generic[P, R]):
    """A registered workflow. Outside a workflow, `.start()` starts a run; inside, a child run."""

    def __init__(self, app: App, definition: WorkflowDef) -> None:
        self.app = app
        self.definition = definition
        self.__doc__ = definition.fn.__doc__
        self.__name__ = definition.name

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Inside a workflow: start this as a child run and wait for its result."""
        ctx = current()
        if ctx is None:
            return self.definition.fn(*args, **kwargs)
        pos = ctx.next_position()
        handle = ctx.call(self._start_child(ctx, pos, args, kwargs, None))
        if ctx.sync_mode:
            return handle.result()

        async def both() -> Any:
            child = await handle
            return await child.result()

        return both()

    def start(self, *args: Any, run_id: str | None = None, **kwargs: Any) -> Any:
        """Start a run of this workflow (a child run when called inside a workflow)."""
        ctx = current()
        if ctx is None:
            return self.app.start(self, *args, run_id=run_id, **kwargs)
        pos = ctx.next_position()
        return ctx.call(self._start_child(ctx, pos, args, kwargs, run_id))

    async def _start_child(
        self,
        ctx: Any,
        pos: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None,
    ) -> ChildHandle:
        from ..store.base import NewRun

        entries = ctx.recorded(pos, "child", self.name)
        final = ctx.final(entries)
        if final is None:
            await ctx.checkpoint()
            child_id = run_id or f"{ctx.run_id}.{pos}"
            text, blob = inline_or_blob(
                encode_input(self.app, self.name, args, kwargs), self.app.blob_threshold
            )
            new = NewRun(
                queue=self.definition.queue,
                id=child_id,
                workflow=self.name,
                input=text,
                code_version=self.definition.version,
                now=ctx.now(),
                parent_id=ctx.run_id,
            )
            if blob is not None:
                new.blobs.append(blob)
            final = ctx.entry(
                "child.started", self.name, position=pos, final=True, data={"run_id": child_id}
            )
            await ctx.write(final, new_runs=[new])
            self.app.notify()
        return ChildHandle(ctx.data(final)["run_id"], self.definition.hints.get("return"))


class ChildHandle:
    """A child run started from a workflow; `result()` waits for it durably."""

    def __init__(self, run_id: str, hint: Any) -> None:
        self.id = run_id
        self._hint = hint

    def result(self) -> Any:
        from .context import require

        ctx = require("ChildHandle.result")
        pos = ctx.next_position()
        return ctx.call(child_result(ctx, pos, self.id, self._hint))
