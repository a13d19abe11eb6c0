"""Execute one claimed run: replay the workflow from the top, then complete, fail or park it."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..errors import (
    DeadlineExceeded,
    LeaseLost,
    PayloadError,
    RunSuspended,
    StoreError,
    StoreUnavailable,
    WorkerStopping,
)
from ..store.base import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    FINISHED,
    Append,
    Claim,
    Entry,
    RunRow,
)
from ..store.blobs import BLOB_KEY, in_row_or_blob
from . import continuation, observers, sticky, streams
from .client import unblob_text
from .codec import dumps, loads
from .context import RunContext, activate, deactivate, ended_row
from .continuation import ContinueAsNew
from .dead import bury_if_poison
from .registry import WorkflowDef, typed_arguments
from .state import Phase
from .steps import error_record

if TYPE_CHECKING:
    from .clock import Clock
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")
BLOB_PREFIX = '{"' + BLOB_KEY  # how a blob reference's text starts (store.blobs.blob_ref)
UNLEASED = {"lease_owner": None, "lease_until": None, "wake_at": None}  # a run's end: no lease


async def load_entries(runtime: Runtime, run_id: str) -> list[Entry]:
    return await unblob_entries(runtime, await runtime.store.journal(run_id))


async def unblob_entries(runtime: Runtime, entries: list[Entry]) -> list[Entry]:
    """Replace blob references in the entries' data by the blobs' text."""
    for entry in entries:
        data = entry.data
        if data is not None and data.startswith(BLOB_PREFIX):  # a store trip only for blobs
            entry.data = await unblob_text(runtime.store, data)
    return entries


async def decode_input(
    runtime: Runtime, run: RunRow, definition: WorkflowDef
) -> tuple[list[Any], dict[str, Any]]:
    raw = loads(await unblob_text(runtime.store, run.input)) or {}
    args, kwargs = list(raw.get("args", [])), dict(raw.get("kwargs", {}))
    return typed_arguments(definition, args, kwargs, f"input of run {run.id!r}")


async def call_workflow(
    ctx: RunContext,
    definition: WorkflowDef,
    args: list[Any],
    kwargs: dict[str, Any],
    executor: Executor | None,
) -> Any:
    """Run the workflow function with `ctx` as the current run (sync ones on a thread).

    An async one is driven so that it may park in memory (`sticky.PARKED` is returned then).
    """
    if definition.is_async:
        return await sticky.start(ctx, definition.fn(*args, **kwargs))

    def call() -> Any:
        token = activate(ctx)
        try:
            return definition.fn(*args, **kwargs)
        finally:
            deactivate(token)

    return await ctx.loop.run_in_executor(executor, contextvars.copy_context().run, call)


async def execute(
    runtime: Runtime,
    claim: Claim,
    *,
    worker_id: str,
    clock: Clock,
    inline_sleep: float,
    executor: Executor | None,
    contexts: dict[str, RunContext],
    stopping: asyncio.Event | None = None,
    crash_after_intent: frozenset[str] = frozenset(),
    max_recoveries: int | None = None,
    lease: float | None = None,
) -> None:
    """Drive one claimed run until it finishes or parks; never raises for run-level failures.

    A recovered run whose recoveries keep crashing (more than `max_recoveries` in a
    row) is made `dead` instead of being replayed again. Once `stopping` is set the run
    is handed back at its next step boundary.
    """
    run = claim.run
    definition = runtime.workflows[run.workflow]
    try:
        if run.code_version != definition.version:  # checked first (engine/versions.py)
            from .versions import admit

            if await admit(runtime, claim, worker_id=worker_id, now=clock.now()) is None:
                return  # left for a worker of its version, or parked until one comes
        kept = await sticky.take(runtime, run, claim.recovered_from is not None)
        start: sticky.Kept | int
        if kept is not None:  # parked here in memory, nobody touched it since: go on from there
            ctx = sticky.rearm(kept, run, worker_id=worker_id, clock=clock)
            start = kept
        else:
            entries = [] if claim.empty_journal else await runtime.store.journal(run.id)
            if claim.recovered_from is not None and await bury_if_poison(
                runtime, claim, entries, max_recoveries=max_recoveries, now=clock.now(),
                worker_id=worker_id,
            ):  # fmt: skip
                return
            ctx = RunContext(
                runtime,
                run,
                await unblob_entries(runtime, entries),
                worker_id=worker_id,
                clock=clock,
                loop=asyncio.get_running_loop(),
                sync_mode=not definition.is_async,
                inline_sleep=inline_sleep,
            )
            start = entries[-1].seq if entries else -1  # the context indexes what it needs
            del entries
    except (StoreUnavailable, LeaseLost) as exc:  # the journal decides on recovery
        log.warning("worker %s: run %s not started: %s", worker_id, run.id, exc)
        return
    ctx.crash_after_intent = crash_after_intent
    # a once body starts only with a quarter of the lease left: heartbeats come every third
    ctx.lease_margin = lease / 4 if lease else 0.0
    ctx.update(hold=stopping is not None and stopping.is_set())  # claimed as it stopped
    await _drive(ctx, definition, start, claim, executor, contexts)


async def _drive(
    ctx: RunContext,
    definition: WorkflowDef,
    start: sticky.Kept | int,
    claim: Claim,
    executor: Executor | None,
    contexts: dict[str, RunContext],
) -> None:
    """Run the workflow (from the top after journal seq `start`, or on from where it parked
    in memory) under this claim, and record how it ended."""
    runtime, run = ctx.runtime, ctx.run
    continuation.warn_if_long(run.id, _last_seq(start) + 1)  # seqs are gap-free from 0
    ctx.task = asyncio.current_task()
    contexts[run.id] = ctx
    runtime.active[run.id] = ctx  # newest holder in this process, for operator calls
    started, outcome = observers.run_started(ctx, claim.recovered_from), "stopped"
    try:
        if run.status == CANCELLING:
            await finish_cancel(ctx)
            outcome = "cancelled"
        else:
            outcome = await _ended(ctx, _run_workflow(ctx, definition, start, executor))
    except WorkerStopping:
        pass
    except (StoreUnavailable, LeaseLost) as exc:  # met while finishing a cancel
        ctx.update(phase=Phase.LOST)
        log.warning("worker %s: run %s stopped: %s", ctx.worker_id, run.id, exc)
    finally:
        if outcome == "suspended":  # parked (a sleep, a wait): what it streamed is sent now
            await streams.flush(ctx)
        sticky.stop(ctx)  # not kept: an unfinished coroutine is closed
        ctx.close()
        observers.run_finished(ctx, outcome, started)
        contexts.pop(run.id, None)
        if runtime.active.get(run.id) is ctx:
            del runtime.active[run.id]
        if outcome in FINISHED and run.parent_id is None:
            runtime.notify_change()  # nothing became runnable
        else:
            runtime.notify()  # parked, handed back or stopped (runnable again), or a parent woke


def _last_seq(start: sticky.Kept | int) -> int:
    return start if isinstance(start, int) else start.last_seq


async def _run_workflow(
    ctx: RunContext, definition: WorkflowDef, start: sticky.Kept | int, executor: Executor | None
) -> str:
    """Run the workflow to its end and record its result; "suspended" if it parked in memory."""
    run = ctx.run
    if run.deadline_at is not None and ctx.now() >= run.deadline_at:
        raise DeadlineExceeded(f"run {run.id!r} passed its deadline")
    if isinstance(start, int):
        args, kwargs = await decode_input(ctx.runtime, run, definition)
        result = await call_workflow(ctx, definition, args, kwargs, executor)
    else:
        result = await sticky.resume(ctx, start.driver)
    if result is sticky.PARKED:
        sticky.keep(ctx.runtime, ctx, _last_seq(start))
        return "suspended"
    await ctx.await_siblings()
    if ctx.diverged is not None:
        raise ctx.diverged  # the workflow swallowed it; the run still must not finish
    await streams.flush(ctx)  # readers see every chunk before the run is done
    text, blob = in_row_or_blob(
        dumps(result, f"result of workflow {definition.name!r}"), ctx.runtime.blob_threshold
    )
    if blob is not None:
        ctx.blobs.append(blob)
    await ctx.write(ctx.entry("run.completed"), status=COMPLETED,
                    fields={"result": text, **UNLEASED})  # fmt: skip
    return "completed"


# -- how a run's execution ended: what it raised -> what is recorded --------------------------

Ending = Callable[[RunContext, Any], Awaitable[str]]


async def _continued(ctx: RunContext, signal: ContinueAsNew) -> str:
    await ctx.await_siblings()
    if ctx.diverged is not None:
        await fail(ctx, ctx.diverged)
        return "failed"
    await continuation.finish(ctx, signal)
    return "completed"


async def _suspended(ctx: RunContext, signal: RunSuspended) -> str:
    if signal.reason == "cancel":
        await finish_cancel(ctx)
        return "cancelled"
    return "suspended"


async def _cancelled(ctx: RunContext, exc: asyncio.CancelledError) -> str:
    if not ctx.state.cancel:  # not the run's cancellation: the worker's own
        raise exc
    await finish_cancel(ctx)
    return "cancelled"


async def _stopped(ctx: RunContext, _: WorkerStopping) -> str:
    if ctx.state.hold and ctx.state.phase is not Phase.LOST:  # paused workflow or worker
        await release_held(ctx.runtime, ctx, ctx.worker_id)
        return "released"
    return "stopped"


async def _unreachable(ctx: RunContext, exc: StoreUnavailable) -> str:
    """E.g. reading the input's blob: stop, never fail (the journal decides on recovery)."""
    ctx.update(phase=Phase.LOST)
    log.warning("worker %s: run %s stopped: %s", ctx.worker_id, ctx.run_id, exc)
    return "stopped"


async def _failed(ctx: RunContext, exc: Exception) -> str:
    await fail(ctx, ctx.diverged or exc)
    return "failed"


ENDINGS: tuple[tuple[type[BaseException], Ending], ...] = (
    (ContinueAsNew, _continued),
    (RunSuspended, _suspended),  # parked; or cancelled at a step boundary
    (asyncio.CancelledError, _cancelled),  # an async step cancelled by the run's cancellation
    (WorkerStopping, _stopped),  # lease lost, worker stopping, workflow or worker paused
    (StoreUnavailable, _unreachable),
    (Exception, _failed),
)


async def _ended(ctx: RunContext, running: Awaitable[str]) -> str:
    """How the execution ended, once recorded: the workflow's own end, or what `ENDINGS`
    makes of what it raised (anything else propagates: an engine error)."""
    try:
        return await running
    except BaseException as exc:
        for kind, ending in ENDINGS:
            if isinstance(exc, kind):
                return await ending(ctx, exc)
        raise


async def release_held(runtime: Runtime, ctx: RunContext, worker_id: str) -> None:
    """Release the lease of a run stopped by a pause or a stopping worker at a step
    boundary, so it resumes (elsewhere) as soon as it may."""
    try:
        await runtime.store.release(worker_id, [ctx.run_id])
        log.info("worker %s: run %s handed back at a step boundary", worker_id, ctx.run_id)
    except StoreError as exc:  # the lease will expire instead
        log.warning("worker %s: could not release paused run %s (%s)", worker_id, ctx.run_id, exc)


async def fail(ctx: RunContext, exc: BaseException) -> None:
    """Record the run as failed with the error that escaped the workflow."""
    record = error_record(exc)
    if isinstance(exc, PayloadError):
        record["type"] = "perdure.PayloadError"
    await streams.flush(ctx)
    ctx.reopen()
    await ctx.write(ctx.entry("run.failed", data=record), status=FAILED,
                    fields={"error": json.dumps(record), **UNLEASED})  # fmt: skip
    first = (str(record.get("message") or "").splitlines() or [""])[0]
    ctx.failure = f"{record['type']}: {first[:300]}"


async def finish_cancel(ctx: RunContext) -> None:
    """End a run whose cancellation was requested: children first, then the run itself."""
    ctx.reopen()
    ctx.buffer.clear()
    children = await ctx.store.list_runs(parent_id=ctx.run_id, limit=10_000)
    for child in children:
        if child.status not in FINISHED:  # a dead child is cancelled with its parent too
            await ctx.store.cancel(child.id, ctx.now())
    ending = Append(
        run_id=ctx.run_id,
        epoch=ctx.epoch,
        entries=[ctx.entry("run.cancelled")],
        status=CANCELLED,
        fields={**UNLEASED, "updated_at": ctx.now()},
    )
    await ctx.store.append(ending)
    ctx.runtime.run_ended(ended_row(ctx.run, ending))
    ctx.close()
