"""Reading runs for people: per-step explanations, the effect inventory, and replay-check.

`replay_check` replays the stored journals of unfinished runs against the
current code without executing anything: each recorded step returns its
outcome, the first unrecorded call ends the check, and every divergence is
reported with its run, position, expected and found call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..store.base import FINISHED, Entry, RunRow
from .effects import CRASHED, MEANING, NOT_STARTED, RECOVERY
from .runner import load_entries
from .versions import Divergence, Outlook, check_journal

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass(slots=True)
class StepReport:
    """What happened at one journal position, and what recovery would do there now."""

    position: int
    kind: str
    name: str
    effect: str
    attempts: int
    state: str
    detail: str
    recovery: str


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def explain(runtime: Runtime, run: RunRow, entries: Sequence[Entry]) -> list[StepReport]:
    """Per position: the call, its attempts, its outcome and what recovery would do."""
    by_pos: dict[int, list[Entry]] = {}
    for entry in entries:
        if entry.position is not None:
            by_pos.setdefault(entry.position, []).append(entry)
    reports: list[StepReport] = []
    for pos in sorted(by_pos):
        group = by_pos[pos]
        first, last = group[0], group[-1]
        family = first.kind.partition(".")[0]
        step = runtime.steps.get(first.name) if family == "step" else None
        intent = next((e for e in group if e.kind == "step.intent"), None)
        effect = (
            step.effect if step else (_load(intent.data) or {}).get("effect", "") if intent else ""
        )
        attempts = max((e.attempt for e in group), default=0)
        final = next((e for e in group if e.final), None)
        if final is not None:
            data = _load(final.data)
            failed = isinstance(data, dict) and "error" in data
            state = "failed" if failed else "done"
            detail = _describe(final, data)
            recovery = "none: the recorded outcome is replayed"
        elif family == "step":
            probe = step.probe.name if step is not None and step.probe is not None else None
            state, detail, recovery = _open_step(last, effect, run, probe)
        elif last.kind == "event.wait":
            state = "waiting"
            detail = f"for event {first.name!r}"
            recovery = "none: resumes when the event arrives or the wait times out"
        else:
            state, detail, recovery = "open", last.kind, "replays"
        reports.append(
            StepReport(pos, family, first.name, effect, attempts, state, detail, recovery)
        )
    return reports


def _describe(final: Entry, data: Any) -> str:
    if isinstance(data, dict) and "error" in data:
        err = data["error"]
        return f"{err.get('type')}: {err.get('message')}"
    if final.kind == "step.outcome" and isinstance(data, dict):
        by = " (set by operator)" if data.get("resolved_by") else ""
        if data.get("probe"):
            by = f" (settled by probe {data['probe']}: done)"
        ms = f" in {data['ms']} ms" if "ms" in data else ""
        return f"returned {json.dumps(data.get('value'))[:80]}{ms}{by}"
    if final.kind == "sleep.until":
        from datetime import UTC, datetime

        return f"sleep until {datetime.fromtimestamp(float(data), UTC):%Y-%m-%d %H:%M:%S}Z"
    return f"{final.kind} {json.dumps(data)[:80]}"


def _open_step(
    last: Entry, effect: str, run: RunRow, probe: str | None = None
) -> tuple[str, str, str]:
    asks = (
        f"asks probe {probe}: done records its value, not done runs it again, cannot tell "
        "goes to needs_attention"
        if probe is not None and effect == "once"
        else None
    )
    if last.kind == "step.needs_attention":
        options = "--value JSON, --retry, --fail" + (" or --probe" if probe else "")
        return (
            "needs_attention",
            str((_load(last.data) or {}).get("reason") or CRASHED),
            f"none until an operator resolves: {options}",
        )
    if last.kind == "step.probed":  # not done: the step runs again
        return (
            f"probed: not done (attempt {last.attempt})",
            str((_load(last.data) or {}).get("reason") or "its effect did not happen"),
            f"attempt {last.attempt + 1} runs",
        )
    if last.kind == "step.stopped":
        data = _load(last.data) or {}
        if not data.get("executing"):
            return ("handed back", str(data.get("reason", NOT_STARTED)), "runs it (it never ran)")
        recovery = RECOVERY.get(effect, "re-run")
        if effect == "once":
            recovery = asks or "not re-run: run goes to needs_attention (stopped, not crashed)"
        state = "aborted (pause --now)" if data.get("aborted") else "stopped while executing"
        return (state, str(data.get("reason", "")), recovery)
    if last.kind in ("step.attempt_failed", "step.retry"):
        data = _load(last.data) or {}
        if data.get("probe"):
            return ("probe asked again", "by an operator", asks or "asks its probe")
        error = (data.get("error") or {}).get("message", "")
        if data.get("parked"):  # ParkRun: the run is paused until an operator resumes it
            return (
                f"parked (attempt {last.attempt} failed)",
                error,
                f"attempt {last.attempt + 1} runs once resumed: perdure resume {run.id}",
            )
        return (
            f"retrying (attempt {last.attempt} failed)",
            error,
            f"attempt {last.attempt + 1} runs at its retry time",
        )
    state = "in flight" if run.status == "running" else "interrupted"
    return (state, "intent journaled, no outcome yet", asks or RECOVERY.get(effect, "re-run"))


@dataclass(slots=True)
class EffectRow:
    name: str
    effect: str
    meaning: str
    recovery: str
    retry: str
    timeout: str


def effects(runtime: Runtime) -> list[EffectRow]:
    """Every registered step with its effect and what recovery does with it."""
    rows = []
    for name in sorted(runtime.steps):
        step = runtime.steps[name]
        policy = step.retry
        retry = "no retry" if policy.max_attempts == 1 else f"{policy.max_attempts} attempts"
        timeout = "-" if step.timeout is None else f"{step.timeout:g}s"
        rows.append(
            EffectRow(
                name, step.effect, MEANING[step.effect], RECOVERY[step.effect], retry, timeout
            )
        )
    return rows


@dataclass(slots=True)
class ReplayReport:
    """Unfinished runs checked, where each diverging one parts from the code, and in
    `perdure versions`' terms what a worker of this code would do with runs of other
    versions (`outlook`: upgrade them, or leave them waiting with the divergence)."""

    checked: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    outlook: Outlook = field(default_factory=Outlook)


async def replay_check(runtime: Runtime, limit: int = 100_000) -> ReplayReport:
    """Replay every unfinished run's journal against the current code; execute nothing."""
    await runtime.open_store()
    report = ReplayReport()
    # dead runs too: `perdure resume` would replay them against this code
    unfinished = [r for r in await runtime.store.list_runs(limit=limit) if r.status not in FINISHED]
    for run in unfinished:
        report.checked += 1
        definition = runtime.workflows.get(run.workflow)
        entries = [] if definition is None else await load_entries(runtime, run.id)
        parted = await check_journal(runtime, run, definition, entries)
        if parted is not None:
            report.divergences.append(parted)
        if definition is None or run.code_version == definition.version:
            continue
        if definition.upgrade == "pinned":
            report.outlook.pinned += 1
        elif definition.upgrade == "auto":
            if parted is None:
                report.outlook.upgrade += 1
            else:
                report.outlook.wait.append(parted)
    return report
