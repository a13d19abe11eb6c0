"""Why a run is where it is, in one line, from its row alone: the same words in every view
(`perdure ls`, the API, the dashboard, MCP)."""

from __future__ import annotations

import json
from collections.abc import Collection

from ..store.base import RunRow

WAITING_FOR = {"timer": "until its timer", "operator": "for an operator"}
PERSON = ("needs_attention", "dead", "paused")  # the states a person moves a run out of


def claimable(run: RunRow, now: float) -> bool:
    """Does no worker hold this run although its status says it is on its way? Handed back
    (a graceful stop, a pause) or its holder's lease ran out: the next worker takes it."""
    return run.status in ("running", "cancelling") and (run.lease_until or 0.0) <= now


def shown_status(run: RunRow, paused: Collection[str] = (), now: float | None = None) -> str:
    """A run's status as every view shows it: `paused` for a run of a paused workflow that
    nobody executes (handed back, or not started); with `now`, `claimable` for a `running`
    run no worker holds (see `claimable`); else the row's status."""
    released = run.status == "pending" or (run.status == "running" and not run.lease_until)
    if run.workflow in paused and released:
        return "paused"
    if now is not None and run.status == "running" and claimable(run, now):
        return "claimable"
    return run.status


def reason_of(run: RunRow) -> str:
    """One line: what a parked, dead or failed run's row says of why (its error's message),
    what a sleeping or waiting one waits for, else "" (a run on its way says nothing)."""
    if run.status in ("paused", "needs_attention", "dead", "failed") and run.error:
        try:
            record = json.loads(run.error)
        except ValueError:
            return " ".join(run.error.split())
        said = record.get("message", run.error) if isinstance(record, dict) else run.error
        return " ".join(str(said).split())
    if run.status in ("sleeping", "waiting") and run.waiting_for:
        kind, _, what = run.waiting_for.partition(":")
        if kind in WAITING_FOR:
            return f"waits {WAITING_FOR[kind]}"
        return f"waits for {kind} {what}".rstrip()
    return ""


def cause_of(run: RunRow) -> str | None:
    """Why a run waits for a person, as a label of few values (metrics group by it):
    interrupted, stopped or probe (a once step in doubt: cut off by a crash, by a stop, or
    its probe could not tell), version (its code changed: engine/versions.py), dead, or
    parked (by a step); None if it does not wait for one
    (an operator's own pause included)."""
    if run.status not in PERSON or not run.error:
        return None
    if run.status == "dead":
        return "dead"
    if run.status == "paused":
        return "parked"
    try:
        record = json.loads(run.error)
    except ValueError:
        return "interrupted"
    cause = record.get("cause") if isinstance(record, dict) else None
    return str(cause) if cause in ("interrupted", "stopped", "probe", "version") else "interrupted"
