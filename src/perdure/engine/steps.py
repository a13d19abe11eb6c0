"""Calling a step from a workflow: replay its outcome, or journal intent, execute, retry, record.

Recovery of a step whose intent was journaled but whose outcome was not follows
its effect (DESIGN.md): `read`, `idempotent` and `keyed` run again (keyed with
the same idempotency key); `once` parks the run in `needs_attention`;
`transactional` cannot be in that state because effect and outcome commit together.
A step that raises `ParkRun` (a model provider refusing its key) pauses the run with
the error as its reason; `perdure resume` runs the step again.

A stopping worker starts no step body. One whose body it cut off when its grace
ended is journaled `step.stopped` (executing): recovered as above, but the reason
says stopped, not crashed. One whose intent was written as the stop came, but
whose body never started, is journaled `step.stopped` (not executing) and simply runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import traceback
from typing import Any, Generic, ParamSpec, TypeVar

from ..errors import ParkRun, PayloadError, RunSuspended, StepError, StepTimeout, WorkerStopping
from ..store.base import NEEDS_ATTENTION, PAUSED, SLEEPING, Entry
from . import aborts, effects, observers
from .codec import dumps_plain, from_json, to_json
from .context import SLOW_STEP, RunContext, SimulatedCrash, StepInfo, current, monotonic
from .peers import SILENT_AFTER, how_lost
from .registry import StepDef

P = ParamSpec("P")
R = TypeVar("R")

_step_info: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "perdure_step", default=None
)


def current_step() -> StepInfo:
    """The step being executed (name, position, attempt, `idempotency_key`, `db`)."""
    info = _step_info.get()
    if info is None:
        from ..errors import PerdureError

        raise PerdureError("perdure.current_step() can only be called inside a running step")
    return info


def error_record(exc: BaseException) -> dict[str, Any]:
    """A JSON description of an exception: type, message, traceback."""
    kind = type(exc)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


class Step(Generic[P, R]):
    """A registered step. Inside a workflow, calling it journals it; outside, it is a plain call."""

    def __init__(self, definition: StepDef) -> None:
        self.definition = definition
        functools.update_wrapper(self, definition.fn)

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        ctx = current()
        if ctx is None:
            return self.definition.fn(*args, **kwargs)
        pos = ctx.next_position()
        if ctx.sync_mode and not ctx.check_only:
            # Replay fast path: a recorded outcome needs no trip through the event loop.
            entries = ctx.recorded(pos, "step", self.definition.name)
            final = ctx.final(entries)
            if final is not None:
                return _replayed(ctx, final, self.definition)
            if not entries and _direct_ok(ctx, self.definition):
                return _run_direct(ctx, self.definition, pos, args, kwargs)
        return ctx.call(run_step(ctx, self.definition, pos, args, kwargs), track=True)


def _direct_ok(ctx: RunContext, step: StepDef) -> bool:
    """A fresh plain step of a sync workflow with nothing pending may run on its own thread."""
    deadline = ctx.run.deadline_at
    return not (
        step.is_async
        or step.timeout is not None
        or step.effect == "transactional"
        or ctx.cancel_requested
        or ctx.pause_requested
        or ctx.hold_requested
        or ctx.lost
        or ctx.closed
        or ctx.diverged is not None
        or ctx.needs_flush()
        or (deadline is not None and ctx.now() >= deadline)
    )


def _run_direct(
    ctx: RunContext, step: StepDef, pos: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """First attempt of a step on the sync workflow's own thread: no hand-off to the loop
    unless something must be committed first. Failures go on to the normal retry path."""
    where = f"step {step.name!r}"
    info = StepInfo(ctx.run_id, step.name, pos, 1, step.effect)
    if step.effect != "read":
        intent = ctx.entry(
            "step.intent",
            step.name,
            position=pos,
            attempt=1,
            data_json=dumps_plain({"effect": step.effect, "key": info.idempotency_key}),
        )
        if step.effect == "once":
            ctx.write_now(intent, stop_if_requested=True)
        else:
            ctx.buffer_entry(intent)
    if ctx.precious:
        ctx.write_now()  # a once step's outcome must not wait behind this step
    if ctx.hold_requested:  # the worker began stopping meanwhile: the body must not start
        ctx.call(_withdraw(ctx, step, pos, 1))
    if step.name in ctx.crash_after_intent:
        ctx.call(ctx.flush())
        raise SimulatedCrash(f"crash injected before the outcome of step {step.name!r}")
    observers.step_started(ctx, info)
    started = monotonic()
    token = _step_info.set(info)
    ctx.executing[pos] = info
    try:
        data = to_json(step.fn(*args, **kwargs), f"{where} result")
    except Exception as exc:
        observers.step_finished(ctx, info, started, exc)
        try:
            return ctx.call(run_step(ctx, step, pos, args, kwargs, failed=(exc, 1)), track=True)
        finally:
            ctx.executing.pop(pos, None)
    except BaseException:
        ctx.executing.pop(pos, None)
        raise
    finally:
        _step_info.reset(token)
    observers.step_finished(ctx, info, started)
    elapsed = monotonic() - started
    entry = ctx.entry(
        "step.outcome",
        step.name,
        position=pos,
        attempt=1,
        final=True,
        data_json=dumps_plain({"value": data, "ms": round(elapsed * 1000, 3)}),
    )
    ctx.buffer_entry(entry, precious=step.precious)
    ctx.executing.pop(pos, None)  # only now: a stop in between finds the outcome buffered
    if elapsed > SLOW_STEP:
        ctx.call(ctx.flush())
    return from_json(data, step.return_hint, where)


def recorded_error(step: str, record: dict[str, Any], attempts: int) -> StepError:
    """The error a workflow sees for a failed step: the same on first run and on replay."""
    kind = StepTimeout if record["type"] == "perdure.errors.StepTimeout" else StepError
    message = record["message"]
    if kind is StepTimeout:
        message = message.rpartition(": ")[2]  # the attempt's own reason, not the wrapper's
    return kind(step, record["type"], message, attempts)


def _replayed(ctx: RunContext, final: Entry, step: StepDef) -> Any:
    value = ctx.data(final)
    if isinstance(value, dict) and "error" in value:
        raise recorded_error(step.name, value["error"], final.attempt)
    return from_json(
        value.get("value") if isinstance(value, dict) else None,
        step.return_hint,
        f"step {step.name!r}",
    )


async def run_step(
    ctx: RunContext,
    step: StepDef,
    pos: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    failed: tuple[Exception, int] | None = None,
) -> Any:
    """Return the step's recorded outcome, or execute it under its effect and retry policy.

    `failed` carries an attempt that already ran (on a sync workflow's thread) and raised.
    """
    if failed is not None:
        return await _settle(ctx, step, pos, args, kwargs, *failed)
    entries = ctx.recorded(pos, "step", step.name)
    final = ctx.final(entries)
    if final is not None:
        return _replayed(ctx, final, step)
    await ctx.checkpoint()
    attempt = 1
    last = entries[-1] if entries else None
    stopped = (ctx.data(last) or {}) if last is not None and last.kind == "step.stopped" else None
    if last is not None and stopped is not None and not stopped.get("executing"):
        attempt = last.attempt  # withdrawn by a stopping worker before its body ran: run it
    elif last is not None and last.kind in ("step.intent", "step.stopped"):
        action = "needs_attention" if step.effect == "once" else "rerun"
        observers.step_recovered(ctx, step, pos, last.attempt, action)
        if step.effect == "once":
            if stopped is None:
                how = await ctx.read(
                    lambda: how_lost(ctx.store, last.worker, ctx.now(), SILENT_AFTER)
                )
                reason = effects.lost_reason(how)
            else:
                reason = effects.stopped_reason(str(stopped.get("reason", "worker stopped")))
            raise await ctx.suspend(
                NEEDS_ATTENTION,
                "needs_attention",
                ctx.entry(
                    "step.needs_attention",
                    step.name,
                    position=pos,
                    attempt=last.attempt,
                    data={"reason": reason},
                ),
            )
        attempt = last.attempt  # same attempt, same key: the effect re-runs
    elif last is not None and last.kind in ("step.attempt_failed", "step.retry"):
        attempt = last.attempt + 1
        retry_at = (ctx.data(last) or {}).get("retry_at")
        if retry_at is not None and retry_at > ctx.now():
            await _backoff(ctx, step, pos, retry_at)
    return await _settle(
        ctx, step, pos, args, kwargs, await _attempt(ctx, step, pos, attempt, args, kwargs), attempt
    )


async def _settle(
    ctx: RunContext,
    step: StepDef,
    pos: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outcome: Any,
    attempt: int,
) -> Any:
    """Given one attempt's outcome: return it, or retry per policy, or record the failure."""
    while True:
        if not isinstance(outcome, BaseException):
            return outcome
        if isinstance(outcome, ParkRun):
            raise await _park(ctx, step, pos, attempt, outcome)
        counted = attempt - _parked(ctx, pos)  # an operator's fix gives the policy a fresh start
        if not isinstance(outcome, PayloadError) and step.retry.should_retry(outcome, counted):
            retry_at = ctx.now() + step.retry.delay(counted, error=outcome)
            observers.step_retry(ctx, step, pos, attempt, retry_at - ctx.now(), outcome)
            entry = ctx.entry(
                "step.attempt_failed",
                step.name,
                position=pos,
                attempt=attempt,
                data={"error": error_record(outcome), "retry_at": retry_at},
            )
            if step.effect == "once":
                await ctx.write(entry)  # a crash now must not look like a crash mid-effect
            else:
                ctx.buffer_entry(entry)
            await _backoff(ctx, step, pos, retry_at)
            attempt += 1
            outcome = await _attempt(ctx, step, pos, attempt, args, kwargs)
            continue
        record = error_record(outcome)
        final_entry = ctx.entry(
            "step.outcome",
            step.name,
            position=pos,
            attempt=attempt,
            final=True,
            data={"error": record},
        )
        ctx.buffer_entry(final_entry, precious=step.precious)
        if ctx.needs_flush():
            await ctx.flush()
        raise recorded_error(step.name, record, attempt) from outcome


def _parked(ctx: RunContext, pos: int) -> int:
    """How many attempts of the step at `pos` parked the run (not counted by its retry)."""
    return sum(
        1
        for e in ctx.by_position.get(pos, [])
        if e.kind == "step.attempt_failed"
        and '"parked"' in (e.data or "")
        and (ctx.data(e) or {}).get("parked")
    )


async def _park(ctx: RunContext, step: StepDef, pos: int, attempt: int, exc: ParkRun) -> Any:
    """Pause the run for an operator: the attempt is journaled as failed (not final, so
    `perdure resume` runs the step again) and the run's error says what to fix."""
    record = error_record(exc)
    entry = ctx.entry(
        "step.attempt_failed",
        step.name,
        position=pos,
        attempt=attempt,
        data={"error": record, "parked": True},
    )
    reason = json.dumps({"type": record["type"], "message": record["message"]})
    return await ctx.suspend(PAUSED, "paused", entry, fields={"error": reason})


async def _backoff(ctx: RunContext, step: StepDef, pos: int, retry_at: float) -> None:
    """Wait until `retry_at`: in process if short, else park the run on a timer."""
    delay = retry_at - ctx.now()
    if delay <= 0:
        return
    if delay <= ctx.inline_sleep and not ctx.hold_requested:  # stopping: park it instead
        await ctx.flush()
        await asyncio.sleep(delay)
        return
    raise await ctx.suspend(
        SLEEPING, "retry backoff", fields={"wake_at": retry_at, "waiting_for": f"retry:{step.name}"}
    )


async def _attempt(
    ctx: RunContext,
    step: StepDef,
    pos: int,
    attempt: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """One attempt; returns the replay-equal value, or the exception it failed with."""
    where = f"step {step.name!r}"
    info = StepInfo(ctx.run_id, step.name, pos, attempt, step.effect)
    await ctx.hand_back_if_held()  # e.g. the worker began stopping during a retry backoff
    if step.effect == "transactional":
        return await _attempt_transactional(ctx, step, pos, attempt, args, kwargs, info)
    if step.effect != "read":
        intent = ctx.entry(
            "step.intent",
            step.name,
            position=pos,
            attempt=attempt,
            data_json=dumps_plain({"effect": step.effect, "key": info.idempotency_key}),
        )
        if step.effect == "once":
            # refused if an operator (in any process) asked to cancel or pause meanwhile
            await ctx.write(intent, stop_if_requested=True)
        else:
            ctx.buffer_entry(intent)
    if ctx.precious:
        await ctx.flush()  # a once step's outcome must not wait behind this step's execution
    if ctx.hold_requested:  # the worker began stopping meanwhile: the body must not start
        await _withdraw(ctx, step, pos, attempt)
    if step.name in ctx.crash_after_intent:
        await ctx.flush()
        raise SimulatedCrash(f"crash injected before the outcome of step {step.name!r}")
    observers.step_started(ctx, info)
    started = monotonic()
    ctx.executing[pos] = info
    try:
        value = await _execute(ctx, step, info, args, kwargs)
        data = to_json(value, f"{where} result")
    except (RunSuspended, asyncio.CancelledError) as stop:
        ctx.executing.pop(pos, None)
        observers.step_finished(ctx, info, started, stop)
        raise
    except aborts.CallAborted as aborted:  # pause --now: journaled, then recovered by effect
        ctx.executing.pop(pos, None)
        observers.step_finished(ctx, info, started, aborted)
        await ctx.write(aborts.stopped_entry(ctx, info, aborted))
        return await run_step(ctx, step, pos, args, kwargs)
    except BaseException as exc:
        ctx.executing.pop(pos, None)  # the caller records the failure before any await
        if not isinstance(exc, Exception):
            raise
        observers.step_finished(ctx, info, started, exc)
        return exc
    ctx.executing.pop(pos, None)  # the outcome is buffered below, before any await
    observers.step_finished(ctx, info, started)
    elapsed = monotonic() - started
    entry = ctx.entry(
        "step.outcome",
        step.name,
        position=pos,
        attempt=attempt,
        final=True,
        data_json=dumps_plain({"value": data, "ms": round(elapsed * 1000, 3)}),
    )
    ctx.buffer_entry(entry, precious=step.precious)
    if elapsed > SLOW_STEP or ctx.needs_flush():
        await ctx.flush()
    return from_json(data, step.return_hint, where)


async def _withdraw(ctx: RunContext, step: StepDef, pos: int, attempt: int) -> None:
    """The worker began stopping after this step's intent and before its body: hand the run
    back, journaling for a `once` step that its body never ran (so recovery may run it)."""
    if step.effect == "once":
        data = {"executing": False, "effect": step.effect, "reason": effects.NOT_STARTED}
        await ctx.write(ctx.entry("step.stopped", step.name, position=pos, attempt=attempt,
                                  data=data))  # fmt: skip
    else:
        await ctx.flush()
    raise WorkerStopping()


async def _execute(
    ctx: RunContext, step: StepDef, info: StepInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    token = _step_info.set(info)
    try:
        if step.is_async:
            call = step.fn(*args, **kwargs)
        else:
            context = contextvars.copy_context()
            call = ctx.loop.run_in_executor(
                ctx.runtime.step_executor, functools.partial(context.run, step.fn, *args, **kwargs)
            )
        if step.timeout is None:
            return await call
        try:
            return await asyncio.wait_for(call, step.timeout)
        except TimeoutError:
            raise StepTimeout(
                step.name, "StepTimeout", f"attempt took longer than {step.timeout}s"
            ) from None
    finally:
        _step_info.reset(token)


async def _attempt_transactional(
    ctx: RunContext,
    step: StepDef,
    pos: int,
    attempt: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    info: StepInfo,
) -> Any:
    """Run the step body inside the store transaction that also records its outcome."""
    where = f"step {step.name!r}"

    def body(conn: Any) -> str:
        info.db = conn
        token = _step_info.set(info)
        try:
            value = step.fn(*args, **kwargs)
        finally:
            _step_info.reset(token)
        return dumps_plain({"value": to_json(value, f"{where} result")})

    entry = ctx.entry("step.outcome", step.name, position=pos, attempt=attempt, final=True)
    observers.step_started(ctx, info)
    started = monotonic()
    result = await ctx.write(entry, tx_body=body)
    observers.step_finished(ctx, info, started, result.tx_error)
    if result.tx_error is not None:
        ctx.by_position[pos].remove(entry)
        return result.tx_error
    return from_json(
        ctx.data(Entry(kind="", data=result.tx_data)).get("value"), step.return_hint, where
    )
