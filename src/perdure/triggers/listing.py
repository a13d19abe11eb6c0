"""Every trigger of an app in one list, with its state, lag and last error (`perdure triggers`).

Schedules come from the store (declared in code or added by the CLI/API); inbox
folders, webhooks, event triggers and table changes from the app's registrations,
checked against the store and the database now. Any other registered source (a
message broker's consumer) takes part by having a `status()` method returning a
dict with the keys `kind, name, workflow, state, lag, last_error` (`detail` and
`pending` optional).

`lag` is in seconds: how far behind the trigger is (a schedule's due tick not yet
fired, a table change's oldest change not yet turned into a run); None where the
idea does not apply. A source's own `status()` may report its own measure.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PerdureError
from .changes_sql import Outbox
from .inbox import Inbox
from .schedule_sql import Schedules
from .schedules import Scheduler
from .table_changes import TableChange

if TYPE_CHECKING:
    from ..engine.runtime import Runtime
    from .events import EventTrigger
    from .webhooks import Webhook

KINDS = ("schedule", "inbox", "webhook", "event", "table_change")  # and the sources' own


@dataclass(frozen=True, slots=True)
class TriggerStatus:
    """One trigger as `perdure triggers` shows it."""

    kind: str
    name: str
    workflow: str
    state: str
    lag: float | None = None
    last_error: str | None = None
    detail: str = ""  # what it watches: a cron, a folder, a path, a table
    pending: int | None = None  # occasions recorded but not yet turned into runs

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def list_triggers(
    runtime: Runtime,
    *,
    webhooks: Mapping[str, Webhook] | None = None,
    events: Mapping[str, EventTrigger] | None = None,
    sources: Iterable[object] = (),
) -> list[TriggerStatus]:
    """The status of every trigger of `runtime`, by kind then name."""
    await runtime.open_store()
    now = runtime.clock.now()
    found = await _schedules(runtime, now)
    for service in runtime.services:
        if isinstance(service, Inbox):
            found.append(_inbox(service))
        elif isinstance(service, TableChange):
            found.append(await _table_change(runtime, service, now))
    for hook in (webhooks or {}).values():
        found.append(_webhook(runtime, hook))
    for trigger in (events or {}).values():
        found.append(TriggerStatus("event", trigger.name, trigger.workflow, "ready",
                                   detail=f"type {trigger.event_type}"))  # fmt: skip
    seen: set[int] = set()
    for source in [*sources, *runtime.services]:
        status = getattr(source, "status", None)
        if id(source) in seen or not callable(status):
            continue
        seen.add(id(source))
        probe = getattr(source, "probe", None)  # a broker's consumer asks its broker now
        found.append(await _source(source, probe if callable(probe) else status))
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found, key=lambda t: (order.get(t.kind, len(order)), t.kind, t.name))


async def _schedules(runtime: Runtime, now: float) -> list[TriggerStatus]:
    out = []
    for row in await Schedules(runtime.store).list_schedules():
        missed = await Schedules(runtime.store).schedule_ticks(
            row.name, statuses=["missed"], limit=1
        )
        error = f"tick missed: {missed[0].reason}" if missed and missed[0].reason else None
        late = None if row.paused or row.next_fire is None else max(0.0, now - row.next_fire)
        timing = f"cron {row.cron} {row.tz}" if row.cron else f"every {row.every:g}s"
        out.append(TriggerStatus("schedule", row.name, row.workflow,
                                 "paused" if row.paused else "active", late, error,
                                 f"{timing} ({row.source})"))  # fmt: skip
    stored = {t.name for t in out}
    for service in runtime.services:
        if isinstance(service, Scheduler):
            for s in service.declared.values():
                if s.name not in stored:
                    timing = f"cron {s.cron} {s.tz}" if s.cron else f"every {s.every:g}s"
                    out.append(TriggerStatus("schedule", s.name, s.workflow, "not stored",
                                             None, "stored when a worker starts",
                                             f"{timing} (code)"))  # fmt: skip
    return out


def _inbox(inbox: Inbox) -> TriggerStatus:
    ok = inbox.folder.is_dir()
    return TriggerStatus(
        "inbox",
        inbox.name.removeprefix("inbox:"),
        inbox.workflow,
        "watching" if ok else "error",
        None,
        None if ok else f"{inbox.folder} is not a folder",
        str(inbox.folder),
    )


def _webhook(runtime: Runtime, hook: Webhook) -> TriggerStatus:
    try:
        hook.check(runtime)
        state, error = "ready", None
    except PerdureError as exc:
        state, error = "error", str(exc)
    return TriggerStatus("webhook", hook.name, hook.workflow, state, None, error, hook.path)


async def _table_change(runtime: Runtime, change: TableChange, now: float) -> TriggerStatus:
    t = change.trigger
    detail = f"{t.table} on {', '.join(t.ops)}"
    error = change.last_error
    try:
        table_found, installed, enabled = await Outbox(runtime.store).table_trigger_state(t)
    except PerdureError as exc:  # e.g. a table name PostgreSQL cannot parse
        return TriggerStatus("table_change", t.name, change.workflow, "error", None,
                             str(exc), detail)  # fmt: skip
    pending, oldest, refused, reason = await Outbox(runtime.store).change_counts(t.name)
    if not table_found:
        state = "error"
        error = error or f"no table {t.table!r} in the store's database"
    elif not installed:
        state = "not installed"
        error = error or "start a worker or run `perdure triggers install`"
    else:
        state = "installed" if enabled else "disabled"
    if refused:
        error = f"{refused} change(s) refused; latest: {reason}"
    lag = max(0.0, now - oldest) if oldest is not None else 0.0
    return TriggerStatus("table_change", t.name, change.workflow, state, lag, error, detail,
                         pending)  # fmt: skip


async def _source(source: object, status: Any) -> TriggerStatus:
    """A registered source's own `status()` (or awaited `probe()`) dict as a TriggerStatus
    (never raising)."""
    name = str(getattr(source, "name", type(source).__name__))
    try:
        answer = status()
        got = dict(await answer if inspect.isawaitable(answer) else answer)
    except Exception as exc:  # a broken status must not hide the other triggers
        return TriggerStatus("source", name, "", "error", None, f"status() failed: {exc}")
    lag = got.get("lag")
    with contextlib.suppress(TypeError, ValueError):
        lag = None if lag is None else float(lag)
    return TriggerStatus(
        str(got.get("kind", "source")),
        str(got.get("name", name)),
        str(got.get("workflow", "")),
        str(got.get("state", "unknown")),
        lag if isinstance(lag, float) else None,
        None if got.get("last_error") is None else str(got["last_error"]),
        str(got.get("detail", "")),
        got.get("pending") if isinstance(got.get("pending"), int) else None,
    )
