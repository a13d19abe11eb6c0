"""The JSON objects perdure answers with: the HTTP API's bodies and what `perdure ... --json`
prints, built by the same functions so the two cannot drift (no web framework here: the
CLI imports it). Run data (input, result, error, journal data, details) is masked by
`observe.redact`. Their JSON Schemas are `openapi.SCHEMAS`; `cli/schemas.py` names the one
each command prints."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..app import App
from ..engine.client import continued_as, unblob_text
from ..engine.inspection import StepReport
from ..engine.origins import run_origins, started_by
from ..engine.reasons import claimable, reason_of
from ..observe.redact import Redactor
from ..server.access_sql import AuditRow
from ..store.base import Entry, RunRow
from ..triggers.schedule_sql import ScheduleRow, TickRow

USAGE_KEYS = {"run": ("agent", "run_id"), "agent": ("agent",), "day": ("day", "agent")}


def parsed(text: str | None) -> Any:
    """Stored JSON text as a value (text that is not JSON as itself; None as None)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_summary(
    run: RunRow, redactor: Redactor, now: float, origin: dict[str, Any]
) -> dict[str, Any]:
    """A run's row: a `RunSummary` (with `reason`, the one line `perdure ls` shows);
    `claimable`: a `running` (or `cancelling`) run no worker holds (handed back by a stop,
    or its lease ran out), which the next worker takes; `trigger` and `started_by`: what
    started it, from its `origin` (`engine.client.started_by`)."""
    trigger, by = started_by(origin)
    return {
        "id": run.id, "workflow": run.workflow, "status": run.status,
        "trigger": trigger, "started_by": by,
        "claimable": claimable(run, now),
        "created_at": run.created_at, "updated_at": run.updated_at, "started_at": run.started_at,
        "parent_id": run.parent_id, "waiting_for": run.waiting_for, "wake_at": run.wake_at,
        "deadline_at": run.deadline_at, "queue": run.queue, "priority": run.priority,
        "partition_key": run.partition_key, "pause_requested": run.pause_requested,
        "recoveries": run.recoveries, "code_version": run.code_version,
        "error": redactor.value(parsed(run.error)),
        "reason": redactor.text(reason_of(run)),
        "continued_as": continued_as(run),
    }  # fmt: skip


async def run_starts(app: App, runs: Sequence[RunRow]) -> dict[str, tuple[str, str | None]]:
    """What started each run (run id -> trigger kind, short source), as its summary says."""
    origins = await run_origins(app.runtime.store, [r.id for r in runs])
    return {run_id: started_by(origin) for run_id, origin in origins.items()}


async def run_detail(app: App, run: RunRow) -> dict[str, Any]:
    """A run with its input, result and lease: a `Run` (its error keeps its traceback)."""
    redactor = Redactor()
    origins = await run_origins(app.runtime.store, [run.id])
    return {
        **run_summary(run, redactor, app.clock.now(), origins[run.id]),
        "input": redactor.value(parsed(await unblob_text(app.runtime.store, run.input))),
        "result": redactor.value(parsed(await unblob_text(app.runtime.store, run.result))),
        "lease_owner": run.lease_owner,
        "lease_until": run.lease_until,
        "lease_epoch": run.lease_epoch,
    }


def entry_json(entry: Entry, redactor: Redactor) -> dict[str, Any]:
    """A journal entry (`data` decoded from its JSON text, masked): an `Entry`."""
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "name": entry.name,
        "position": entry.position,
        "attempt": entry.attempt,
        "final": entry.final,
        "at": entry.at,
        "data": redactor.value(parsed(entry.data)),
    }


def explanation(run: RunRow, steps: list[StepReport]) -> dict[str, Any]:
    """Per step, what happened and what recovery would do now: an `Explanation`."""
    redactor = Redactor()
    shown = [{**dataclasses.asdict(s), "detail": redactor.text(s.detail)} for s in steps]
    return {"run_id": run.id, "status": run.status, "steps": shown}


def schedule_json(row: ScheduleRow) -> dict[str, Any]:
    """A `Schedule`."""
    return {**dataclasses.asdict(row), "input": parsed(row.input)}


def schedule_detail(
    row: ScheduleRow, upcoming: list[float], ticks: list[TickRow]
) -> dict[str, Any]:
    """A `ScheduleDetail`: the schedule, its next fire times and its recent ticks."""
    return {
        "schedule": schedule_json(row),
        "upcoming": upcoming,
        "ticks": [dataclasses.asdict(t) for t in ticks],
    }


async def usage(app: App, agent: str | None, since: float, by: str) -> dict[str, Any]:
    """Model tokens and cost since `since`, grouped `by` agent, run or day: a `Usage`."""
    from ..agent.budget_sql import Budgets

    await app.runtime.open_store()
    totals: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    for u in await Budgets(app.runtime.store).usage(agent, since):
        day = datetime.fromtimestamp(u.at, UTC).strftime("%Y-%m-%d")
        values = {"agent": u.agent, "run_id": u.run_id, "day": day}
        total = totals[tuple(values[k] for k in USAGE_KEYS[by])]
        for i, n in enumerate((1, u.input_tokens, u.output_tokens, u.cost)):
            total[i] += n
    groups = [
        {**dict(zip(USAGE_KEYS[by], key, strict=True)), "calls": int(t[0]),
         "input_tokens": int(t[1]), "output_tokens": int(t[2]), "cost": t[3]}
        for key, t in sorted(totals.items())
    ]  # fmt: skip
    return {"by": by, "since": since, "groups": groups}


def audit_entry(row: AuditRow, redactor: Redactor | None = None) -> dict[str, Any]:
    """One audit log entry (its detail decoded and masked: comments, answers and resolve
    values may quote a secret): an `AuditEntry`."""
    redactor = redactor or Redactor()
    return {**dataclasses.asdict(row), "detail": redactor.value(parsed(row.detail)),
            "reason": redactor.text(row.reason)}  # fmt: skip
