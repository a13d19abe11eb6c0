"""The async core of every client operation: start, inspect, signal and steer runs.

The sync methods of `App` and `RunHandle`, the triggers, the CLI and tests all go through
here. A Client wraps the engine's `Runtime` (never the App).
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import (
    ConfigError,
    PerdureError,
    RunFailed,
    RunNotFound,
    StoreError,
    StoreUnavailable,
    WaitTimeout,
)
from ..store import waits
from ..store.base import (
    COMPLETED,
    DEAD,
    FAILED,
    FINISHED,
    NEEDS_ATTENTION,
    PAUSED,
    PENDING,
    RUNNING,
    SLEEPING,
    TERMINAL,
    WAITING,
    Append,
    Entry,
    NewRun,
    RunRow,
    Store,
)
from ..store.blobs import blob_ref, in_row_or_blob
from ..store.names import check_run_id
from ..store.roles import WriteLock
from .codec import dumps, from_json, loads
from .registry import WorkflowDef, typed_arguments

if TYPE_CHECKING:
    from ..store.roles import Runs
    from .retention import GcReport
    from .runtime import HasRuntime, Runtime


def origin_entry(origin: dict[str, Any], now: float) -> Entry:
    """The journal's `run.origin` entry: what started the run (its first key names the
    kind: schedule, event, webhook, inbox, plan, fork, parent)."""
    return Entry(kind="run.origin", data=dumps(origin, "run origin"), at=now)


class Named(Protocol):
    """Anything with a workflow name (a `Workflow`)."""

    @property
    def name(self) -> str: ...


def origin_of(entries: Sequence[Entry]) -> dict[str, Any]:
    """What started a run, from its journal's `run.origin` entry ({}: a client call)."""
    for entry in entries:
        if entry.kind == "run.origin" and entry.data:
            found = json.loads(entry.data)
            return found if isinstance(found, dict) else {}
    return {}


IDS_PER_QUERY = 500  # run ids per store query (SQL parameter limits)
CONTINUED = "continued:"  # waiting_for of a run that ended by continue_as_new
MAX_LINEAGE_HOPS = 100_000  # a guard against a cycle of links, which the engine never makes


def continued_as(run: RunRow) -> str | None:
    """The run this one continued as, if it did."""
    if run.status == COMPLETED and (run.waiting_for or "").startswith(CONTINUED):
        return (run.waiting_for or "")[len(CONTINUED) :]
    return None


async def last_of_lineage(store: Runs, run: RunRow) -> RunRow:
    """Follow `continued_as` links from `run` to the lineage's latest run."""
    for _ in range(MAX_LINEAGE_HOPS):
        nxt = continued_as(run)
        if nxt is None:
            return run
        found = await store.get_run(nxt)
        if found is None:  # deleted by retention: the link's end is what is left
            return run
        run = found
    raise PerdureError(f"run {run.id!r}: its continue_as_new lineage does not end")


async def unblob_text(store: Runs, text: str | None) -> str | None:
    """Follow a blob reference, if `text` is one."""
    key = blob_ref(text)
    return await store.get_blob(key) if key else text


async def run_outcome_json(store: Runs, run: RunRow) -> str:
    """A finished run's status, result and error as one JSON object (for parents)."""
    result = await unblob_text(store, run.result)
    error = loads(run.error)
    message = error.get("message") if isinstance(error, dict) else None
    return (
        f'{{"status":{json.dumps(run.status)},"result":{result or "null"},'
        f'"error":{json.dumps(message)}}}'
    )


def encode_input(workflow: str, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    return dumps({"args": list(args), "kwargs": kwargs}, f"input of workflow {workflow!r}")


def checked_input(
    runtime: Runtime, workflow: str, args: Sequence[Any], kwargs: dict[str, Any], where: str = ""
) -> tuple[WorkflowDef, str]:
    """The workflow and its input as JSON, refused now (before anything is recorded) if the
    workflow is unknown or the arguments do not fit it; `where` prefixes the message."""
    prefix = f"{where}: " if where else ""
    definition = runtime.workflows.get(workflow)
    if definition is None:
        raise ConfigError(
            f"{prefix}no workflow named {workflow!r} is registered "
            f"(known: {', '.join(sorted(runtime.workflows)) or 'none'})"
        )
    try:
        definition.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{prefix}workflow {workflow!r}: {exc}") from None
    encoded = encode_input(workflow, args, kwargs)
    plain = json.loads(encoded)
    typed_arguments(
        definition, plain["args"], plain["kwargs"], f"input of {where or f'workflow {workflow!r}'}"
    )
    return definition, encoded


class Client:
    """The async client: start, inspect, wait for and steer runs, by id, in an app's store.

    `app.client` is one (`perdure.Client(app)` makes another); every method is a
    coroutine, for async code where the App's blocking methods would stall the loop.
    """

    def __init__(self, app: Runtime | HasRuntime) -> None:
        from .runtime import runtime_of  # the runtime's own imports reach this module

        self.runtime = runtime_of(app)

    @property
    def store(self) -> Store:
        return self.runtime.store

    async def start(
        self,
        workflow: str | Named,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> RunRow:
        """Create a run (or return the existing run with this id: idempotent start);
        `options` as for `start_run`."""
        run, _ = await self.start_run(workflow, args, kwargs, **options)
        return run

    async def start_run(
        self,
        workflow: str | Named,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        deadline: float | None = None,
        queue: str | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        origin: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[RunRow, bool]:
        """`start`, also saying whether this call created the run (False: it existed).
        `origin` says what started it (`{"event": trigger, "id": ...}`; see `current_run`).

        `timeout`: seconds to wait for the store (SQLite's one write lock) before raising
        StoreUnavailable, naming who holds the lock, with nothing written. None: the
        store's `busy_timeout` (60 s on SQLite; PostgreSQL has no global lock to wait for).
        """
        if not isinstance(workflow, str):
            workflow = workflow.name
        if run_id is not None:
            check_run_id(run_id)  # before any work; the store checks every run it creates too
        definition, encoded = checked_input(self.runtime, workflow, args, kwargs or {})
        if timeout is None:
            timeout = self.store.busy_timeout if isinstance(self.store, WriteLock) else None
        elif not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ConfigError(f"timeout={timeout!r}: give seconds greater than 0, or None")
        with waits.bounded(timeout):
            run, created, taken = await self._create(workflow, definition, encoded, run_id,
                                                     deadline, queue, priority, partition_key,
                                                     origin)  # fmt: skip
        if not created and run.workflow != workflow:
            raise PerdureError(
                f"run id {run.id!r} already names a run of workflow {run.workflow!r}, "
                f"not {workflow!r}"
            )
        if taken:
            self.runtime.notify_change()  # a worker of this process runs it: nothing to claim
        else:
            self.runtime.notify()
        return run, created

    async def _create(
        self, workflow: str, definition: WorkflowDef, encoded: str, run_id: str | None,
        deadline: float | None, queue: str | None, priority: int, partition_key: str | None,
        origin: dict[str, Any] | None,
    ) -> tuple[RunRow, bool, bool]:  # fmt: skip
        """Open the store and create the run (or find it): the store calls of a start. Where
        a worker of this process has a slot free on this loop and nothing else to run, the
        run is created claimed by it (one transaction, no claim): the third value says so."""
        await self.runtime.open_store()
        text, blob = in_row_or_blob(encoded, self.runtime.blob_threshold)
        now = self.runtime.clock.now()
        limit = deadline if deadline is not None else definition.deadline
        new = NewRun(
            id=run_id or uuid.uuid4().hex,
            workflow=workflow,
            input=text,
            code_version=definition.version,
            now=now,
            deadline_at=None if limit is None else now + limit,
            queue=queue or definition.queue,
            priority=priority,
            partition_key=partition_key,
        )
        if origin:
            new.entries.append(origin_entry(origin, now))
        if blob is not None:
            new.blobs.append(blob)
        taker = self.runtime.taker(workflow, new.queue, partition_key)
        if taker is None:
            return (*await self.store.create_run(new), False)
        new.lease = taker.lease_from(now)
        try:
            run, created = await self.store.create_run(new)
        except BaseException:
            await taker.adopt(None, False, unsure=True)
            raise
        taken = created and run.lease_owner == new.lease[0]
        await taker.adopt(run if taken else None, not new.entries)
        return run, created, taken

    async def latest(self, run_id: str) -> RunRow:
        """The run, or the last run of its lineage if it continued as a new one."""
        return await last_of_lineage(self.store, await self.get(run_id))

    async def get(self, run_id: str) -> RunRow:
        await self.runtime.open_store()
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    async def journal(self, run_id: str) -> list[Entry]:
        await self.get(run_id)
        return await self.store.journal(run_id)

    async def list_runs(
        self,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        ids: Sequence[str] = (),
        limit: int = 100,
    ) -> list[RunRow]:
        """Runs newest first, filtered by status, workflow and run ids (unknown ids are left
        out; `limit` still applies)."""
        await self.runtime.open_store()
        if isinstance(ids, str):
            raise ConfigError(f"ids={ids!r}: pass a list of run ids, not one string")
        if not ids:
            return await self.store.list_runs(statuses=statuses, workflow=workflow, limit=limit)
        wanted = list(dict.fromkeys(ids))
        found: list[RunRow] = []
        for start in range(0, len(wanted), IDS_PER_QUERY):
            found += await self.store.list_runs(
                statuses=statuses, workflow=workflow, limit=limit,
                ids=wanted[start : start + IDS_PER_QUERY],
            )  # fmt: skip
        found.sort(key=lambda r: (-r.created_at, r.id))
        return found[:limit]

    async def statuses(self, ids: Sequence[str]) -> dict[str, str | None]:
        """The status of each run id, in the order given; None for an id no run has."""
        rows = await self.list_runs(ids=ids, limit=max(1, len(ids)))
        by_id = {r.id: r.status for r in rows}
        return {run_id: by_id.get(run_id) for run_id in ids}

    async def stuck(self, grace: float = 60.0) -> list[tuple[RunRow, str]]:
        """Runs nobody has moved for `grace` seconds past their time, and runs waiting for a
        person (parked by a step, needs_attention, dead), each with the reason in full, its
        age and the command that moves it."""
        await self.runtime.open_store()
        now = self.runtime.clock.now()
        found = []
        paused = await self.paused_workflows()
        for run in await self.store.stuck(now, grace):
            if run.workflow in paused:  # held by an operator's pause: not stuck
                continue
            if run.status in (RUNNING, "cancelling"):
                why = (
                    f"lease of {run.lease_owner} expired {now - (run.lease_until or now):.0f}s "
                    "ago and no worker took it over"
                )
            elif run.status == PENDING:
                why = f"pending for {now - run.updated_at:.0f}s: is a worker for it running?"
            else:
                why = f"{run.status}: its timer was due {now - (run.wake_at or now):.0f}s ago"
            if run.workflow not in self.runtime.workflows and self.runtime.workflows:
                why += f" (workflow {run.workflow!r} is not registered in this app)"
            found.append((run, why))
        # waiting for a person: a step parked it (ParkRun: e.g. a refused model key), a once
        # step's effect is in doubt, or its recoveries kept killing workers (dead)
        for run in await self.store.list_runs(statuses=[PAUSED, NEEDS_ATTENTION, DEAD]):
            if run.status == PAUSED and run.error is None:
                continue  # paused by an operator: held, not stuck
            found.append((run, await self._waits_for_person(run, now)))
        return found

    async def _waits_for_person(self, run: RunRow, now: float) -> str:
        """Why `run` waits for a person, for how long, and the command that moves it."""
        record = json.loads(run.error) if run.error else {}
        if not isinstance(record, dict):
            record = {"message": run.error}
        said = " ".join(str(record.get("message", "")).split())
        age = _age(now - run.updated_at)
        if run.status == DEAD:
            return f"dead {age}: {said}; to revive it: perdure resume {run.id}"
        if run.status == PAUSED:  # the step's own message says what to fix, and how to go on
            return f"parked: {said}"
        if record.get("cause") == "version":  # engine/versions.py: it says what to deploy
            return f"waits for its code version {age}: {said}"
        step, position = record.get("step"), record.get("position")
        if step is None:  # parked before the run's row kept the reason: read the journal
            marks = [e for e in await self.store.journal(run.id)
                     if e.kind == "step.needs_attention"]  # fmt: skip
            if marks:
                step, position = marks[-1].name, marks[-1].position
                said = " ".join(str((json.loads(marks[-1].data or "{}")).get("reason")).split())
        definition = self.runtime.steps.get(str(step))
        options = "--value JSON | --retry | --fail"
        if (definition is not None and definition.probe is not None) or record.get(
            "cause"
        ) == "probe":  # its probe was asked: a process without the app's code knows it too
            options += " | --probe"
        return (f"needs attention {age} at step {position} ({step}): {said}; to settle it: "
                f"perdure resolve {run.id} {position} {options}")  # fmt: skip

    def write_lock_stall(self) -> str | None:
        """One line if the store's global write lock (SQLite) has been held so long that every
        writer is stalled, naming the holder; None if not, or if the store has no such lock.
        Cheap: reads one small record, and probes the lock only when that record is old."""
        return self.store.write_lock_stall() if isinstance(self.store, WriteLock) else None

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait for the run to finish; return its result or raise `RunFailed`. A run that
        continued as a new one (`continue_as_new`) is followed to its lineage's last run."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.005
        seen = self.runtime.changes()  # a change signalled before this read is not news
        run = self._held_here(run_id) or await self.get(run_id)
        while True:
            if run.status in TERMINAL:
                run = await last_of_lineage(self.store, run)
                run_id = run.id
                if run.status in TERMINAL:
                    break
            if deadline is not None and loop.time() >= deadline:
                raise WaitTimeout(f"run {run_id!r} is still {run.status} after {timeout}s")
            wait = delay if deadline is None else min(delay, max(0.0, deadline - loop.time()))
            await self.runtime.wait_change(wait, seen)
            delay = min(delay * 2, 0.25)
            seen = self.runtime.changes()
            run = self._known(run) or await self.get(run_id)
        if run.status != COMPLETED:
            error = loads(run.error)
            message = error.get("message") if isinstance(error, dict) else None
            raise RunFailed(run_id, run.status, message)
        definition = self.runtime.workflows.get(run.workflow)
        hint = definition.hints.get("return") if definition else None
        value = loads(await unblob_text(self.store, run.result))
        return from_json(value, hint, f"result of run {run_id!r}")

    def _known(self, run: RunRow) -> RunRow | None:
        """The run's row as this process knows it without a store read: its end if it ended
        here since `run` was read, or `run` itself while a worker here still executes it
        under a live lease (its end will be known here); None: read it."""
        ended = self.runtime.ended.get(run.id)
        if ended is not None and ended.updated_at >= run.updated_at:
            return ended
        return run if self._held_here(run.id) else None

    def _held_here(self, run_id: str) -> RunRow | None:
        """The row, as claimed, of a run a worker of this process executes under a lease
        that still runs; None otherwise (a worker whose lease lapsed may have lost the run
        to another process: read it then)."""
        claimed = self.runtime.claimed.get(run_id)
        if claimed is None:
            return None
        ctx = self.runtime.active.get(run_id)
        if ctx is not None:
            return claimed if ctx.lease_holds() else None
        until = claimed.lease_until
        return claimed if until is not None and self.runtime.clock.now() < until else None

    async def send_event(
        self, run_id: str, name: str, payload: Any = None, *, key: str | None = None
    ) -> int:
        """Deliver an event to a run; kept until the run's `wait_event(name)` consumes it.
        With `key`, a second delivery of the same event is ignored."""
        await self.runtime.open_store()
        text = dumps(payload, f"event {name!r} payload")  # the store checks the run exists
        run = await self.store.get_run(run_id)
        if run is not None and continued_as(run) is not None:  # to the lineage's live run
            run_id = (await last_of_lineage(self.store, run)).id
        event_id = await self.store.send_event(run_id, name, text, self.runtime.clock.now(), key)
        self.runtime.notify()
        return event_id

    async def paused_workflows(self) -> set[str]:
        """The workflows an operator paused (`perdure pause --workflow`)."""
        await self.runtime.open_store()
        return {name for scope, name, _ in await self.store.list_pauses() if scope == "workflow"}

    async def set_pause(self, scope: str, name: str, paused: bool, now: bool = False) -> bool:
        """Pause or resume a whole workflow or worker (id, or host for all its workers).

        Paused: its runs are not claimed, whatever their state (a sleeping or waiting
        run keeps its timer or event for later), and running ones stop at their next
        step and are handed back, keeping their state; with `now`, their abortable calls
        in flight are cut off first (engine/aborts.py). Resumed: they go on where they
        were. Runs held in this process are reached at once, others at their worker's
        next heartbeat (at most a second while busy).
        """
        from . import aborts

        if not name:
            raise ConfigError(f"pause: name the {scope}")
        await self.runtime.open_store()
        changed = await self.store.set_pause(
            scope, name, paused, self.runtime.clock.now(), abort=paused and now
        )
        if paused:
            host = socket.gethostname()  # the runs held in this process run on this host
            for ctx in list(self.runtime.active.values()):
                if (scope == "workflow" and ctx.run.workflow == name) or (
                    scope == "worker" and name in (ctx.worker_id, host)
                ):
                    ctx.update(hold=True)
                    if now:
                        aborts.request(ctx, True)
        self.runtime.notify()
        return changed

    async def cancel(self, run_id: str) -> str:
        """Cancel a run and its children: at once if parked, at the next boundary if running."""
        run = await self.get(run_id)
        if run.status in FINISHED:
            return run.status
        for touched in await self.store.cancel(run_id, self.runtime.clock.now()):
            ctx = self.runtime.active.get(touched)
            if ctx is not None:  # held by a worker in this process: reach it at once
                ctx.request_cancel()
        self.runtime.notify()
        return (await self.get(run_id)).status

    async def pause(self, run_id: str, now: bool = False) -> str:
        """Pause a run: at once if parked, at its next step if running; with `now`, its
        abortable calls in flight are cut off first (journaled aborted, re-run on resume
        under their effect's rule)."""
        from . import aborts

        run = await self.get(run_id)
        if run.status in (PENDING, SLEEPING, WAITING):
            await self._operator(
                run, "run.paused", status=PAUSED, expect=(PENDING, SLEEPING, WAITING)
            )
        elif run.status == RUNNING:
            await self._operator(
                run, "run.pause_requested", data='{"now":true}' if now else None,
                fields={"pause_requested": 2 if now else 1}, expect=(RUNNING,),
            )  # fmt: skip
            ctx = self.runtime.active.get(run_id)
            if ctx is not None:  # held by a worker in this process: stop at its next step
                ctx.update(pause=True)
                if now:
                    aborts.request(ctx, True)
        elif run.status != PAUSED:
            raise PerdureError(f"run {run_id!r} is {run.status}; it cannot be paused")
        return (await self.get(run_id)).status

    async def resume(self, run_id: str) -> str:
        """Resume a paused run (one a step parked runs that step again), withdraw a pause a
        running run has not reached yet, or give a dead run another replay from its journal
        (after fixing what crashed its recoveries)."""
        for _ in range(10):  # a worker may park the run between our read and our write
            run = await self.get(run_id)
            if run.status == DEAD:
                resumed = Entry(
                    kind="run.resumed", data='{"from":"dead"}', at=self.runtime.clock.now()
                )
                fields = {"error": None, "pause_requested": 0}
                if await self._append(run, [resumed], PENDING, fields, (DEAD,), conflict_ok=True):
                    break
            elif run.status == PAUSED:
                resumed = Entry(kind="run.resumed", at=self.runtime.clock.now())
                fields = {"pause_requested": 0, "error": None}  # a parking step's reason
                if await self._append(run, [resumed], PENDING, fields, (PAUSED,), conflict_ok=True):
                    break
            elif run.pause_requested:
                resumed = Entry(kind="run.resumed", at=self.runtime.clock.now())
                if await self._append(
                    run, [resumed], None, {"pause_requested": 0}, (RUNNING,), conflict_ok=True
                ):
                    ctx = self.runtime.active.get(run_id)
                    if ctx is not None:
                        ctx.update(pause=False)
                    break
            else:
                raise PerdureError(f"run {run_id!r} is {run.status}, not paused or dead")
        else:
            raise PerdureError(f"run {run_id!r} kept changing; resume it again")
        self.runtime.notify()
        return (await self.get(run_id)).status

    async def resolve(
        self,
        run_id: str,
        step: int | str,
        *,
        value: Any = None,
        has_value: bool = False,
        retry: bool = False,
        fail: bool = False,
        probe: bool = False,
    ) -> str:
        """Settle a `needs_attention` step: mark it done with a value, retry it, fail the run,
        or (`probe`) have the step's probe asked again (e.g. once the world it asks is back)
        by the worker that takes the run: done, the run goes on; not done, the step runs
        again; cannot tell, the run waits here again."""
        if sum((has_value, retry, fail, probe)) != 1:
            raise ConfigError("resolve: give exactly one of a value, retry, fail or probe")
        run = await self.get(run_id)
        if run.status != NEEDS_ATTENTION:
            raise PerdureError(f"run {run_id!r} is {run.status}, not needs_attention")
        entries = await self.store.journal(run_id)
        stuck = [e for e in entries if e.kind == "step.needs_attention"]
        target = next(
            (e for e in reversed(stuck) if step in (e.position, e.name, str(e.position))), None
        )
        if target is None:
            where = ", ".join(f"{e.position} ({e.name})" for e in stuck[-1:]) or "none"
            raise PerdureError(f"run {run_id!r} has no stuck step {step!r}; stuck: {where}")
        now = self.runtime.clock.now()
        if fail:
            error = json.dumps(
                {"type": "OperatorFailed", "message": f"failed by operator at step {target.name!r}"}
            )
            entry = Entry(kind="run.failed", name=target.name, data=error, at=now)
            await self._append(run, [entry], FAILED, {"error": error}, (NEEDS_ATTENTION,))
            return FAILED
        if retry or probe:
            definition = self.runtime.steps.get(target.name)
            if probe and definition is not None and definition.probe is None:
                raise ConfigError(
                    f"step {target.name!r} of run {run_id!r} has no probe: resolve it with a "
                    "value, retry or fail"
                )
            said = {"by": "operator", **({"probe": True} if probe else {})}
            entry = Entry(
                kind="step.retry",
                name=target.name,
                position=target.position,
                attempt=target.attempt,
                data=json.dumps(said),
                at=now,
            )
        else:
            data = dumps({"value": value, "resolved_by": "operator"}, "resolved value")
            entry = Entry(
                kind="step.outcome",
                name=target.name,
                position=target.position,
                attempt=target.attempt,
                data=data,
                final=True,
                at=now,
            )
        await self._append(run, [entry], PENDING, {"error": None}, (NEEDS_ATTENTION,))
        self.runtime.notify()
        return PENDING

    async def gc(self, *, batch: int = 200) -> GcReport:
        """Delete finished runs beyond their workflow's retention; one transaction per batch."""
        from .retention import collect

        return await collect(self.runtime, batch=batch)

    async def fork(self, run_id: str, from_step: int, new_id: str | None = None) -> RunRow:
        """A new run of the same workflow and input whose first `from_step` outcomes are R's."""
        run = await self.get(run_id)
        if from_step < 0:
            raise ConfigError("fork: --from-step must be 0 or more")
        journal = await self.store.journal(run_id)
        steps = 1 + max((e.position for e in journal if e.position is not None), default=-1)
        if from_step > steps:
            raise ConfigError(
                f"fork: --from-step {from_step} is past the end of run {run_id!r}: it has "
                f"{steps} step(s), so give 0 to {steps}"
            )
        definition = self.runtime.workflows.get(run.workflow)
        entries = [
            Entry(
                kind=e.kind,
                name=e.name,
                position=e.position,
                data=e.data,
                attempt=e.attempt,
                final=e.final,
                at=e.at,
            )
            for e in journal
            if e.position is not None and e.position < from_step
        ]
        now = self.runtime.clock.now()
        entries.insert(0, origin_entry({"fork": run_id, "from_step": from_step}, now))
        new = NewRun(
            id=new_id or f"{run_id}~fork-{uuid.uuid4().hex[:8]}",
            workflow=run.workflow,
            input=run.input,
            code_version=definition.version if definition else run.code_version,
            now=now,
            entries=entries,
        )
        forked, created = await self.store.create_run(new)
        if not created:
            raise PerdureError(f"fork: run id {new.id!r} already exists")
        self.runtime.notify()
        return forked

    async def _operator(
        self,
        run: RunRow,
        kind: str,
        *,
        status: str | None = None,
        fields: dict[str, Any] | None = None,
        expect: Sequence[str] | None = None,
        data: str | None = None,
    ) -> None:
        entry = Entry(kind=kind, data=data, at=self.runtime.clock.now())
        await self._append(run, [entry], status, fields or {}, expect)

    async def _append(
        self,
        run: RunRow,
        entries: list[Entry],
        status: str | None,
        fields: dict[str, Any],
        expect: Sequence[str] | None,
        *,
        conflict_ok: bool = False,
    ) -> bool:
        """An operator write, applied only if the run is still in `expect`.

        Returns False on a conflict when `conflict_ok`, else raises a one-line error.
        """
        try:
            await self.store.append(
                Append(
                    run_id=run.id,
                    epoch=None,
                    entries=entries,
                    status=status,
                    fields={"updated_at": self.runtime.clock.now(), **fields},
                    expect_status=expect,
                )
            )
        except StoreUnavailable:
            raise  # the store is away: no conflict was seen, say so
        except StoreError as exc:
            if conflict_ok:
                return False
            raise PerdureError(f"run {run.id!r} changed while acting on it: {exc}") from None
        return True


def _age(seconds: float) -> str:
    """How long something has waited, in the largest unit that fits ("for 3h")."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"for {seconds / size:.0f}{unit}"
    return f"for {seconds:.0f}s"
