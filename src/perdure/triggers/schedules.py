"""Schedules: cron expressions and fixed intervals that start runs, exactly once per tick.

A schedule lives in the store, not in one process: every worker runs the
scheduler, and a tick is handled by whichever worker first moves the
schedule's `next_fire` on (a compare-and-set in one transaction with the tick
records and the run it starts). The tick's run id, `sched:{name}:{UTC time}`,
is unique, so a tick can never start two runs however many workers race.

Cron schedules follow the wall clock of their time zone: each local time fires
once, a time skipped by a spring-forward fires as if the clock had not jumped
(02:30 becomes 03:30), and a time repeated by a fall-back fires once (its
first occurrence). Interval
schedules tick every N seconds of real time, aligned to the Unix epoch.

Nothing is silent: every tick that does not start a run is recorded with its
reason (missed while no worker ran, skipped by a policy or a pause, queued
behind a running one) and shown by `perdure schedules show`.

A run parked for an operator (`needs_attention`, or paused) holds its schedule
like a running one: `overlap="skip"` keeps skipping and `"queue"` keeps queueing
until it is resolved or resumed, so runs never pile up behind an operator's
problem. That is never silent either: each tick held back says why ("previous
run ... needs attention"), and `perdure stuck` lists the schedule as blocked,
with the run and the command that frees it (`blocked` below). A dead run has
ended (for now): it holds nothing.

A run that a step of its own paused for an operator's fix (`ParkRun`: a model
provider refusing the agent's key) blocks its workflow: every schedule of that
workflow, whatever its overlap policy, skips its ticks ("blocked: run ... is
parked: ...") rather than start runs that would stop at the same place, and
ticks again once the run is resumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..engine import observers
from ..engine.client import origin_entry
from ..engine.signal import Signal
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError, StoreError
from ..store.base import (
    NEEDS_ATTENTION,
    PAUSED,
    RUNNING,
    NewRun,
    RunRow,
)
from .schedule_sql import ScheduleAdvance, ScheduleRow, Schedules, TickRow

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime
    from ..engine.worker import Worker

log = logging.getLogger("perdure.schedules")

CATCHUP = ("skip", "latest", "all")
OVERLAP = ("skip", "queue", "allow", "cancel_previous")
ENUMERATE_LIMIT = 10_000  # ticks looked at one by one in a pass; beyond, summarised in one record
QUEUE_LIMIT = 100  # queued ticks kept per schedule (overlap="queue"); beyond, skipped
LONGEST_WAIT = 1.0  # seconds: a scheduler re-reads the store at least this often


def run_id_for(name: str, fire_at: float) -> str:
    """The run id of a tick: the schedule's name and the tick's UTC time, to the second."""
    stamp = datetime.fromtimestamp(fire_at, UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond:06d}"
    return f"sched:{name}:{text}Z"


def _zone(tz: str, where: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{where}: unknown time zone {tz!r} (e.g. 'UTC', 'Europe/Paris')"
        ) from None


def next_tick(row: ScheduleRow, after: float) -> float:
    """The first tick of `row` strictly after `after` (a UTC timestamp)."""
    if row.every is not None:
        return (math.floor(after / row.every) + 1) * row.every
    from croniter import croniter

    zone = _zone(row.tz, f"schedule {row.name!r}")
    local = datetime.fromtimestamp(after, zone).replace(tzinfo=None)
    it = croniter(row.cron or "", local)
    while True:  # naive wall-clock ticks; each maps to its first real occurrence
        tick = it.get_next(datetime).replace(tzinfo=zone, fold=0).timestamp()
        if tick > after:
            return float(tick)


def upcoming(row: ScheduleRow, count: int, after: float) -> list[float]:
    """The next `count` fire times after `after` (UTC timestamps, before jitter)."""
    out: list[float] = []
    t = after
    for _ in range(count):
        t = next_tick(row, t)
        out.append(t)
    return out


def jitter_of(row: ScheduleRow, fire_at: float) -> float:
    """This tick's delay in [0, jitter): from a hash, so every worker agrees on it."""
    if row.jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{row.name}:{fire_at!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * row.jitter


@dataclass(kw_only=True)
class Schedule:
    """A schedule declared in code (see `App.schedule`); stored when a worker starts."""

    name: str
    workflow: str
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    catchup: str = "latest"
    catchup_limit: int = 10
    overlap: str = "skip"
    jitter: float = 0.0
    grace: float = 60.0


def validate(row: ScheduleRow) -> ScheduleRow:
    """Check a schedule's definition; a ConfigError names what is wrong and how to fix it."""
    where = f"schedule {row.name!r}"
    if not row.name or any(c in row.name for c in ": \t\n"):
        raise ConfigError(f"{where}: a name needs at least one character and no ':' or spaces")
    if (row.cron is None) == (row.every is None):
        raise ConfigError(f"{where}: give exactly one of cron='...' or every=seconds")
    if row.cron is not None:
        from croniter import croniter

        if not croniter.is_valid(row.cron):
            raise ConfigError(
                f"{where}: {row.cron!r} is not a cron expression (e.g. '0 9 * * 1-5')"
            )
    if row.every is not None and not row.every > 0:
        raise ConfigError(f"{where}: every must be a positive number of seconds")
    _zone(row.tz, where)
    if row.catchup not in CATCHUP:
        raise ConfigError(f"{where}: catchup={row.catchup!r}; use one of {', '.join(CATCHUP)}")
    if row.overlap not in OVERLAP:
        raise ConfigError(f"{where}: overlap={row.overlap!r}; use one of {', '.join(OVERLAP)}")
    if row.catchup_limit < 1:
        raise ConfigError(f"{where}: catchup_limit must be at least 1")
    if row.jitter < 0 or row.grace < 0:
        raise ConfigError(f"{where}: jitter and grace must not be negative")
    return row


def _seconds(value: float | timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


def make_row(runtime: Runtime, s: Schedule, *, source: str, now: float) -> ScheduleRow:
    """The stored form of a declaration: timing checked, input encoded and type-checked."""
    from ..engine.client import checked_input

    row = validate(
        ScheduleRow(
            name=s.name,
            workflow=s.workflow,
            cron=s.cron,
            every=_seconds(s.every),
            tz=s.tz,
            catchup=s.catchup,
            catchup_limit=s.catchup_limit,
            overlap=s.overlap,
            jitter=s.jitter,
            grace=s.grace,
            source=source,
            created_at=now,
            updated_at=now,
        )
    )
    _, row.input = checked_input(runtime, s.workflow, s.args, s.kwargs, f"schedule {s.name!r}")
    row.next_fire = next_tick(row, now)
    return row


async def save(runtime: Runtime, row: ScheduleRow) -> ScheduleRow:
    """Store a schedule; its next tick is kept unless its timing changed (the store decides,
    atomically: many workers store the same declaration at start)."""
    return await Schedules(runtime.store).put_schedule(row, replace_state=False)


# -- one scheduler step ------------------------------------------------------------------------


@dataclass
class _Plan:
    fire: list[float] = field(default_factory=list)
    records: list[TickRow] = field(default_factory=list)


def _due(row: ScheduleRow, now: float) -> tuple[list[float], float | None, int]:
    """Ticks due by `now` (after jitter), the next tick not due, and how many more were
    skipped over uncounted (beyond ENUMERATE_LIMIT)."""
    due: list[float] = []
    t = row.next_fire
    while t is not None and t + jitter_of(row, t) <= now and len(due) < ENUMERATE_LIMIT:
        due.append(t)
        t = next_tick(row, t)
    beyond = 0
    if t is not None and t + jitter_of(row, t) <= now:  # a very long outage: jump ahead
        resume = next_tick(row, now - row.grace)
        if row.every is not None:
            beyond = int((resume - t) / row.every)
        t = resume
    return due, t, beyond


def _catchup(row: ScheduleRow, due: list[float], now: float, plan: _Plan) -> list[float]:
    """Which due ticks may fire: all on-time ones, and the late ones the policy allows."""
    late = [t for t in due if now - t > row.grace]
    on_time = [t for t in due if now - t <= row.grace]
    if row.catchup == "all":
        allowed = late[-row.catchup_limit :]
    elif row.catchup == "latest" and not on_time:
        allowed = late[-1:]
    else:
        allowed = []
    for t in late:
        if t not in allowed:
            why = f"late by {now - t:.0f}s (no worker ran it in time); catchup={row.catchup}"
            if row.catchup == "all":
                why += f" keeps the last {row.catchup_limit}"
            plan.records.append(TickRow(row.name, t, "missed", reason=why, at=now))
    return allowed + on_time


PARKED = (NEEDS_ATTENTION, PAUSED)  # unfinished, and moving again only when an operator acts
HOLDING = ("skip", "queue")  # the overlap policies a parked run holds back


def _holding(run: RunRow) -> str:
    """What the previous run is doing, as the reason for a tick held back behind it."""
    if run.status == NEEDS_ATTENTION:
        return "needs attention"
    if run.status == PAUSED:
        return "is paused"
    return f"is still {'running' if run.status == RUNNING else run.status}"


def _overlap(
    row: ScheduleRow,
    candidates: list[float],
    active: list[RunRow],
    queued: list[TickRow],
    now: float,
    plan: _Plan,
) -> list[str]:
    """Apply the overlap policy to the ticks allowed to fire; returns runs to cancel."""
    cancel: list[str] = []
    busy = [r.id for r in active]
    if row.overlap == "allow":
        plan.fire = candidates
    elif row.overlap == "cancel_previous":
        if candidates:
            cancel = busy
            for t in candidates[:-1]:
                plan.records.append(
                    TickRow(row.name, t, "skipped", reason="superseded by a later tick", at=now)
                )
            plan.fire = candidates[-1:]
    elif row.overlap == "skip":
        doing = _holding(active[0]) if active else "is still running"
        for t in candidates:
            if busy:
                why = f"previous run {busy[0]} {doing}; overlap=skip"
                if active and active[0].status in PARKED:
                    why += " skips until an operator acts (perdure stuck)"
                plan.records.append(TickRow(row.name, t, "skipped", reason=why, at=now))
            else:
                plan.fire.append(t)
                busy.append(run_id_for(row.name, t))
    else:  # queue: one at a time, oldest first
        waiting = sorted(q.fire_at for q in queued) + candidates
        if not busy and waiting:
            plan.fire.append(waiting.pop(0))
        why = "waiting for the previous run"
        if active and active[0].status in PARKED:
            why += f" {active[0].id}, which {_holding(active[0])} (perdure stuck)"
        for t in waiting[:QUEUE_LIMIT]:
            plan.records.append(TickRow(row.name, t, "queued", reason=why, at=now))
        for t in waiting[QUEUE_LIMIT:]:
            why = f"queue full ({QUEUE_LIMIT} ticks waiting); overlap=queue"
            plan.records.append(TickRow(row.name, t, "skipped", reason=why, at=now))
    return cancel


async def parked_itself(runtime: Runtime, workflow: str) -> RunRow | None:
    """A run of `workflow` that a step of its own paused for an operator's fix (a paused run
    with an error: `ParkRun`, e.g. a refused model key), if there is one."""
    paused = await runtime.store.list_runs(statuses=[PAUSED], workflow=workflow, limit=100)
    return next((run for run in paused if run.error is not None), None)


def _blocked_reason(run: RunRow) -> str:
    """Why a tick is skipped behind a run that parked itself: its reason, on one line."""
    try:
        said = str(json.loads(run.error or "{}").get("message", ""))
    except (ValueError, AttributeError):
        said = run.error or ""
    said = " ".join(said.split())[:300]
    return f"blocked: run {run.id} of {run.workflow} is parked: {said}"


def step(
    runtime: Runtime,
    row: ScheduleRow,
    now: float,
    active: list[RunRow],
    queued: list[TickRow],
    parked: RunRow | None = None,
) -> ScheduleAdvance:
    """What one scheduler pass does for a due schedule (pure: the store applies it);
    `parked`: a run of the workflow that parked itself, so no tick may start another."""
    due, next_fire, beyond = _due(row, now)
    plan = _Plan()
    if beyond:
        first = due[-1] if due else row.next_fire or now
        plan.records.append(
            TickRow(
                row.name,
                first + (row.every or 0.0) / 2,
                "missed",
                reason=f"{beyond} more ticks missed during a long outage (not listed one by one)",
                at=now,
            )
        )
    candidates = _catchup(row, due, now, plan)
    cancel: list[str] = []
    if parked is not None:
        why = _blocked_reason(parked)
        plan.records += [TickRow(row.name, t, "skipped", reason=why, at=now) for t in candidates]
    else:
        cancel = _overlap(row, candidates, active, queued, now, plan)
    new_runs = [_new_run(runtime, row, t, now) for t in plan.fire]
    for t, new in zip(plan.fire, new_runs, strict=True):
        plan.records.append(TickRow(row.name, t, "fired", run_id=new.id, at=now))
    return ScheduleAdvance(
        name=row.name,
        expected=row.next_fire,
        next_fire=next_fire,
        now=now,
        ticks=plan.records,
        new_runs=new_runs,
        cancel=cancel,
    )


def _new_run(runtime: Runtime, row: ScheduleRow, fire_at: float, now: float) -> NewRun:
    definition = runtime.workflows[row.workflow]
    run_id = run_id_for(row.name, fire_at)
    origin = origin_entry({"schedule": row.name, "tick": _iso(fire_at)}, now)
    return NewRun(
        id=run_id,
        workflow=row.workflow,
        input=row.input,
        code_version=definition.version,
        now=now,
        deadline_at=None if definition.deadline is None else now + definition.deadline,
        queue=definition.queue,
        entries=[origin],
    )


# -- the service --------------------------------------------------------------------------------


class Scheduler:
    """The schedule trigger every worker runs: stores the app's declared schedules, then
    fires the ticks of every schedule in the store (declared in code or added)."""

    kind = "schedule"
    name = "scheduler"

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.declared: dict[str, Schedule] = {}
        # Woken by this process's schedule changes only (declare, pause, resume): every
        # store notification (each run finishing) would cost every worker a pass. Others'
        # changes are seen at the next re-read, at most LONGEST_WAIT later.
        self.wake = Signal()
        self._synced = False

    def declare(self, schedule: Schedule) -> None:
        if schedule.name in self.declared and self.declared[schedule.name] != schedule:
            raise ConfigError(f"two schedules are named {schedule.name!r}; pass name=... to one")
        self.declared[schedule.name] = schedule
        self._synced = False  # stored at the next pass
        self.wake.fire()

    async def sync(self, now: float) -> None:
        """Store every declared schedule (a changed timing restarts from the next tick)."""
        for s in self.declared.values():
            await save(self.runtime, make_row(self.runtime, s, source="code", now=now))
        self._synced = True

    async def run_pass(self, now: float) -> int:
        """Handle every due schedule once; returns how many runs were started."""
        if not self._synced:
            await self.sync(now)
        started = 0
        table = Schedules(self.runtime.store)
        for row in await table.due_schedules(now):
            if row.workflow not in self.runtime.workflows:
                continue  # a worker that has this workflow's code will handle it
            prefix = f"sched:{row.name}:"
            active = await table.active_runs(prefix)
            queued = (
                await table.schedule_ticks(row.name, statuses=["queued"], limit=1000)
                if row.overlap == "queue"
                else []
            )
            own = [r for r in active if r.status == PAUSED and r.error is not None]
            parked = own[0] if own else await parked_itself(self.runtime, row.workflow)
            advance = step(self.runtime, row, now, active, queued, parked)
            if not (advance.ticks or advance.cancel) and advance.next_fire == row.next_fire:
                continue
            if await table.advance_schedule(advance):
                started += len(advance.new_runs)
                was_queued = {q.fire_at for q in queued}  # counted when first queued
                for tick in advance.ticks:
                    if not (tick.status == "queued" and tick.fire_at in was_queued):
                        observers.emit(
                            "schedule_tick", row.name, tick.status
                        )  # fired|missed|skipped|queued
                    if tick.status != "fired":
                        log.info("schedule %s: tick %s %s (%s)", row.name, tick.fire_at,
                                 tick.status, tick.reason)  # fmt: skip
        return started

    async def run(self, worker: Worker) -> None:
        self.wake.listen()
        while not worker.stopping.is_set():
            try:
                await self.run_pass(worker.clock.now())
                nxt = await Schedules(self.runtime.store).next_schedule_fire()
            except StoreError as exc:
                log.warning("worker %s: scheduler pass failed (%s)", worker.id, exc)
                nxt = None
            wait = LONGEST_WAIT
            if nxt is not None:
                wait = min(wait, max(0.0, nxt - worker.clock.now()) + 0.001)
            await self.wake.wait(wait)

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        """A row per schedule in the store, then per declared one not stored yet."""
        now = runtime.clock.now()
        out = []
        for row in await Schedules(runtime.store).list_schedules():
            missed = await Schedules(runtime.store).schedule_ticks(
                row.name, statuses=["missed"], limit=1
            )
            error = f"tick missed: {missed[0].reason}" if missed and missed[0].reason else None
            late = None if row.paused or row.next_fire is None else max(0.0, now - row.next_fire)
            out.append(TriggerStatus("schedule", row.name, row.workflow,
                                     "paused" if row.paused else "active", late, error,
                                     f"{_timing(row)} ({row.source})"))  # fmt: skip
        stored = {t.name for t in out}
        for s in self.declared.values():
            if s.name not in stored:
                out.append(TriggerStatus("schedule", s.name, s.workflow, "not stored", None,
                                         "stored when a worker starts",
                                         f"{_timing(s)} (code)"))  # fmt: skip
        return out


def _timing(s: Schedule | ScheduleRow) -> str:
    return f"cron {s.cron} {s.tz}" if s.cron else f"every {s.every:g}s"


def scheduler_of(runtime: Runtime) -> Scheduler:
    """The runtime's scheduler, created (and kept with its triggers) on first use."""
    found = runtime.triggers.find(Scheduler, Scheduler.name)
    return found if found is not None else runtime.triggers.add(Scheduler(runtime))


def declare_schedule(
    runtime: Runtime,
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

    Returns:
        The declared `Schedule` when `workflow` is given, else a decorator.
    """

    def declare(target: Workflow[..., Any] | str) -> Schedule:
        wf_name = target if isinstance(target, str) else target.name
        s = Schedule(
            name=name or wf_name,
            workflow=wf_name,
            cron=cron,
            every=_seconds(every),
            tz=tz,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            catchup=catchup,
            catchup_limit=catchup_limit,
            overlap=overlap,
            jitter=_seconds(jitter) or 0.0,
            grace=_seconds(grace) or 0.0,
        )
        validate(
            ScheduleRow(
                name=s.name, workflow=s.workflow, cron=s.cron, every=s.every, tz=s.tz,
                catchup=s.catchup, catchup_limit=s.catchup_limit, overlap=s.overlap,
                jitter=s.jitter, grace=s.grace,
            )
        )  # fmt: skip
        scheduler_of(runtime).declare(s)
        return s

    if workflow is not None:
        return declare(workflow)

    def decorator(target: Workflow[..., Any]) -> Workflow[..., Any]:
        declare(target)
        return target

    return decorator


# -- operating schedules (App methods and the CLI call these) ----------------------------------


async def add(runtime: Runtime, schedule: Schedule) -> ScheduleRow:
    """Store a schedule made outside code (CLI, API); it lives until deleted."""
    row = await save(runtime, make_row(runtime, schedule, source="api", now=runtime.clock.now()))
    scheduler_of(runtime).wake.fire()
    return row


async def get(runtime: Runtime, name: str) -> ScheduleRow:
    row = await Schedules(runtime.store).get_schedule(name)
    if row is None:
        known = ", ".join(r.name for r in await Schedules(runtime.store).list_schedules()) or "none"
        raise ConfigError(f"no schedule named {name!r} (known: {known})")
    return row


async def pause(runtime: Runtime, name: str) -> ScheduleRow:
    """Stop firing at once; ticks until `resume` are recorded as skipped then."""
    await get(runtime, name)
    # at once: a scheduler reads only unpaused schedules
    return await Schedules(runtime.store).set_schedule_paused(name, True, runtime.clock.now(), None)


async def resume(runtime: Runtime, name: str) -> ScheduleRow:
    """Fire again from the next tick; the ticks passed while paused are recorded as skipped."""
    row = await get(runtime, name)
    if not row.paused:
        return row
    now = runtime.clock.now()
    nxt = next_tick(row, now)
    first = row.next_fire  # the first tick the pause held back
    await Schedules(runtime.store).set_schedule_paused(name, False, now, nxt)
    skipped: list[float] = []
    t = first if first is not None and first < nxt else None
    while t is not None and t < nxt and len(skipped) < ENUMERATE_LIMIT:
        skipped.append(t)
        t = next_tick(row, t)
    if skipped:
        span = f"{_iso(skipped[0])} to {_iso(skipped[-1])}"
        why = f"{len(skipped)} tick(s) passed while the schedule was paused ({span})"
        tick = TickRow(name, skipped[0], "skipped", reason=why, at=now)
        await Schedules(runtime.store).advance_schedule(
            ScheduleAdvance(name=name, expected=nxt, next_fire=nxt, now=now, ticks=[tick])
        )
    scheduler_of(runtime).wake.fire()
    return await get(runtime, name)


async def delete(runtime: Runtime, name: str) -> None:
    await get(runtime, name)
    await Schedules(runtime.store).delete_schedule(name)
    scheduler_of(runtime).declared.pop(name, None)


@dataclass(frozen=True)
class Blocked:
    """A schedule held back by a run of its own that waits for an operator."""

    schedule: str
    run_id: str
    status: str  # needs_attention or paused
    since: float  # when the run was last updated (when it parked)
    held: int  # ticks skipped or queued behind it so far (of the last 1000 recorded)
    fix: str  # the command that lets the run, and so the schedule, move again


async def blocked(runtime: Runtime) -> list[Blocked]:
    """Schedules whose overlap policy (skip, queue) holds them behind a parked run, or whose
    workflow a run parked itself blocks: each with the run and the command that frees it
    (what `perdure stuck` lists)."""
    found: list[Blocked] = []
    for row in await Schedules(runtime.store).list_schedules():
        run = None
        if row.overlap in HOLDING:
            active = await Schedules(runtime.store).active_runs(f"sched:{row.name}:")
            run = active[0] if active and active[0].status in PARKED else None
        if run is None:  # any policy: a run of the workflow that parked itself blocks it
            run = await parked_itself(runtime, row.workflow)
        if run is None:
            continue
        if run.status == NEEDS_ATTENTION:
            parked = [
                e for e in await runtime.store.journal(run.id) if e.kind == "step.needs_attention"
            ]
            step = (parked[-1].name or str(parked[-1].position)) if parked else "STEP"
            fix = f"perdure resolve {run.id} {step} --value JSON | --retry | --fail"
        else:
            fix = f"perdure resume {run.id}"
        ticks = await Schedules(runtime.store).schedule_ticks(
            row.name, statuses=["skipped", "queued"], limit=1000
        )
        held = sum(1 for t in ticks if run.id in (t.reason or ""))
        found.append(Blocked(row.name, run.id, run.status, run.updated_at, held, fix))
    return found


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
