"""Why a run is where it is, in one line, from its row alone: the same words in every view
(`perdure ls`, the API, the dashboard, MCP)."""

from __future__ import annotations

import json

from ..store.base import RunRow

WAITING_FOR = {"timer": "until its timer", "operator": "for an operator"}


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
