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

One path: a call becomes a `StepCall` (the step, its position, arguments and attempt)
passed down; `_open` journals an attempt's intent and `_close` its outcome, whichever
thread runs the body (a sync workflow's own thread, or the event loop's tasks).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from ..errors import ParkRun, PayloadError, RunSuspended, StepError, StepTimeout, WorkerStopping
from ..store.base import NEEDS_ATTENTION, PAUSED, SLEEPING, AppendResult, Entry
from . import aborts, effects, observers
from .codec import dumps_plain, from_json, to_json
from .context import SLOW_STEP, RunContext, SimulatedCrash, StepInfo, current, monotonic
from .peers import SILENT_AFTER, how_lost
from .registry import StepDef
from .state import Phase

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


@dataclass(slots=True)
class StepCall:
    """One call of a step at one position of a run, passed down the step path."""

    ctx: RunContext
    step: StepDef
    pos: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    attempt: int = 1
    info: StepInfo = field(init=False)

    def __post_init__(self) -> None:
        self.at_attempt(self.attempt)

    def at_attempt(self, attempt: int) -> None:
        """Go on with attempt number `attempt` (the idempotency key stays the same)."""
        self.attempt = attempt
        self.info = StepInfo(self.ctx.run_id, self.step.name, self.pos, attempt, self.step.effect)

    @property
    def where(self) -> str:
        return f"step {self.step.name!r}"

    def entry(self, kind: str, **fields: Any) -> Entry:
        """A journal entry of this call's current attempt."""
        return self.ctx.entry(kind, self.step.name, position=self.pos, attempt=self.attempt,
                              **fields)  # fmt: skip


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
        call = StepCall(ctx, self.definition, ctx.next_position(), args, kwargs)
        if ctx.sync_mode:
            return _on_thread(call)
        return _on_loop(call)


def _on_thread(call: StepCall) -> Any:
    """A sync workflow's step: a recorded outcome and a fresh plain first attempt need no
    trip through the event loop; anything else (a retry, a recovery, a wait) takes it."""
    final, fresh = _recorded(call)
    if final is not None:
        return _replayed(call, final)
    if fresh and _here_ok(call):
        return _attempt_here(call)
    return call.ctx.call(run_step(call), track=True)


def _on_loop(call: StepCall) -> Coroutine[Any, Any, Any]:
    """An async workflow's step, as the coroutine it awaits. A recorded outcome, and a fresh
    first attempt of a short `def` body with nothing to commit before it (not `once`), are
    done at once: no chain of coroutines (run_step, checkpoint, _attempt, _execute) around
    a body that never waits. Anything else goes through `run_step`."""
    final, fresh = _recorded(call)
    if final is not None:
        return _replay(call, final)
    if fresh and _now_ok(call):
        return _attempt_now(call)
    if fresh and _once_now_ok(call):
        now = _once_now(call)
        if now is not None:
            return now
    return call.ctx.call(run_step(call), track=True)  # type: ignore[no-any-return]


def _recorded(call: StepCall) -> tuple[Entry | None, bool]:
    """The step's recorded outcome (None if it has none), and whether nothing at all is
    recorded at its position; (None, False) in a replay check, which run_step does."""
    ctx = call.ctx
    if ctx.state.phase is Phase.CHECKING:
        return None, False
    entries = ctx.recorded(call.pos, "step", call.step.name)
    return ctx.final(entries), not entries


def _now_ok(call: StepCall) -> bool:
    """A fresh step an async workflow may run at once: plain (`_here_ok`), its body shown to
    be short (engine/inline.py), and nothing to commit or refuse before the body starts."""
    step = call.step
    return (
        step.effect != "once"
        and step.pace.inline
        and not call.ctx.precious
        and not _may_not_start(call)
        and _here_ok(call)
    )


def _once_now_ok(call: StepCall) -> bool:
    """A fresh `once` step an async workflow may run at once if the store commits its intent
    on the loop's thread: plain, its body shown to be short, nothing asked of the run."""
    return (
        call.step.effect == "once"
        and call.step.pace.inline
        and not _may_not_start(call)
        and _here_ok(call)
    )


async def _replay(call: StepCall, final: Entry) -> Any:
    return _replayed(call, final)


def _here_ok(call: StepCall) -> bool:
    """A fresh plain step of a sync workflow with nothing pending may run on its own thread."""
    ctx, step = call.ctx, call.step
    deadline = ctx.run.deadline_at
    return ctx.state.quiet and not (
        step.is_async
        or step.timeout is not None
        or step.effect == "transactional"
        or ctx.diverged is not None
        or ctx.needs_flush()
        or (deadline is not None and ctx.now() >= deadline)
    )


def recorded_error(step: str, record: dict[str, Any], attempts: int) -> StepError:
    """The error a workflow sees for a failed step: the same on first run and on replay."""
    kind = StepTimeout if record["type"] == "perdure.errors.StepTimeout" else StepError
    message = record["message"]
    if kind is StepTimeout:
        message = message.rpartition(": ")[2]  # the attempt's own reason, not the wrapper's
    return kind(step, record["type"], message, attempts)


def _replayed(call: StepCall, final: Entry) -> Any:
    value = call.ctx.data(final)
    if isinstance(value, dict) and "error" in value:
        raise recorded_error(call.step.name, value["error"], final.attempt)
    return from_json(
        value.get("value") if isinstance(value, dict) else None, call.step.return_hint, call.where
    )


async def run_step(call: StepCall) -> Any:
    """Return the step's recorded outcome, or execute it under its effect and retry policy."""
    ctx = call.ctx
    entries = ctx.recorded(call.pos, "step", call.step.name)
    final = ctx.final(entries)
    if final is not None:
        return _replayed(call, final)
    await ctx.checkpoint()
    if entries:
        await _resume_from(call, entries[-1])
    return await _settle(call, await _attempt(call))


async def _resume_from(call: StepCall, last: Entry) -> None:
    """Set the attempt a step with an unfinished journal goes on with (recovery per effect:
    a `once` step interrupted mid-effect parks the run instead), backing off if due."""
    ctx, step = call.ctx, call.step
    stopped = (ctx.data(last) or {}) if last.kind == "step.stopped" else None
    if stopped is not None and not stopped.get("executing"):
        call.at_attempt(last.attempt)  # withdrawn by a stopping worker before its body ran
    elif last.kind in ("step.intent", "step.stopped"):
        action = "needs_attention" if step.effect == "once" else "rerun"
        observers.step_recovered(ctx, step, call.pos, last.attempt, action)
        call.at_attempt(last.attempt)  # same attempt, same key: the effect re-runs
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
                call.entry("step.needs_attention", data={"reason": reason}),
            )
    elif last.kind in ("step.attempt_failed", "step.retry"):
        call.at_attempt(last.attempt + 1)
        retry_at = (ctx.data(last) or {}).get("retry_at")
        if retry_at is not None and retry_at > ctx.now():
            await _backoff(call, retry_at)


async def _settle(call: StepCall, outcome: Any) -> Any:
    """Given one attempt's outcome: return it, or retry per policy, or record the failure."""
    ctx, step = call.ctx, call.step
    while isinstance(outcome, BaseException):
        if isinstance(outcome, ParkRun):
            raise await _park(call, outcome)
        counted = call.attempt - _parked(call)  # an operator's fix gives the policy a fresh start
        if isinstance(outcome, PayloadError) or not step.retry.should_retry(outcome, counted):
            record = error_record(outcome)
            ctx.buffer_entry(
                call.entry("step.outcome", final=True, data={"error": record}),
                precious=step.precious,
            )
            if ctx.needs_flush():
                await ctx.flush()
            raise recorded_error(step.name, record, call.attempt) from outcome
        retry_at = ctx.now() + step.retry.delay(counted, error=outcome)
        observers.step_retry(ctx, step, call.pos, call.attempt, retry_at - ctx.now(), outcome)
        failed = call.entry(
            "step.attempt_failed", data={"error": error_record(outcome), "retry_at": retry_at}
        )
        if step.effect == "once":
            await ctx.write(failed)  # a crash now must not look like a crash mid-effect
        else:
            ctx.buffer_entry(failed)
        await _backoff(call, retry_at)
        call.at_attempt(call.attempt + 1)
        outcome = await _attempt(call)
    return outcome


def _parked(call: StepCall) -> int:
    """How many attempts of this step parked the run (not counted by its retry)."""
    ctx = call.ctx
    return sum(
        1
        for e in ctx.by_position.get(call.pos, [])
        if e.kind == "step.attempt_failed"
        and '"parked"' in (e.data or "")
        and (ctx.data(e) or {}).get("parked")
    )


async def _park(call: StepCall, exc: ParkRun) -> Any:
    """Pause the run for an operator: the attempt is journaled as failed (not final, so
    `perdure resume` runs the step again) and the run's error says what to fix."""
    record = error_record(exc)
    entry = call.entry("step.attempt_failed", data={"error": record, "parked": True})
    reason = json.dumps({"type": record["type"], "message": record["message"]})
    return await call.ctx.suspend(PAUSED, "paused", entry, fields={"error": reason})


async def _backoff(call: StepCall, retry_at: float) -> None:
    """Wait until `retry_at`: in process if short, else park the run on a timer."""
    ctx = call.ctx
    delay = retry_at - ctx.now()
    if delay <= 0:
        return
    if delay <= ctx.inline_sleep and not ctx.state.hold:  # stopping: park it instead
        await ctx.flush()
        await asyncio.sleep(delay)
        return
    fields = {"wake_at": retry_at, "waiting_for": f"retry:{call.step.name}"}
    raise await ctx.suspend(SLEEPING, "retry backoff", fields=fields)


# -- one attempt: intent, body, outcome ----------------------------------------------------


def _open(call: StepCall) -> Entry | None:
    """Journal the attempt's intent: buffered if the step may run again, returned if it must
    be committed before the body starts (a `once` step's, refused if an operator asked to
    cancel or pause meanwhile). A `read` step journals none."""
    if call.step.effect == "read":
        return None
    data = dumps_plain({"effect": call.step.effect, "key": call.info.idempotency_key})
    intent = call.entry("step.intent", data_json=data)
    if call.step.effect == "once":
        return intent
    call.ctx.buffer_entry(intent)
    return None


def _must_commit(call: StepCall, intent: Entry | None) -> bool:
    """The intent, or a once step's outcome still buffered, must be on disk before the body."""
    return intent is not None or call.ctx.precious


def _may_not_start(call: StepCall) -> bool:
    """The body must not start: the worker began stopping, or a crash is injected here."""
    return call.ctx.state.hold or call.step.name in call.ctx.crash_after_intent


async def _not_started(call: StepCall) -> None:
    """Unwind before the body: hand the run back (stopping) or crash (injected)."""
    ctx = call.ctx
    if ctx.state.hold:  # the worker began stopping meanwhile: the body must not start
        await _withdraw(call)
    await ctx.flush()
    raise SimulatedCrash(f"crash injected before the outcome of step {call.step.name!r}")


def _body_started(call: StepCall) -> float:
    observers.step_started(call.ctx, call.info)
    call.ctx.executing[call.pos] = call.info
    return monotonic()


def _close(call: StepCall, data: str, started: float) -> bool:
    """Buffer the attempt's outcome (`data`: the body's value as JSON) and stop counting the
    body as executing; True if the outcome should be committed now (a slow step's)."""
    ctx = call.ctx
    observers.step_finished(ctx, call.info, started)
    elapsed = monotonic() - started
    ms = round(elapsed * 1000, 3)
    outcome = call.entry("step.outcome", final=True,
                         data_json=dumps_plain({"value": data, "ms": ms}))  # fmt: skip
    ctx.buffer_entry(outcome, precious=call.step.precious)
    ctx.executing.pop(call.pos, None)  # only now: a stop in between finds the outcome buffered
    return elapsed > SLOW_STEP


def _attempt_here(call: StepCall) -> Any:
    """First attempt of a step on the sync workflow's own thread: the loop is used only for
    what must be committed first; a failure goes on to the retry path through the loop."""
    ctx = call.ctx
    intent = _open(call)
    if _must_commit(call, intent):
        ctx.write_now(*([intent] if intent else []), stop_if_requested=intent is not None)
    if intent is not None and not ctx.lease_holds():
        raise ctx.lease_ran_out(call.step.name)
    if _may_not_start(call):
        ctx.call(_not_started(call))
    started = _body_started(call)
    token = _step_info.set(call.info)
    try:
        data = to_json(call.step.fn(*call.args, **call.kwargs), f"{call.where} result")
    except Exception as exc:
        observers.step_finished(ctx, call.info, started, exc)
        try:  # still executing until the failure is recorded: a stop meanwhile says so
            return ctx.call(_settle(call, exc), track=True)
        finally:
            ctx.executing.pop(call.pos, None)
    except BaseException:
        ctx.executing.pop(call.pos, None)
        raise
    finally:
        _step_info.reset(token)
    if _close(call, data, started):
        ctx.call(ctx.flush())
    return from_json(data, call.step.return_hint, call.where)


async def _attempt(call: StepCall) -> Any:
    """One attempt from the event loop; returns the replay-equal value, or the exception it
    failed with."""
    ctx = call.ctx
    await ctx.hand_back_if_held()  # e.g. the worker began stopping during a retry backoff
    if call.step.effect == "transactional":
        return await _attempt_transactional(call)
    intent = _open(call)
    if _must_commit(call, intent):
        await ctx.write(*([intent] if intent else []), stop_if_requested=intent is not None)
    return await _after_write(call, intent is not None)


async def _after_write(call: StepCall, intent: bool) -> Any:
    """The attempt once what must precede its body is committed (`intent`: a once step's
    intent was): its body, if it may start, and its outcome buffered."""
    ctx = call.ctx
    if intent and not ctx.lease_holds():
        raise ctx.lease_ran_out(call.step.name)
    if _may_not_start(call):
        await _not_started(call)
    started = _body_started(call)
    try:
        data = to_json(await _execute(call), f"{call.where} result")
    except BaseException as exc:
        ctx.executing.pop(call.pos, None)  # the caller records the failure before any await
        return await _cut_off(call, exc, started)
    if _close(call, data, started) or ctx.needs_flush():
        await ctx.flush()
    return from_json(data, call.step.return_hint, call.where)


def _attempt_now(call: StepCall) -> Coroutine[Any, Any, Any]:
    """A first attempt run at once (see `_on_loop`): its intent buffered, its body run
    inline; the coroutine returned gives its value, or settles what it raised (a retry, a
    failure), or commits first if the outcome must be (a slow body, a full buffer)."""
    _open(call)
    return _body_now(call)


def _once_now(call: StepCall) -> Coroutine[Any, Any, Any] | None:
    """A `once` first attempt run at once (see `_on_loop`): its intent committed on the
    loop's thread, then its body run inline; None (nothing done) if the store could not
    commit it here, e.g. its thread is busy with another write."""
    ctx = call.ctx
    intent = _open(call)
    assert intent is not None  # a once step's intent is committed, never buffered
    wrote = ctx.write_here(intent, stop_if_requested=True)
    if wrote is None:
        return None
    if not isinstance(wrote, AppendResult):  # not landed: land it, or unwind, then go on
        return ctx.call(_landed_first(call, wrote), track=True)  # type: ignore[no-any-return]
    if not ctx.lease_holds():
        raise ctx.lease_ran_out(call.step.name)
    if _may_not_start(call):  # e.g. the write found the worker stopping
        return ctx.call(_not_started(call))  # type: ignore[no-any-return]
    return _body_now(call)


async def _landed_first(call: StepCall, landing: Coroutine[Any, Any, AppendResult]) -> Any:
    await landing
    return await _settle(call, await _after_write(call, True))


def _body_now(call: StepCall) -> Coroutine[Any, Any, Any]:
    """The body of a first attempt run inline, what must precede it done: the coroutine
    returned gives its value, or settles what it raised, or commits first if it must."""
    ctx = call.ctx
    started = _body_started(call)
    token = _step_info.set(call.info)
    try:
        value = call.step.pace.run_inline(call.step.fn, *call.args, **call.kwargs)
        data = to_json(value, f"{call.where} result")
    except BaseException as exc:
        ctx.executing.pop(call.pos, None)  # as in _attempt: no longer executing, at once
        return ctx.call(_settle_cut_off(call, exc, started), track=True)  # type: ignore[no-any-return]
    finally:
        _step_info.reset(token)
    if _close(call, data, started) or ctx.needs_flush():
        return ctx.call(_flushed(call, data), track=True)  # type: ignore[no-any-return]
    return _returned(call, data)


async def _returned(call: StepCall, data: Any) -> Any:
    return from_json(data, call.step.return_hint, call.where)


async def _flushed(call: StepCall, data: Any) -> Any:
    await call.ctx.flush()
    return from_json(data, call.step.return_hint, call.where)


async def _settle_cut_off(call: StepCall, exc: BaseException, started: float) -> Any:
    return await _settle(call, await _cut_off(call, exc, started))


async def _cut_off(call: StepCall, exc: BaseException, started: float) -> Any:
    """A body ended by `exc` (no longer counted as executing): a suspension, a cancellation
    or anything not an Exception unwinds; an operator's abort (pause --now) is journaled and
    the step recovered by its effect; an Exception is given back for `_settle`."""
    ctx = call.ctx
    if isinstance(exc, (Exception, RunSuspended, asyncio.CancelledError, aborts.CallAborted)):
        observers.step_finished(ctx, call.info, started, exc)
    if isinstance(exc, aborts.CallAborted):
        await ctx.write(aborts.stopped_entry(ctx, call.info, exc))
        return await run_step(StepCall(ctx, call.step, call.pos, call.args, call.kwargs))
    if not isinstance(exc, Exception):
        raise exc
    return exc


async def _withdraw(call: StepCall) -> None:
    """The worker began stopping after this step's intent and before its body: hand the run
    back, journaling for a `once` step that its body never ran (so recovery may run it)."""
    ctx = call.ctx
    if call.step.effect == "once":
        data = {"executing": False, "effect": call.step.effect, "reason": effects.NOT_STARTED}
        await ctx.write(call.entry("step.stopped", data=data))
    else:
        await ctx.flush()
    raise WorkerStopping()


async def _execute(call: StepCall) -> Any:
    """Run the body from the loop: an async one awaited, a sync one on the step pool, or
    inline if it has shown itself short (engine/inline.py)."""
    ctx, step = call.ctx, call.step
    token = _step_info.set(call.info)
    try:
        if step.is_async:
            running = step.fn(*call.args, **call.kwargs)
        elif step.timeout is None and step.pace.inline:
            return step.pace.run_inline(step.fn, *call.args, **call.kwargs)
        else:
            context = contextvars.copy_context()
            body = (
                step.fn if step.timeout is not None else functools.partial(step.pace.timed, step.fn)
            )
            running = ctx.loop.run_in_executor(
                ctx.runtime.step_executor,
                functools.partial(context.run, body, *call.args, **call.kwargs),
            )
        if step.timeout is None:
            return await running
        try:
            return await asyncio.wait_for(running, step.timeout)
        except TimeoutError:
            raise StepTimeout(
                step.name, "StepTimeout", f"attempt took longer than {step.timeout}s"
            ) from None
    finally:
        _step_info.reset(token)


async def _attempt_transactional(call: StepCall) -> Any:
    """Run the step body inside the store transaction that also records its outcome."""
    ctx, step, info = call.ctx, call.step, call.info

    def body(conn: Any) -> str:
        info.db = conn
        token = _step_info.set(info)
        try:
            value = step.fn(*call.args, **call.kwargs)
        finally:
            _step_info.reset(token)
        return dumps_plain({"value": to_json(value, f"{call.where} result")})

    entry = call.entry("step.outcome", final=True)
    observers.step_started(ctx, info)
    started = monotonic()
    result = await ctx.write(entry, tx_body=body)
    observers.step_finished(ctx, info, started, result.tx_error)
    if result.tx_error is not None:
        ctx.by_position[call.pos].remove(entry)
        return result.tx_error
    return from_json(
        ctx.data(Entry(kind="", data=result.tx_data)).get("value"), step.return_hint, call.where
    )
