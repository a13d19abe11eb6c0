"""The `/api/v1` endpoints of `perdure serve`, one table (`ENDPOINTS`) for routes and OpenAPI.

Every endpoint but `/readyz`, `/stuckz` and the OpenAPI document needs `Authorization:
Bearer <token>` (401 without a valid one) whose scopes allow the endpoint's
scope (403 otherwise): `read` to look, `operate` to start and steer runs,
`approve` to answer gates, `admin` for schedules and budgets. Operator actions
are done through `server.operations`, so the audit log holds every one, refused
ones too (a token without the scope is refused, and audited, before the body is
read). Run data in answers (input, result, error, journal data, step details, gate
arguments) is masked by `observe.redact`, as the CLI, the dashboard and MCP show
it. Errors are JSON `{"error": ..., "field": ...}`: 400/422 bad input (naming the
field), 404 unknown, 409 wrong state, 413 body over 1 MiB, 503 store unreachable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..app import App
from ..engine.client import checked_input
from ..engine.inspection import explain
from ..engine.origins import run_origins
from ..engine.peers import WorkerState, worker_states
from ..errors import ConfigError, PayloadError, PerdureError, RunNotFound, StoreUnavailable
from ..observe.redact import Redactor
from ..store.workers_sql import WorkerRow
from ..triggers import schedules as sched
from ..triggers.health_sql import FAILING, HealthRow, consumers_by_worker
from ..triggers.messages import MessageTrigger
from ..triggers.schedule_sql import ScheduleRow, Schedules
from . import answers, sse
from . import operations as ops
from .access import Principal, authenticate_request
from .access_sql import Access
from .answers import (
    USAGE_KEYS,
    audit_entry,
    entry_json,
    explanation,
    run_detail,
    run_summary,
    schedule_detail,
    schedule_json,
)
from .operations import Action, Forbidden, pending_gates, require
from .throttle import TooManyFailures
from .validation import (
    BIG,
    ID_CURSOR,
    RUN_CURSOR,
    Answer,
    BadInput,
    Body,
    ChoiceQuery,
    Comment,
    CursorQuery,
    Fork,
    IdRoute,
    IdsQuery,
    IntQuery,
    PauseRun,
    PutBudget,
    PutSchedule,
    Query,
    Resolve,
    SendEvent,
    SetPause,
    SinceQuery,
    StartRun,
    StatusQuery,
    SteerRun,
    TextQuery,
    TimeQuery,
    encode_cursor,
    id_cursor,
    parse_body,
    path_param,
    run_cursor,
    runs_page,
    segment,
)

log = logging.getLogger("perdure.server")

PREFIX = "/api/v1"
READY_TIMEOUT = 5.0  # seconds the store has to answer /readyz

# The query parameters: each handler reads its own with these, and the document says the same.
STATUS = StatusQuery(name="status", description="run states, comma-separated (or repeated)")
WORKFLOW = TextQuery(name="workflow", description="workflow name")
IDS = IdsQuery(name="id", most=500, description="only these runs (repeat: id=a&id=b); the "
               "answer's `missing` lists those no run has")  # fmt: skip
LIMIT = IntQuery(name="limit", default=50, low=1, high=500, description="page size")
RUNS_CURSOR = CursorQuery(name="cursor", pattern=RUN_CURSOR,
                          description="`next_cursor` of the previous page")  # fmt: skip
AFTER = IntQuery(name="after", default=-1, low=-1, high=BIG, description="only entries with a "
                 "greater seq")  # fmt: skip
ENTRIES = IntQuery(name="limit", default=1000, low=1, high=5000, description="entries")
RUN = TextQuery(name="run", required=True, description="the run's id")
NEXT = IntQuery(name="next", default=5, low=0, high=100, description="upcoming fire times")
TICKS = IntQuery(name="ticks", default=20, low=0, high=500, description="recent ticks")
AGENT = TextQuery(name="agent", description="one agent only")
SINCE = TimeQuery(name="since", description="Unix time (default: 7 days ago)")
BY = ChoiceQuery(name="by", choices=tuple(USAGE_KEYS), default="agent", description="group by")
CHECK = ChoiceQuery(name="check", choices=("true", "false"), default="true",
                    description="replay runs of other versions against this code")  # fmt: skip
# the audit log's (its handler reads them with the same bounds)
TARGET = TextQuery(name="target", description="e.g. run:ID, schedule:NAME")
AUDIT_RUN = TextQuery(name="run", description="a run's id (the target run:ID)")
ACTOR = TextQuery(name="actor", description="who acted, e.g. cli:alice@host1")
AUDIT_SINCE = SinceQuery(name="since", description="entries this recent: a duration "
                         "(1h, 7d), Unix seconds or an ISO time (UTC)")  # fmt: skip
GRACE = IntQuery(name="grace", default=60, low=0, high=BIG, description="seconds past its "
                 "time before a run nobody moves counts")  # fmt: skip
AUDIT_CURSOR = CursorQuery(name="cursor", pattern=ID_CURSOR,
                           description="`next_cursor` of the previous page")  # fmt: skip


@dataclass
class Call:
    """One request as a handler sees it: the app, who asks, the request, its parsed body."""

    app: App
    who: Principal | None
    request: Request
    body: Any = None

    @property
    def actor(self) -> Principal:
        assert self.who is not None  # handlers of endpoints with a scope only
        return self.who

    def path(self, name: str) -> str:
        return path_param(self.request, name)

    def workflow(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
        """`name`, if this server knows a workflow of that name (404 if not) whose signature
        and argument types `args` and `kwargs` fit (422, field `args`, if not: the one rule
        the OpenAPI document cannot state, as it knows no workflow)."""
        if name not in self.app.runtime.workflows:
            known = ", ".join(sorted(self.app.runtime.workflows)) or "none"
            raise BadInput(404, f"no workflow named {name!r} is registered (known: {known})",
                           "workflow")  # fmt: skip
        try:
            checked_input(self.app.runtime, name, args, kwargs)
        except (ConfigError, PayloadError) as exc:
            raise BadInput(422, f"args: {exc}", "args") from None
        return name


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """One operation: its route, the scope it needs (None: public) and what it documents."""

    method: str
    path: str
    handler: Handler
    scope: str | None
    summary: str
    body: type[Body] | None = None
    params: tuple[Query, ...] = ()  # query parameters (path parameters: PATH_PARAMS)
    returns: str = ""  # a schema of openapi.SCHEMAS for the success response
    status: int = 200
    errors: tuple[int, ...] = ()


# -- health and runs ----------------------------------------------------------------------------


async def _probe(app: App) -> None:
    await app.runtime.open_store()
    await app.runtime.store.list_runs(limit=1)


async def readyz(call: Call) -> Any:
    """Readiness: 200 once the store answers a query, 503 (and why, in the log) if not, if
    the store's write lock (SQLite) has been held so long that every writer is stalled, or
    if a message trigger is not consuming (a worker records its broker refusing it or out
    of reach, or, with no worker consuming, this process cannot reach it: naming the
    trigger and its state, never the broker). Runs waiting
    for a person leave it 200: the server can serve; `/stuckz` is the check for them."""
    stall = call.app.client.write_lock_stall()
    if stall is not None:
        log.warning("readyz: %s", stall)
        return JSONResponse({"ready": False, "error": stall}, 503)
    try:
        await asyncio.wait_for(_probe(call.app), READY_TIMEOUT)
    except Exception as exc:  # whatever stops the store answering means "not ready"
        log.warning("readyz: the store cannot be reached: %s", exc)
        return JSONResponse({"ready": False, "error": "the store cannot be reached"}, 503)
    triggers = call.app.runtime.triggers.of(MessageTrigger).values()
    for status in await asyncio.gather(*(t.probe(READY_TIMEOUT) for t in triggers)):
        if status["state"] in FAILING:
            said = f"message trigger {status['name']!r} is not consuming ({status['state']})"
            log.warning("readyz: %s: %s", said, status["last_error"])
            # public: the trigger's name and state only; the broker's words stay in the log
            return JSONResponse({"ready": False, "error": f"{said}; see perdure triggers"}, 503)
    return {"ready": True}


async def list_runs(call: Call) -> Any:
    request = call.request
    statuses = STATUS.read(request)
    workflow = WORKFLOW.read(request)
    limit = LIMIT.read(request)
    after = run_cursor(request)
    ids = IDS.read(request)
    await call.app.runtime.open_store()
    rows, following = await runs_page(call.app.runtime.store, statuses, workflow, after, limit, ids)
    cursor = None if following is None else encode_cursor(list(following))
    redactor = Redactor()
    now = call.app.clock.now()
    origins = await run_origins(call.app.runtime.store, [r.id for r in rows])
    answer: dict[str, Any] = {"runs": [run_summary(r, redactor, now, origins[r.id])
                                       for r in rows], "next_cursor": cursor}  # fmt: skip
    if ids:  # the bulk status call: which of the ids no run has
        found = await call.app.client.statuses(list(dict.fromkeys(ids)))
        answer["missing"] = [run_id for run_id, status in found.items() if status is None]
    return answer


def audits(action: str) -> Callable[[Handler], Handler]:
    """Names the operator action a handler performs, so a request refused for its scope
    before the handler runs is audited as that action."""

    def mark(handler: Handler) -> Handler:
        handler.audits = action  # type: ignore[attr-defined]
        return handler

    return mark


@audits("run.start")
async def start_run(call: Call) -> Any:
    body: StartRun = call.body
    run, created = await ops.start(
        call.app, call.actor, call.workflow(body.workflow, body.args, body.kwargs),
        body.args, body.kwargs, run_id=body.id, via="api",
        deadline=body.deadline, queue=body.queue, priority=body.priority,
        partition_key=body.partition_key,
    )  # fmt: skip
    answer = {"run": await run_detail(call.app, run), "created": created}
    return JSONResponse(answer, status_code=201 if created else 200)


async def get_run(call: Call) -> Any:
    return await run_detail(call.app, await call.app.client.get(call.path("run_id")))


async def journal(call: Call) -> Any:
    run = await call.app.client.get(call.path("run_id"))
    after = AFTER.read(call.request)
    limit = ENTRIES.read(call.request)
    entries = await call.app.runtime.store.journal(run.id, after=after, limit=limit + 1)
    more = len(entries) > limit
    entries = entries[:limit]
    redactor = Redactor()
    return {
        "run_id": run.id,
        "status": run.status,
        "entries": [entry_json(e, redactor) for e in entries],
        "next_after": entries[-1].seq if more else None,
    }


async def explain_run(call: Call) -> Any:
    run = await call.app.client.get(call.path("run_id"))
    steps = explain(call.app.runtime, run, await call.app.runtime.store.journal(run.id))
    return explanation(run, steps)


def _run_action(action: str) -> Handler:
    async def act(call: Call) -> Any:
        run_id = call.path("run_id")
        comment = call.body.comment
        now = bool(getattr(call.body, "now", False))  # pause's body may say now
        status = await ops.operate(call.app, call.actor, action, run_id, comment, now=now)
        return {"run_id": run_id, "status": status}

    act.__name__ = f"{action}_run"
    return audits(f"run.{action}")(act)


@audits("run.resolve")
async def resolve_run(call: Call) -> Any:
    body: Resolve = call.body
    given = [n for n in ("value", "retry", "fail", "probe") if n in body.model_fields_set]
    chosen = [n for n in given if n == "value" or getattr(body, n)]
    if len(chosen) != 1:
        raise BadInput(422, "value, retry, fail, probe: give exactly one", "value")
    run_id = call.path("run_id")
    status = await ops.resolve(
        call.app, call.actor, run_id, body.step, value=body.value, retry=bool(body.retry),
        fail=bool(body.fail), probe=bool(body.probe), comment=body.comment,
    )  # fmt: skip
    return {"run_id": run_id, "status": status}


@audits("run.fork")
async def fork_run(call: Call) -> Any:
    body: Fork = call.body
    run_id = call.path("run_id")
    run = await ops.fork(call.app, call.actor, run_id, body.from_step, body.id, body.comment)
    return JSONResponse({"run": await run_detail(call.app, run), "forked_from": run_id}, 201)


@audits("run.event")
async def send_event(call: Call) -> Any:
    body: SendEvent = call.body
    run_id = call.path("run_id")  # an unknown run is 404, before anything is kept
    event_id = await ops.send_event(
        call.app, call.actor, run_id, body.name, body.payload, key=body.key
    )
    return {"run_id": run_id, "event_id": event_id}


@audits("run.steer")
async def steer_run(call: Call) -> Any:
    body: SteerRun = call.body
    run_id = call.path("run_id")
    event_id = await ops.steer(call.app, call.actor, run_id, body.text)
    return {"run_id": run_id, "event_id": event_id}


def _resume_after(call: Call) -> int:
    """`?after=`, or the Last-Event-ID a reconnecting EventSource sends if it is later."""
    after = AFTER.read(call.request)
    last = call.request.headers.get("last-event-id")
    if last is not None and last.isascii() and last.isdigit() and len(last) < 16:
        after = max(after, int(last))
    return after


def _still_allowed(call: Call) -> Callable[[], Awaitable[bool]]:
    """Whether the stream's token still reads (a revoked one stops within sse.RECHECK s)."""
    header = call.request.headers.get("authorization")

    async def allowed() -> bool:
        who = await authenticate_request(call.request, header)
        return who is not None and who.allows("read")

    return allowed


async def stream(call: Call) -> Any:
    run_id = RUN.read(call.request)
    assert run_id is not None
    after = _resume_after(call)
    await call.app.client.get(run_id)
    return sse.response(call.request, call.app, run_id, after, _still_allowed(call),
                        owner=call.actor.token_id)  # fmt: skip


async def run_stream(call: Call) -> Any:
    run = await call.app.client.get(call.path("run_id"))
    after = _resume_after(call)
    return sse.response(call.request, call.app, run.id, after, _still_allowed(call),
                        sse.stream_chunks, owner=call.actor.token_id)  # fmt: skip


# -- gates ----------------------------------------------------------------------------------


async def list_gates(call: Call) -> Any:
    redactor = Redactor()
    gates = [dataclasses.asdict(g) for g in await pending_gates(call.app)]
    return {"gates": [{**g, "arguments": redactor.value(g["arguments"])} for g in gates]}


def _decision(approve: bool) -> Handler:
    async def act(call: Call) -> Any:
        run_id, call_id = call.path("run_id"), call.path("call_id")
        await ops.decide(call.app, call.actor, run_id, call_id, approve, call.body.comment)
        return {"run_id": run_id, "call_id": call_id, "decision": "approve" if approve else "deny"}

    act.__name__ = "approve_gate" if approve else "deny_gate"
    return audits("gate.approve" if approve else "gate.deny")(act)


@audits("gate.answer")
async def answer(call: Call) -> Any:
    run_id, call_id = call.path("run_id"), call.path("call_id")
    await ops.answer(call.app, call.actor, run_id, call_id, call.body.text)
    return {"run_id": run_id, "call_id": call_id, "decision": "answer"}


# -- schedules, pauses, usage, budgets, audit ----------------------------------------------


async def _schedule(call: Call) -> ScheduleRow:
    name = call.path("name")
    await call.app.runtime.open_store()
    row = await Schedules(call.app.runtime.store).get_schedule(name)
    if row is None:
        raise BadInput(404, f"no schedule named {name!r}", "name")
    return row


async def list_schedules(call: Call) -> Any:
    await call.app.runtime.open_store()
    return {
        "schedules": [
            schedule_json(r) for r in await Schedules(call.app.runtime.store).list_schedules()
        ]
    }


async def list_triggers(call: Call) -> Any:
    return {"triggers": [t.as_dict() for t in await call.app.runtime.triggers.statuses()]}


async def get_schedule(call: Call) -> Any:
    row = await _schedule(call)
    count = NEXT.read(call.request)
    limit = TICKS.read(call.request)
    after = max(call.app.clock.now(), (row.next_fire or 0.0) - 1e-6)
    upcoming = [] if row.paused or count == 0 else sched.upcoming(row, count, after)
    ticks = (
        await Schedules(call.app.runtime.store).schedule_ticks(row.name, limit=limit)
        if limit
        else []
    )
    return schedule_detail(row, upcoming, ticks)


@audits("schedule.add")
async def put_schedule(call: Call) -> Any:
    body: PutSchedule = call.body
    name = call.path("name")
    call.workflow(body.workflow, body.args, body.kwargs)
    fields = body.model_dump()
    args, kwargs = fields.pop("args"), fields.pop("kwargs")
    schedule = sched.Schedule(name=name, args=tuple(args), kwargs=kwargs, **fields)
    return schedule_json(await ops.add_schedule(call.app, call.actor, schedule))


async def _known_schedule(call: Call, action: str) -> str:
    """The schedule's name; an unknown one is 404, audited as refused."""
    name = call.path("name")
    try:
        await _schedule(call)
    except BadInput as bad:
        await ops.refuse(call.app, call.actor, Action(action, f"schedule:{name}", "admin"),
                         PerdureError(bad.message))  # fmt: skip
        raise
    return name


@audits("schedule.delete")
async def delete_schedule(call: Call) -> Any:
    name = await _known_schedule(call, "schedule.delete")
    await ops.delete_schedule(call.app, call.actor, name)
    return {"deleted": name}


def _schedule_action(paused: bool) -> Handler:
    action = "schedule.pause" if paused else "schedule.resume"

    async def act(call: Call) -> Any:
        name = await _known_schedule(call, action)
        if paused:
            return schedule_json(await ops.pause_schedule(call.app, call.actor, name))
        return schedule_json(await ops.resume_schedule(call.app, call.actor, name))

    act.__name__ = "pause_schedule" if paused else "resume_schedule"
    return audits(action)(act)


async def list_workers(call: Call) -> Any:
    """Every worker heard of in the last hour, with its state as every view judges it."""
    await call.app.runtime.open_store()
    now = call.app.clock.now()
    judged = await worker_states(call.app.runtime.store, now, now - 3600)
    live = {row.id for row, state in judged if state.live}
    consumers = await consumers_by_worker(call.app.runtime.store, live)
    return {"workers": [worker_json(row, state, consumers.get(row.id, []))
                        for row, state in judged]}  # fmt: skip


def worker_json(row: WorkerRow, state: WorkerState, consumers: list[HealthRow]) -> dict[str, Any]:
    """A worker, its state and (live) the state of each of its message-trigger consumers."""
    return {
        "id": row.id, "host": row.host, "pid": row.pid, "concurrency": row.concurrency,
        "running": row.running, "started_at": row.started_at, "heartbeat_at": row.heartbeat_at,
        "stopped_at": row.stopped_at, **state.as_dict(),
        "triggers": [c.as_consumer() for c in consumers],
    }  # fmt: skip


async def list_versions(call: Call) -> Any:
    from .versions_api import versions_data

    return await versions_data(call.app, CHECK.read(call.request) == "true")


async def list_pauses(call: Call) -> Any:
    await call.app.runtime.open_store()
    rows = await call.app.runtime.store.list_pauses()
    return {"pauses": [{"scope": s, "name": n, "since": t} for s, n, t in rows]}


@audits("pause.set")
async def set_pause(call: Call) -> Any:
    body: SetPause = call.body
    changed = await ops.set_pause(
        call.app, call.actor, body.scope, body.name, body.paused, body.comment, now=body.now
    )
    return {"scope": body.scope, "name": body.name, "paused": body.paused, "changed": changed}


async def usage(call: Call) -> Any:
    agent = AGENT.read(call.request)
    since = SINCE.read(call.request, call.app.clock.now() - 7 * 86400)
    by = BY.read(call.request)
    return await answers.usage(call.app, agent, since, by)


async def _budget_json(app: App, agent: str) -> dict[str, Any]:
    from ..agent.budgets import describe  # the agent layer, only for budgets

    return await describe(app.runtime, agent)


async def _known_agent(app: App, agent: str) -> None:
    """404 for an agent no worker has served (its budget would be silently ignored)."""
    from ..agent.budgets import UnknownAgent, declared

    try:
        await declared(app.runtime, agent)
    except UnknownAgent as exc:
        raise BadInput(404, str(exc), "agent") from None


async def get_budget(call: Call) -> Any:
    await call.app.runtime.open_store()
    await _known_agent(call.app, call.path("agent"))
    return await _budget_json(call.app, call.path("agent"))


@audits("budget.set")
async def put_budget(call: Call) -> Any:
    body: PutBudget = call.body
    agent = call.path("agent")
    from ..agent.budgets import UnknownAgent

    changes = body.model_dump(exclude={"reset"})
    try:  # refused for an unknown agent inside the audited operation
        woken = await ops.set_budget(call.app, call.actor, agent, changes, reset=body.reset)
    except UnknownAgent as exc:
        raise BadInput(404, str(exc), "agent") from None
    return {**await _budget_json(call.app, agent), "woken": woken}


async def _shared_json(app: App, name: str) -> dict[str, Any]:
    """A shared budget as `perdure budget --shared` shows it; 404 for one nobody names."""
    from ..agent.budgets import UnknownAgent, describe_shared

    try:
        return await describe_shared(app.runtime, name)
    except UnknownAgent as exc:
        raise BadInput(404, str(exc), "shared") from None


async def get_shared_budget(call: Call) -> Any:
    await call.app.runtime.open_store()
    return await _shared_json(call.app, call.path("shared"))


@audits("budget.set")
async def put_shared_budget(call: Call) -> Any:
    body: PutBudget = call.body
    name = call.path("shared")
    from ..agent.budgets import UnknownAgent

    changes = body.model_dump(exclude={"reset"})
    try:  # refused for an unknown shared budget inside the audited operation
        woken = await ops.set_shared_budget(call.app, call.actor, name, changes, reset=body.reset)
    except UnknownAgent as exc:
        raise BadInput(404, str(exc), "shared") from None
    return {**await _shared_json(call.app, name), "woken": woken}


async def audit(call: Call) -> Any:
    target, run = TARGET.read(call.request), AUDIT_RUN.read(call.request)
    actor = ACTOR.read(call.request)
    since = AUDIT_SINCE.read(call.request, call.app.clock.now())
    limit = LIMIT.read(call.request)
    before = id_cursor(call.request)
    if run is not None:
        if target is not None and target != f"run:{run}":
            return {"entries": [], "next_cursor": None}  # the filters narrow together
        target = f"run:{run}"
    await call.app.runtime.open_store()
    rows = await Access(call.app.runtime.store).audit_log(
        target=target, limit=limit + 1, before=before, actor=actor, since=since
    )
    page = rows[:limit]
    entries = [audit_entry(r) for r in page]
    cursor = encode_cursor(page[-1].id) if len(rows) > limit else None
    return {"entries": entries, "next_cursor": cursor}


async def list_stuck(call: Call) -> Any:
    """What waits for a person: the object `perdure stuck --json` prints (server/stuck.py)."""
    from .stuck import stuck

    return await stuck(call.app, float(GRACE.read(call.request)))


async def stuckz(call: Call) -> Any:
    """For a monitor: 200 when nothing waits for a person, 503 when a run does (or a
    schedule is held back, a message is dead, the store's write lock stalls), with counts
    only (no ids, no reasons: it needs no token). Readiness (`/readyz`) is not affected:
    a run waiting for a person does not make the server unable to serve."""
    from .stuck import counts, stuck

    found = counts(await stuck(call.app))
    return JSONResponse(found, 503 if found["stuck"] else 200)


async def openapi(call: Call) -> Any:
    from .openapi import document

    return document()


# -- the table ----------------------------------------------------------------------------------

R = f"{PREFIX}/runs/{{run_id}}"
G = f"{PREFIX}/gates/{{run_id}}/{{call_id}}"
S = f"{PREFIX}/schedules/{{name}}"

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/readyz", readyz, None, "Readiness: the store answers a query",
             returns="Ready", errors=(503,)),
    Endpoint("GET", "/stuckz", stuckz, None,
             "For a monitor: 200 when no run waits for a person, 503 (with counts) when one "
             "does", returns="StuckCounts", errors=(503,)),
    Endpoint("GET", f"{PREFIX}/openapi.json", openapi, None, "This document", returns="Any"),
    Endpoint("GET", f"{PREFIX}/runs", list_runs, "read", "List runs, newest first",
             params=(STATUS, WORKFLOW, IDS, LIMIT, RUNS_CURSOR), returns="RunPage"),
    Endpoint("POST", f"{PREFIX}/runs", start_run, "operate",
             "Start a run (201), or find the run `id` names (200); 404 for a workflow this "
             "server does not know, 422 (`args`) for arguments that do not fit it", body=StartRun,
             returns="Started", status=201, errors=(404, 409)),
    Endpoint("GET", R, get_run, "read", "A run: status, input, result, error",
             returns="Run", errors=(404,)),
    Endpoint("GET", f"{R}/journal", journal, "read", "A run's journal, in order",
             params=(AFTER, ENTRIES), returns="Journal", errors=(404,)),
    Endpoint("GET", f"{R}/explain", explain_run, "read",
             "Per step: what happened and what recovery would do now", returns="Explanation",
             errors=(404,)),
    Endpoint("POST", f"{R}/cancel", _run_action("cancel"), "operate",
             "Cancel a run and its children", body=Comment, returns="Status", errors=(404,)),
    Endpoint("POST", f"{R}/pause", _run_action("pause"), "operate",
             "Pause a run (now: abort its calls in flight that allow it)", body=PauseRun,
             returns="Status", errors=(404, 409)),
    Endpoint("POST", f"{R}/resume", _run_action("resume"), "operate",
             "Resume a paused run, or replay a dead one", body=Comment, returns="Status",
             errors=(404, 409)),
    Endpoint("POST", f"{R}/resolve", resolve_run, "operate",
             "Settle a needs_attention step: a value, retry, fail the run, or ask the step's "
             "probe again", body=Resolve,
             returns="Status", errors=(404, 409)),
    Endpoint("POST", f"{R}/fork", fork_run, "operate",
             "Retry from a step: a new run reusing the first `from_step` positions",
             body=Fork, returns="Forked", status=201, errors=(404, 409)),
    Endpoint("POST", f"{R}/events", send_event, "operate",
             "Deliver an event to the run's wait_event(name)", body=SendEvent,
             returns="EventSent", status=202, errors=(404,)),
    Endpoint("POST", f"{R}/steer", steer_run, "operate",
             "Steer a running agent: `text` joins its transcript at its next model call (a "
             "workflow that calls perdure.steering() takes it there); 409 for a finished run "
             "or one that does not take steering", body=SteerRun, returns="EventSent",
             status=202, errors=(404, 409)),
    Endpoint("GET", f"{R}/stream", run_stream, "read",
             "Server-Sent Events: what the run's steps write while they run (perdure.stream)",
             params=(AFTER,), returns="Stream", errors=(404, 503)),
    Endpoint("GET", f"{PREFIX}/events/stream", stream, "read",
             "Server-Sent Events: a run's status changes and new journal entries",
             params=(RUN, AFTER),
             returns="Stream", errors=(404, 503)),
    Endpoint("GET", f"{PREFIX}/stuck", list_stuck, "read",
             "What waits for a person (needs_attention, dead, parked runs with reason, age and "
             "fix; runs nobody moves; held schedules; dead messages): `perdure stuck --json`",
             params=(GRACE,), returns="Stuck"),
    Endpoint("GET", f"{PREFIX}/gates", list_gates, "read",
             "Runs waiting for a person: approvals and questions", returns="Gates"),
    Endpoint("POST", f"{G}/approve", _decision(True), "approve", "Approve a gated tool call",
             body=Comment, returns="Decision", errors=(404, 409)),
    Endpoint("POST", f"{G}/deny", _decision(False), "approve", "Deny a gated tool call",
             body=Comment, returns="Decision", errors=(404, 409)),
    Endpoint("POST", f"{G}/answer", answer, "approve", "Answer an agent's question",
             body=Answer, returns="Decision", errors=(404, 409)),
    Endpoint("GET", f"{PREFIX}/schedules", list_schedules, "read", "Every schedule",
             returns="Schedules"),
    Endpoint("GET", S, get_schedule, "read", "A schedule, its next fire times and recent ticks",
             params=(NEXT, TICKS), returns="ScheduleDetail", errors=(404,)),
    Endpoint("PUT", S, put_schedule, "admin",
             "Store (add or replace) a schedule; 404 and 422 (`args`) as for starting a run",
             body=PutSchedule, returns="Schedule", errors=(404,)),
    Endpoint("DELETE", S, delete_schedule, "admin", "Delete a schedule", returns="Deleted",
             errors=(404,)),
    Endpoint("POST", f"{S}/pause", _schedule_action(True), "admin", "Pause a schedule",
             returns="Schedule", errors=(404,)),
    Endpoint("POST", f"{S}/resume", _schedule_action(False), "admin",
             "Resume a schedule from its next tick", returns="Schedule", errors=(404,)),
    Endpoint("GET", f"{PREFIX}/triggers", list_triggers, "read",
             "Every trigger (schedules, inbox folders, webhooks, events, table changes, "
             "message sources) with its state, lag and last error", returns="Triggers"),
    Endpoint("GET", f"{PREFIX}/workers", list_workers, "read",
             "Workers heard of in the last hour: where they run, runs held, and their state "
             "(alive busy or idle, stopped, dead with the proof, silent)", returns="Workers"),
    Endpoint("GET", f"{PREFIX}/versions", list_versions, "read",
             "Unfinished runs by workflow and code version, the live workers and builds "
             "serving each (a build with no run only it holds is drained), and what this "
             "server's code would do with runs of other versions",
             params=(CHECK,), returns="Versions"),
    Endpoint("GET", f"{PREFIX}/pauses", list_pauses, "read",
             "Workflows and workers paused as a whole", returns="Pauses"),
    Endpoint("POST", f"{PREFIX}/pauses", set_pause, "operate",
             "Pause or resume a whole workflow or worker", body=SetPause, returns="Paused"),
    Endpoint("GET", f"{PREFIX}/usage", usage, "read", "Model tokens and cost, grouped",
             params=(AGENT, SINCE, BY),
             returns="Usage"),
    Endpoint("GET", f"{PREFIX}/budgets/{{agent}}", get_budget, "read",
             "An agent's budget in force (each limit from the spec or stored), what it spent "
             "this hour and day, and its runs parked for budget", returns="Budget"),
    Endpoint("PUT", f"{PREFIX}/budgets/{{agent}}", put_budget, "admin",
             "Change only the limits given of an agent's budget (reset: back to the spec's); "
             "as many parked runs as now fit continue",
             body=PutBudget, returns="BudgetSet"),
    Endpoint("GET", f"{PREFIX}/budgets/shared/{{shared}}", get_shared_budget, "read",
             "A budget agents share ([budget] shared = NAME in their specs): its limits, what "
             "its agents spent this hour and day, which agents share it, runs parked",
             returns="SharedBudget", errors=(404,)),
    Endpoint("PUT", f"{PREFIX}/budgets/shared/{{shared}}", put_shared_budget, "admin",
             "Change only the limits given of a shared budget (reset: forget them); as many "
             "parked runs of its agents as now fit continue",
             body=PutBudget, returns="SharedBudgetSet", errors=(404,)),
    Endpoint("GET", f"{PREFIX}/audit", audit, "read", "The audit log, newest first",
             params=(TARGET, AUDIT_RUN, ACTOR, AUDIT_SINCE, LIMIT, AUDIT_CURSOR),
             returns="AuditPage"),
)  # fmt: skip


# -- dispatch -------------------------------------------------------------------------------


def _error(status: int, message: str, field: str | None = None, **headers: str) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers or None)


async def _dispatch(endpoint: Endpoint, request: Request) -> Response:
    app: App = request.app.state.perdure
    who = None
    if endpoint.scope is not None:
        try:
            await app.runtime.open_store()
        except PerdureError as exc:
            raise StoreUnavailable(f"cannot open the store: {exc}") from None
        who = await authenticate_request(request, request.headers.get("authorization"))
        if who is None:
            return _error(401, "a valid `Authorization: Bearer <token>` header is required "
                          "(perdure token create)", **{"WWW-Authenticate": "Bearer"})  # fmt: skip
        try:
            require(who, endpoint.scope, f"{endpoint.method} {endpoint.path}")
        except Forbidden as exc:
            await _audit_refusal(app, who, endpoint, request, exc)
            raise
    body = await parse_body(request, endpoint.body) if endpoint.body is not None else None
    result = await endpoint.handler(Call(app, who, request, body))
    if isinstance(result, Response):
        return result
    return JSONResponse(result, status_code=endpoint.status)


_TARGETS = (("run_id", "run"), ("name", "schedule"), ("agent", "agent"), ("shared", "shared"))


async def _audit_refusal(
    app: App, who: Principal, endpoint: Endpoint, request: Request, exc: Forbidden
) -> None:
    """A request refused for its scope is audited as the action its handler performs."""
    name = getattr(endpoint.handler, "audits", None)
    if name is None:  # it only reads
        return
    params = request.path_params
    kind, value = next(((k, segment(request, p)) for p, k in _TARGETS if p in params), ("api", ""))
    target = f"{kind}:{value}" if value else f"api:{endpoint.method} {endpoint.path}"
    await ops.refuse(app, who, Action(name, target, endpoint.scope or "read"), exc)


def _route(endpoint: Endpoint) -> Route:
    async def handle(request: Request) -> Response:
        try:
            return await _dispatch(endpoint, request)
        except BadInput as bad:
            return _error(bad.status, bad.message, bad.field)
        except Forbidden as exc:
            return _error(403, str(exc))
        except TooManyFailures as exc:
            return _error(429, str(exc), **{"Retry-After": str(exc.retry_after)})
        except RunNotFound as exc:
            return _error(404, str(exc))
        except StoreUnavailable as exc:
            log.warning("%s %s: %s", request.method, endpoint.path, exc)
            return _error(503, "the store cannot be reached; try again later")
        except (ConfigError, PayloadError) as exc:
            return _error(400, str(exc))
        except PerdureError as exc:  # the run is not in a state that allows this
            return _error(409, str(exc))

    handle.__name__ = endpoint.handler.__name__
    return IdRoute(endpoint.path, handle, methods=[endpoint.method])


def api_routes() -> list[BaseRoute]:
    """The routes of `ENDPOINTS` (`/api/v1/...` and `/readyz`), for `server.app.routes()`."""
    return [_route(e) for e in ENDPOINTS]
