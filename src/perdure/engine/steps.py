"""Calling a step from a workflow: replay its outcome, or journal intent, execute, retry, record.

One route: a call becomes a `StepCall` (the step, its position, arguments and attempt)
and `run_step` takes it from there, for sync and async workflows alike. It replays a
recorded outcome; else it recovers what an earlier execution left unfinished (below),
then runs `_attempt`, and `_retry` decides what a failed attempt leads to. Where the
body runs and how a write waits are choices inside the route, never other routes:

- an async workflow awaits `run_step`; a sync workflow's thread drives the same
  coroutine itself (`context.drive`) until it has to wait for the event loop;
- a `def` body runs on the calling thread (a sync workflow's own, or the loop once the
  body has shown itself short: engine/pace.py), else on the step pool; an `async def`
  body is awaited on the loop;
- a write is committed on the calling thread when the store is idle and the run is
  alone in its worker, else queued to share a commit (store/threaded.py).

Recovery of a step whose intent was journaled but whose outcome was not follows its
effect (DESIGN.md): `read`, `idempotent` and `keyed` run again (keyed with the same
idempotency key); `once` parks the run in `needs_attention`; `transactional` cannot be
in that state because effect and outcome commit together. A step that raises `ParkRun`
(a model provider refusing its key) pauses the run with the error as its reason;
`perdure resume` runs the step again.

A stopping worker starts no step body. One whose body it cut off when its grace ended is
journaled `step.stopped` (executing): recovered as above, but the reason says stopped,
not crashed. One whose intent was written as the stop came, but whose body never
started, is journaled `step.stopped` (not executing) and simply runs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
import sysconfig
import time
import traceback
from typing import Any, Generic, ParamSpec, TypeVar

from ..errors import (
    ParkRun,
    PayloadError,
    PerdureError,
    RunSuspended,
    StepError,
    StepTimeout,
    WorkerStopping,
)
from ..store.base import NEEDS_ATTENTION, PAUSED, SLEEPING, Entry
from . import aborts, effects, observers, pace, probes
from .codec import dumps_plain, from_json, quoted, to_json
from .context import LINGER, RunContext, SimulatedCrash, StepInfo, _current, drive, to_loop
from .peers import SILENT_AFTER, how_lost
from .registry import StepDef
from .state import Phase

P = ParamSpec("P")
R = TypeVar("R")

_step_info: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "perdure_step", default=None
)
_running_loop = asyncio._get_running_loop  # None on a sync workflow's own thread


def current_step() -> StepInfo:
    """The step being executed (name, position, attempt, `idempotency_key`, `db`)."""
    info = _step_info.get()
    if info is None:
        raise PerdureError("perdure.current_step() can only be called inside a running step")
    return info


def _installed_roots() -> tuple[str, ...]:
    """Folders of installed code (the standard library, site-packages, perdure itself):
    frames there are not the user's, and their paths say where the server is installed."""
    paths = sysconfig.get_paths()
    roots = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(os.path.join(r, "") for r in roots if r)


INSTALLED = _installed_roots()


def user_traceback(exc: BaseException) -> str:
    """The traceback of `exc` as a failed run keeps it: the user's frames only (the last
    frame too, if none is theirs), file names relative to the working directory, so that
    what the API and the dashboard show names no install path of the server."""
    shown = traceback.TracebackException.from_exception(exc)
    here = os.path.join(os.getcwd(), "")
    for part in (shown, *(c for c in (shown.__cause__, shown.__context__) if c)):
        frames = [f for f in part.stack if not f.filename.startswith(INSTALLED)]
        if not frames and part.stack:
            last = part.stack[-1]
            last.filename = os.path.basename(last.filename)
            frames = [last]
        for frame in frames:
            if frame.filename.startswith(here):
                frame.filename = frame.filename[len(here) :]
        part.stack = traceback.StackSummary.from_list(frames)
    return "".join(shown.format())


def error_record(exc: BaseException) -> dict[str, Any]:
    """A JSON description of an exception: type, message, traceback (`user_traceback`)."""
    kind = type(exc)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": user_traceback(exc),
    }


class StepCall:
    """One call of a step at one position of a run, passed down the step route."""

    __slots__ = ("args", "attempt", "ctx", "info", "kwargs", "pos", "step")

    def __init__(
        self,
        ctx: RunContext,
        step: StepDef,
        pos: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        attempt: int = 1,
    ) -> None:
        self.ctx, self.step, self.pos, self.args, self.kwargs = ctx, step, pos, args, kwargs
        self.attempt = attempt
        key = f"{ctx.run.id}:{pos}"
        self.info = StepInfo(ctx.run.id, step.name, pos, attempt, step.effect, key)

    def at_attempt(self, attempt: int) -> None:
        """Go on with attempt number `attempt` (the idempotency key stays the same)."""
        self.attempt = attempt
        info = self.info
        self.info = StepInfo(info.run_id, info.name, self.pos, attempt, info.effect,
                             info.idempotency_key)  # fmt: skip

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
        ctx = _current.get()
        if ctx is None:
            return self.definition.fn(*args, **kwargs)
        call = StepCall(ctx, self.definition, ctx.next_position(), args, kwargs)
        if ctx.sync_mode:  # the workflow's own thread runs the route, as far as it can
            return drive(run_step(call), ctx.loop)
        return run_step(call)


async def run_step(call: StepCall) -> Any:
    """Return the step's recorded outcome, or execute it under its effect and retry policy."""
    ctx = call.ctx
    entries = ctx.by_position.get(call.pos)
    if entries is not None or ctx.state.phase is Phase.CHECKING:
        entries = ctx.recorded(call.pos, "step", call.step.name)  # the same call, or diverged
        for entry in entries:
            if entry.final:
                return _replayed(call, entry)
    await ctx.checkpoint()
    tracked = not ctx.sync_mode  # a sibling parking the run waits for it (gather)
    if tracked:
        ctx.inflight[call] = asyncio.current_task()
    try:
        if entries:
            settled = await _resume_from(call, entries[-1])
            if settled is not None:
                return _replayed(call, settled)
        outcome = await _attempt(call)
        while isinstance(outcome, BaseException):
            outcome = await _retry(call, outcome)
        return outcome
    finally:
        if tracked:
            ctx.left(call)


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
    data = value.get("value") if isinstance(value, dict) else None
    return from_json(data, call.step.return_hint, call.step.where)


async def _resume_from(call: StepCall, last: Entry) -> Entry | None:
    """Set the attempt a step with an unfinished journal goes on with (recovery per effect:
    a `once` step interrupted mid-effect asks its probe, or parks the run), backing off if
    due; the outcome a probe settled, if it did."""
    ctx, step = call.ctx, call.step
    said = (ctx.data(last) or {}) if last.kind in ("step.stopped", "step.retry") else {}
    if last.kind == "step.stopped" and not said.get("executing"):
        call.at_attempt(last.attempt)  # withdrawn by a stopping worker before its body ran
    elif last.kind in ("step.intent", "step.stopped"):
        once = step.effect == "once"
        action = "rerun" if not once else "probe" if step.probe else "needs_attention"
        observers.step_recovered(ctx, step, call.pos, last.attempt, action)
        call.at_attempt(last.attempt)  # same attempt, same key: the effect re-runs
        if once:
            if last.kind == "step.stopped":
                why = effects.stopped_reason(str(said.get("reason", "worker stopped")))
            else:
                why = effects.lost_reason(await ctx.read(
                    lambda: how_lost(ctx.store, last.worker, ctx.now(), SILENT_AFTER,
                                     me=ctx.worker_id, written_at=last.at)
                ))  # fmt: skip
            cause = "stopped" if last.kind == "step.stopped" else "interrupted"
            if step.probe is None:
                raise await _needs_attention(call, why, cause)
            return await _probe(call, why, cause)
    elif last.kind == "step.probed":  # it said not done: the step runs again
        call.at_attempt(last.attempt + 1)
    elif last.kind == "step.retry" and said.get("probe"):  # an operator: ask again
        call.at_attempt(last.attempt)
        return await _probe(call, "the probe was asked again by an operator", "probe")
    elif last.kind in ("step.attempt_failed", "step.retry"):
        call.at_attempt(last.attempt + 1)
        retry_at = (ctx.data(last) or {}).get("retry_at")
        if retry_at is not None and retry_at > ctx.now():
            await _backoff(call, retry_at)
    return None


async def _probe(call: StepCall, why: str, cause: str) -> Entry | None:
    """Ask the step's probe whether its interrupted attempt's effect happened (`why`: how it
    was interrupted) and act on the answer, journaled first (engine/probes.py): done, its
    outcome; not done, None (the step runs again, a new attempt); else the run parks."""
    ctx = call.ctx
    record = await probes.ask(ctx, call.step, call.info, call.args, call.kwargs, _step_info)
    if record["answer"] == "not_asked":  # nothing to ask for this call: as with no probe
        raise await _needs_attention(call, why, cause)
    probed = call.entry("step.probed", data=record)
    if record["answer"] == "done":
        value = {"value": record["value"], "probe": record["probe"]}
        outcome = call.entry("step.outcome", final=True, data=value)
        await ctx.write(probed, outcome)
        return outcome
    if record["answer"] == "not_done":
        ctx.buffer_entry(probed)  # committed with the next attempt's intent
        call.at_attempt(call.attempt + 1)
        return None
    raise await _needs_attention(call, f"{why}; {probes.said(record)}", "probe", probed)


async def _needs_attention(call: StepCall, reason: str, cause: str, *before: Entry) -> RunSuspended:
    """Park the run for a person: the step's `reason` journaled, kept on the run's row (its
    error: {type, message, step, position, cause}) for `perdure ls`, `stuck` and metrics,
    and told to observers once (an alert)."""
    ctx, step = call.ctx, call.step
    record = {"type": "perdure.NeedsAttention", "message": reason, "step": step.name,
              "position": call.pos, "cause": cause}  # fmt: skip
    signal = await ctx.suspend(
        NEEDS_ATTENTION,
        "needs_attention",
        *before,
        call.entry("step.needs_attention", data={"reason": reason}),
        fields={"error": json.dumps(record)},
    )
    options = "--value JSON | --retry | --fail" + (" | --probe" if step.probe else "")
    observers.run_parked(observers.ParkEvent(
        ctx.run_id, ctx.run.workflow, NEEDS_ATTENTION, cause, reason,
        f"perdure resolve {ctx.run_id} {call.pos} {options}", step.name, call.pos,
    ))  # fmt: skip
    return signal


# -- one attempt: intent, body, outcome ----------------------------------------------------


async def _attempt(call: StepCall) -> Any:
    """One attempt: its intent journaled (a `once` step's committed before its body may
    start), its body run, its outcome buffered; the value as replay gives it, or the
    exception the body failed with."""
    ctx, step = call.ctx, call.step
    effect = step.effect
    if ctx.state.hold:  # e.g. the worker began stopping during a retry backoff
        await ctx.hand_back_if_held()
    if effect == "transactional":
        return await _transactional(call)
    if effect != "read":
        data = f'{{"effect":"{effect}","key":{quoted(call.info.idempotency_key)}}}'
        intent = ctx.entry("step.intent", step.name, position=call.pos, attempt=call.attempt,
                           data_json=data)  # fmt: skip
        if effect == "once":  # on disk before the body, or recovery could not tell
            await ctx.write(intent, stop_if_requested=True)
            if not ctx.lease_holds():
                raise ctx.lease_ran_out(step.name)
        else:
            ctx.buffer_entry(intent)
    if ctx.commit_first:  # a once step's outcome is on disk before another body starts
        await ctx.flush()
    if ctx.state.hold or step.name in ctx.crash_after_intent:
        await _not_started(call)
    info = call.info
    if observers.watching:
        observers.step_started(ctx, info)
    ctx.executing[call.pos] = info
    own_thread = _running_loop() is None  # a sync workflow's own thread
    started = time.monotonic()
    try:
        if step.is_async or step.timeout is not None or not (own_thread or step.pace.on_loop):
            value = await _execute(call)
        else:
            token = _step_info.set(info)
            try:
                value = step.fn(*call.args, **call.kwargs)
            finally:
                _step_info.reset(token)
        data = to_json(value, step.result_where)
    except BaseException as exc:
        ctx.executing.pop(call.pos, None)  # the failure is recorded before any other await
        if not own_thread and step.pace.on_loop:
            step.pace.to_pool()  # it may need a thread of its own (engine/pace.py)
        return await _cut_off(call, exc, started)
    elapsed = time.monotonic() - started
    if elapsed > pace.SLOW and step.pace.on_loop and not own_thread:
        step.pace.slow(elapsed)
    if observers.watching:
        observers.step_finished(ctx, info, started)
    ms = round(elapsed * 1000, 3)
    outcome = ctx.entry("step.outcome", step.name, position=call.pos, attempt=call.attempt,
                        final=True, data_json=dumps_plain({"value": data, "ms": ms}))  # fmt: skip
    ctx.buffer_entry(outcome, commit_first=step.commit_first)
    ctx.executing.pop(call.pos, None)  # only now: a stop in between finds the outcome buffered
    if elapsed > LINGER or ctx.overdue():  # lost work stays bounded (context.py)
        await ctx.flush()
    return from_json(data, step.return_hint, step.where)


async def _execute(call: StepCall) -> Any:
    """A body that is awaited on the loop: an `async def` one, a `def` one on the step pool
    (timed, to learn whether it is short: engine/pace.py), and any with a timeout."""
    await to_loop()  # from a sync workflow's thread, the loop runs the rest
    ctx, step = call.ctx, call.step
    token = _step_info.set(call.info)
    try:
        if step.is_async:
            running = step.fn(*call.args, **call.kwargs)
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


async def _transactional(call: StepCall) -> Any:
    """A transactional attempt: the body runs inside the store transaction that also
    records its outcome, so there is no intent and nothing to recover."""
    ctx, step, info = call.ctx, call.step, call.info

    def body(conn: Any) -> str:
        info.db = conn
        token = _step_info.set(info)
        try:
            value = step.fn(*call.args, **call.kwargs)
        finally:
            _step_info.reset(token)
        return dumps_plain({"value": to_json(value, step.result_where)})

    entry = call.entry("step.outcome", final=True)
    observers.step_started(ctx, info)
    started = time.monotonic()
    result = await ctx.write(entry, body=body)
    observers.step_finished(ctx, info, started, result.tx_error)
    if result.tx_error is not None:
        ctx.by_position[call.pos].remove(entry)
        return result.tx_error
    value = ctx.data(Entry(kind="", data=result.tx_data)).get("value")
    return from_json(value, step.return_hint, step.where)


async def _not_started(call: StepCall) -> None:
    """Unwind before the body: hand the run back (stopping) or crash (injected)."""
    ctx = call.ctx
    if ctx.state.hold:  # the worker began stopping meanwhile: the body must not start
        await _withdraw(call)
    await ctx.flush()
    raise SimulatedCrash(f"crash injected before the outcome of step {call.step.name!r}")


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


async def _cut_off(call: StepCall, exc: BaseException, started: float) -> Any:
    """A body ended by `exc` (no longer counted as executing): a suspension, a cancellation
    or anything not an Exception unwinds; an operator's abort (pause --now) is journaled and
    the step recovered by its effect; an Exception is given back for `_retry`."""
    ctx = call.ctx
    if isinstance(exc, (Exception, RunSuspended, asyncio.CancelledError, aborts.CallAborted)):
        observers.step_finished(ctx, call.info, started, exc)
    if isinstance(exc, aborts.CallAborted):
        await ctx.write(aborts.stopped_entry(ctx, call.info, exc))
        return await run_step(StepCall(ctx, call.step, call.pos, call.args, call.kwargs))
    if not isinstance(exc, Exception):
        raise exc
    return exc


# -- after a failed attempt: retry, park or record the failure ------------------------------


async def _retry(call: StepCall, failure: BaseException) -> Any:
    """Given a failed attempt: the next attempt's outcome, per the retry policy; or the run
    parked (ParkRun), or the failure recorded and raised to the workflow."""
    ctx, step = call.ctx, call.step
    if isinstance(failure, ParkRun):
        raise await _park(call, failure)
    counted = call.attempt - _parked(call)  # an operator's fix gives the policy a fresh start
    if isinstance(failure, PayloadError) or not step.retry.should_retry(failure, counted):
        record = error_record(failure)
        ctx.buffer_entry(
            call.entry("step.outcome", final=True, data={"error": record}),
            commit_first=step.commit_first,
        )
        if ctx.overdue():
            await ctx.flush()
        raise recorded_error(step.name, record, call.attempt) from failure
    retry_at = ctx.now() + step.retry.delay(counted, error=failure)
    observers.step_retry(ctx, step, call.pos, call.attempt, retry_at - ctx.now(), failure)
    failed = call.entry(
        "step.attempt_failed", data={"error": error_record(failure), "retry_at": retry_at}
    )
    if step.effect == "once":
        await ctx.write(failed)  # a crash now must not look like a crash mid-effect
    else:
        ctx.buffer_entry(failed)
    await _backoff(call, retry_at)
    call.at_attempt(call.attempt + 1)
    return await _attempt(call)


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
    ctx, record = call.ctx, error_record(exc)
    entry = call.entry("step.attempt_failed", data={"error": record, "parked": True})
    reason = json.dumps({"type": record["type"], "message": record["message"]})
    signal = await ctx.suspend(PAUSED, "paused", entry, fields={"error": reason})
    observers.run_parked(observers.ParkEvent(
        ctx.run_id, ctx.run.workflow, PAUSED, "parked", " ".join(record["message"].split()),
        f"perdure resume {ctx.run_id}", call.step.name, call.pos,
    ))  # fmt: skip
    return signal


async def _backoff(call: StepCall, retry_at: float) -> None:
    """Wait until `retry_at`: in process if short, else park the run on a timer."""
    ctx = call.ctx
    delay = retry_at - ctx.now()
    if delay <= 0:
        return
    if delay <= ctx.inline_sleep and not ctx.state.hold:  # stopping: park it instead
        await ctx.flush()
        await to_loop()
        await asyncio.sleep(delay)
        return
    fields = {"wake_at": retry_at, "waiting_for": f"retry:{call.step.name}"}
    raise await ctx.suspend(SLEEPING, "retry backoff", fields=fields)
