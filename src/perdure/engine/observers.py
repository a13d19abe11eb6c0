"""Observers: what the engine tells logs, metrics and tracing, with no-op defaults.

The engine calls the functions here where runs and steps execute; they do
nothing until an observer is installed (`perdure.observe` installs them), so
the engine depends on no logging, metrics or tracing package. An observer that
raises is logged and skipped: a hook can never break a run.

    run_started / run_finished      one execution of a run by one worker (lease epoch)
    run_recovered                   a worker took over the expired lease of another
    step_started / step_finished    one attempt of a step that executes (never a replay)
    step_retry                      an attempt failed and another is scheduled
    step_recovered                  replay found a step cut between intent and outcome
    run_parked                      a run now waits for a person (once, when it parks)
    lease_lost                      a worker learnt that its lease was taken over

Layers above the engine report their own events through `emit` (the triggers'
`schedule_tick`, the agent's `model_usage`): an observer gets each event it has a
method for, and the engine knows none of their names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .state import Phase

if TYPE_CHECKING:
    from .context import RunContext, StepInfo
    from .registry import StepDef

log = logging.getLogger("perdure.observers")


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One execution of a run; `outcome` and `seconds` are set when it ends."""

    run_id: str
    workflow: str
    worker: str
    epoch: int
    queue: str = "default"
    recovered_from: str | None = None
    outcome: str = ""  # completed | failed | cancelled | suspended | released | lost | stopped
    seconds: float = 0.0
    error: str | None = None  # failed: the error recorded ("type: message")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One attempt of a step; `outcome` (ok | error), `seconds` and `error` when it ends."""

    run_id: str
    workflow: str
    worker: str
    epoch: int
    name: str
    position: int
    attempt: int
    effect: str
    outcome: str = ""
    seconds: float = 0.0
    error: str | None = None  # the exception's type name
    delay: float = 0.0  # step_retry: seconds until the next attempt
    action: str = ""  # step_recovered: rerun | needs_attention


@dataclass(frozen=True, slots=True)
class ParkEvent:
    """A run that now waits for a person: its status (needs_attention, dead, or paused by a
    step), why in one line, `cause` for a low-cardinality label, and the command that
    moves it."""

    run_id: str
    workflow: str
    status: str
    cause: str  # interrupted | stopped | probe | dead | parked
    reason: str
    fix: str
    step: str | None = None
    position: int | None = None


class Observer:
    """Override the events you need; every method of the base does nothing."""

    def run_started(self, event: RunEvent) -> None: ...
    def run_finished(self, event: RunEvent) -> None: ...
    def run_recovered(self, run_id: str, worker: str, previous: str) -> None: ...
    def step_started(self, event: StepEvent) -> None: ...
    def step_finished(self, event: StepEvent) -> None: ...
    def step_retry(self, event: StepEvent) -> None: ...
    def step_recovered(self, event: StepEvent) -> None: ...
    def run_parked(self, event: ParkEvent) -> None: ...
    def lease_lost(self, run_id: str, worker: str, how: str) -> None: ...


watching: tuple[Observer, ...] = ()


def install(observer: Observer) -> None:
    """Add an observer for this process (once; installing it again does nothing)."""
    global watching
    if observer not in watching:
        watching = (*watching, observer)


def uninstall(observer: Observer) -> None:
    global watching
    watching = tuple(o for o in watching if o is not observer)


def installed() -> tuple[Observer, ...]:
    return watching


def emit(method: str, *args: Any) -> None:
    """Call `method(*args)` on every installed observer that has it (layers above the
    engine report their events this way); one that raises is logged and skipped."""
    for observer in watching:
        handler = getattr(observer, method, None)
        if handler is None:
            continue
        try:
            handler(*args)
        except Exception as exc:  # an observer must never break a run
            log.warning("observer %s failed in %s: %r", type(observer).__name__, method, exc)


# -- called by the engine ------------------------------------------------------------------


def _run(ctx: RunContext, **more: Any) -> RunEvent:
    run = ctx.run
    return RunEvent(run.id, run.workflow, ctx.worker_id, ctx.epoch, run.queue, **more)


def run_started(ctx: RunContext, recovered_from: str | None) -> float:
    """A worker starts executing a claimed run; returns the start time for `run_finished`."""
    if watching:
        emit("run_started", _run(ctx, recovered_from=recovered_from))
    return time.monotonic()


def run_finished(ctx: RunContext, outcome: str, started: float) -> None:
    if watching:
        if ctx.state.phase is Phase.LOST and outcome in ("stopped", "crashed"):
            outcome = "lost"
        error = ctx.failure if outcome == "failed" else None
        seconds = time.monotonic() - started
        emit("run_finished", _run(ctx, outcome=outcome, seconds=seconds, error=error))


def run_recovered(run_id: str, worker: str, previous: str) -> None:
    if watching:
        emit("run_recovered", run_id, worker, previous)


def _step(
    ctx: RunContext, name: str, pos: int, attempt: int, effect: str, **more: Any
) -> StepEvent:
    run = ctx.run
    return StepEvent(
        run.id, run.workflow, ctx.worker_id, ctx.epoch, name, pos, attempt, effect, **more
    )


def step_started(ctx: RunContext, info: StepInfo) -> None:
    if watching:
        emit("step_started", _step(ctx, info.name, info.position, info.attempt, info.effect))


def step_finished(
    ctx: RunContext, info: StepInfo, started: float, error: BaseException | None = None
) -> None:
    """An attempt ended: `error` is what it raised (None: it returned)."""
    if watching:
        event = _step(
            ctx, info.name, info.position, info.attempt, info.effect,
            outcome="ok" if error is None else "error",
            seconds=time.monotonic() - started,
            error=None if error is None else type(error).__name__,
        )  # fmt: skip
        emit("step_finished", event)


def step_retry(
    ctx: RunContext, step: StepDef, pos: int, attempt: int, delay: float, error: BaseException
) -> None:
    if watching:
        event = _step(
            ctx, step.name, pos, attempt, step.effect, outcome="error", delay=delay,
            error=type(error).__name__,
        )  # fmt: skip
        emit("step_retry", event)


def step_recovered(ctx: RunContext, step: StepDef, pos: int, attempt: int, action: str) -> None:
    if watching:
        emit("step_recovered", _step(ctx, step.name, pos, attempt, step.effect, action=action))


def run_parked(event: ParkEvent) -> None:
    if watching:
        emit("run_parked", event)


def lease_lost(run_id: str, worker: str, how: str) -> None:
    if watching:
        emit("lease_lost", run_id, worker, how)


# -- read by log processors ------------------------------------------------------------------


def log_fields() -> dict[str, Any]:
    """The run (and step) the calling code executes for: run_id, workflow, worker, epoch, and
    inside a step step, position, attempt. Empty outside a run."""
    from .context import current
    from .steps import _step_info

    ctx = current()
    if ctx is None:
        return {}
    fields: dict[str, Any] = {
        "run_id": ctx.run_id,
        "workflow": ctx.run.workflow,
        "worker": ctx.worker_id,
        "epoch": ctx.epoch,
    }
    info = _step_info.get()
    if info is not None and info.run_id == ctx.run_id:
        fields.update(step=info.name, position=info.position, attempt=info.attempt)
    return fields
