"""Execute one claimed run: replay the workflow from the top, then complete, fail or park it."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ..errors import (
    LeaseLost,
    PayloadError,
    RunSuspended,
    StoreError,
    StoreUnavailable,
    WorkerStopping,
)
from ..store.base import CANCELLED, COMPLETED, FAILED, FINISHED, Append, Claim, Entry, RunRow
from ..store.blobs import inline_or_blob
from . import observers, streams
from .client import unblob_text
from .codec import dumps, loads
from .context import RunContext, activate, deactivate
from .dead import bury_if_poison
from .registry import WorkflowDef, typed_arguments
from .steps import error_record

if TYPE_CHECKING:
    from .clock import Clock
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")


async def load_entries(runtime: Runtime, run_id: str) -> list[Entry]:
    return await unblob_entries(runtime, await runtime.store.journal(run_id))


async def unblob_entries(runtime: Runtime, entries: list[Entry]) -> list[Entry]:
    """Replace blob references in the entries' data by the blobs' text."""
    for entry in entries:
        entry.data = await unblob_text(runtime.store, entry.data)
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
    """Run the workflow function with `ctx` as the current run (sync ones on a thread)."""
    if definition.is_async:
        token = activate(ctx)
        try:
            return await definition.fn(*args, **kwargs)
        finally:
            deactivate(token)

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
) -> None:
    """Drive one claimed run until it finishes or parks; never raises for run-level failures.

    A recovered run whose recoveries keep crashing (more than `max_recoveries` in a
    row) is made `dead` instead of being replayed again. Once `stopping` is set the run
    is handed back at its next step boundary.
    """
    run = claim.run
    definition = runtime.workflows[run.workflow]
    loop = asyncio.get_running_loop()
    try:
        entries = [] if claim.empty_journal else await runtime.store.journal(run.id)
        if claim.recovered_from is not None and await bury_if_poison(
            runtime,
            claim,
            entries,
            max_recoveries=max_recoveries,
            now=clock.now(),
            worker_id=worker_id,
        ):
            return
        entries = await unblob_entries(runtime, entries)
    except StoreUnavailable as exc:  # the lease will expire; the journal decides on recovery
        log.warning("worker %s: run %s not started: %s", worker_id, run.id, exc)
        return
    ctx = RunContext(
        runtime,
        run,
        entries,
        worker_id=worker_id,
        clock=clock,
        loop=loop,
        sync_mode=not definition.is_async,
        inline_sleep=inline_sleep,
    )
    ctx.crash_after_intent = crash_after_intent
    ctx.task = asyncio.current_task()
    contexts[run.id] = ctx
    ctx.hold_requested = stopping is not None and stopping.is_set()  # claimed as it stopped
    runtime.active[run.id] = ctx  # newest holder in this process, for operator calls
    started, outcome = observers.run_started(ctx, claim.recovered_from), "stopped"
    try:
        if run.status == "cancelling":
            await finish_cancel(ctx)
            outcome = "cancelled"
            return
        try:
            if run.deadline_at is not None and clock.now() >= run.deadline_at:
                from ..errors import DeadlineExceeded

                raise DeadlineExceeded(f"run {run.id!r} passed its deadline")
            args, kwargs = await decode_input(runtime, run, definition)
            result = await call_workflow(ctx, definition, args, kwargs, executor)
            await ctx.settle_inflight()
            if ctx.diverged is not None:
                raise ctx.diverged  # the workflow swallowed it; the run still must not finish
            await streams.flush(ctx)  # readers see every chunk before the run is done
            text, blob = inline_or_blob(
                dumps(result, f"result of workflow {definition.name!r}"), runtime.blob_threshold
            )
            if blob is not None:
                ctx.blobs.append(blob)
            await ctx.write(
                ctx.entry("run.completed"),
                status=COMPLETED,
                fields={"result": text, "lease_owner": None, "lease_until": None, "wake_at": None},
            )
            outcome = "completed"
        except RunSuspended as signal:
            outcome = "suspended"
            if signal.reason == "cancel":
                await finish_cancel(ctx)
                outcome = "cancelled"
        except asyncio.CancelledError:
            if not ctx.cancel_requested:
                raise
            await finish_cancel(ctx)
            outcome = "cancelled"
        except WorkerStopping:
            if ctx.hold_requested and not ctx.lost:  # paused workflow or worker: hand it back
                await release_held(runtime, ctx, worker_id)
                outcome = "released"
        except StoreUnavailable as exc:  # e.g. reading the input's blob: stop, never fail
            raise ctx._unreachable(exc) from None
        except Exception as exc:
            await fail(ctx, ctx.diverged or exc)
            outcome = "failed"
    except WorkerStopping:
        pass
    except (StoreUnavailable, LeaseLost) as exc:  # met while finishing a cancel
        ctx.lost = True
        log.warning("worker %s: run %s stopped: %s", worker_id, run.id, exc)
    finally:
        if outcome == "suspended":  # parked (a sleep, a wait): what it streamed is sent now
            await streams.flush(ctx)
        ctx.closed = True
        observers.run_finished(ctx, outcome, started)
        contexts.pop(run.id, None)
        if runtime.active.get(run.id) is ctx:
            del runtime.active[run.id]
        runtime.notify_change()


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
    ctx.closed = False
    await ctx.write(
        ctx.entry("run.failed", data=record),
        status=FAILED,
        fields={
            "error": json.dumps(record),
            "lease_owner": None,
            "lease_until": None,
            "wake_at": None,
        },
    )


async def finish_cancel(ctx: RunContext) -> None:
    """End a run whose cancellation was requested: children first, then the run itself."""
    ctx.closed = False
    ctx.buffer.clear()
    children = await ctx.store.list_runs(parent_id=ctx.run_id, limit=10_000)
    for child in children:
        if child.status not in FINISHED:  # a dead child is cancelled with its parent too
            await ctx.store.cancel(child.id, ctx.now())
    await ctx.store.append(
        Append(
            run_id=ctx.run_id,
            epoch=ctx.epoch,
            entries=[ctx.entry("run.cancelled")],
            status=CANCELLED,
            fields={
                "lease_owner": None,
                "lease_until": None,
                "wake_at": None,
                "updated_at": ctx.now(),
            },
        )
    )
    ctx.closed = True
