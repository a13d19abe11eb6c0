"""What waits for a person, as one object every view shows: `perdure stuck --json`,
`GET /api/v1/stuck`, `/stuckz` (its counts) and the dashboard's runs page.

The runs come from `Client.stuck` (the same reason line `perdure stuck` prints, with its
age and the command that moves the run), the schedules a parked run holds back from
`triggers.schedules.blocked`, the broker messages that could start no run from the dead
message table, the message triggers a live worker cannot consume (its broker refused it or
is out of reach, as the worker recorded it), and the SQLite write lock's stall from the
store. One read, one truth (reasons masked by `observe.redact`):

    {"runs": [{"run_id", "workflow", "status", "cause", "reason", "since", "age", "fix"}],
     "schedules": [{"schedule", "run_id", "status", "since", "held", "fix"}],
     "dead_messages": [{"trigger", "message_id", "kind", "reason", "at"}],
     "triggers": [{"trigger", "kind", "worker", "state", "error", "since"}],
     "store": null | "the write lock's stall, in one line",
     "grace": 60.0, "at": <the store clock's now>}

`cause` is `interrupted`, `stopped` or `probe` (a once step in doubt), `dead`, `parked` (a
step parked the run), or `overdue` (a run nobody moved `grace` seconds past its time);
`since` is when the run last changed (when it parked), `age` the seconds since; `fix` the
command that moves it, or null where the reason itself says what to do.
"""

from __future__ import annotations

import re
from typing import Any

from ..app import App
from ..engine.reasons import cause_of
from ..observe.redact import Redactor
from ..store.base import RunRow
from ..triggers.dead_sql import DeadMessages
from ..triggers.messages import consumer_health

DEAD_LIMIT = 100  # dead messages listed (as `perdure stuck` lists them)
_FIX = re.compile(r"; to (?:settle|revive) it: (perdure .+)$")


def run_entry(run: RunRow, why: str, now: float) -> dict[str, Any]:
    """One stuck run as every view shows it (its reason masked by `observe.redact`, as
    every view masks run data)."""
    why = Redactor().text(why)
    fix = _FIX.search(why)
    return {
        "run_id": run.id,
        "workflow": run.workflow,
        "status": run.status,
        "cause": cause_of(run) or "overdue",
        "reason": why,
        "since": run.updated_at,
        "age": round(max(0.0, now - run.updated_at), 3),
        "fix": fix.group(1) if fix else None,
    }


async def stuck(app: App, grace: float = 60.0) -> dict[str, Any]:
    """Everything that waits for a person or that nobody moves (see the module's doc)."""
    from ..triggers.schedules import blocked

    stall = app.client.write_lock_stall()  # first: the queries below may have to wait for it
    found = await app.client.stuck(grace)
    now = app.runtime.clock.now()
    held = await blocked(app.runtime)
    dead = await DeadMessages(app.runtime.store).dead_messages(limit=DEAD_LIMIT)
    not_consuming = [
        {"trigger": h.trigger, "kind": h.kind, "worker": h.worker, "state": h.state,
         "error": Redactor().text(h.error or ""), "since": h.since}
        for h in await consumer_health(app.runtime)
        if h.failing
    ]  # fmt: skip
    schedules = [
        {"schedule": b.schedule, "run_id": b.run_id, "status": b.status, "since": b.since,
         "held": b.held, "fix": b.fix}
        for b in held
    ]  # fmt: skip
    messages = [
        {"trigger": d.trigger, "message_id": d.message_id, "kind": d.kind,
         "reason": Redactor().text(d.reason), "at": d.at}
        for d in dead
    ]  # fmt: skip
    return {
        "runs": [run_entry(run, why, now) for run, why in found],
        "schedules": schedules,
        "dead_messages": messages,
        "triggers": not_consuming,
        "store": stall,
        "grace": grace,
        "at": now,
    }


def anything(found: dict[str, Any]) -> bool:
    """Whether `found` (from `stuck`) holds anything a person must see (`perdure stuck`
    exits 1, `/stuckz` answers 503)."""
    return bool(
        found["runs"]
        or found["schedules"]
        or found["dead_messages"]
        or found["triggers"]
        or found["store"]
    )


def counts(found: dict[str, Any]) -> dict[str, Any]:
    """How many of each, with runs by cause: what `/stuckz` answers (no ids, no reasons)."""
    causes: dict[str, int] = {}
    for run in found["runs"]:
        causes[run["cause"]] = causes.get(run["cause"], 0) + 1
    return {
        "stuck": anything(found),
        "runs": len(found["runs"]),
        "causes": causes,
        "schedules": len(found["schedules"]),
        "dead_messages": len(found["dead_messages"]),
        "triggers": len(found["triggers"]),
        "store": found["store"] is not None,
    }
