"""Operator actions for every interface (CLI, HTTP API, dashboard, MCP): checked, done, audited.

Each action is an `Action` value (its name, target, the scope it needs, its detail)
handed to `perform`, the one path: it refuses with `Forbidden` unless the acting
`Principal`'s scopes allow the action, does it through the App, and appends one
audit record whatever happens: `ok`, `refused` (a `PerdureError`: not allowed, an
unknown target, a state that does not allow it; the reason is its one line) or
`failed` (anything else). Plain Python, so a bare install's CLI uses it too (as
`access.local_operator()`). Gates are runs waiting for a person: an approval
(`approve:<call id>`) or a question (`human:<call id>`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from ..agent.budget_sql import Budgets
from ..errors import ConfigError, PerdureError, StoreError
from ..triggers.changes_sql import Outbox
from ..triggers.dead_sql import DeadMessages
from ..triggers.schedule_sql import Schedules
from .access import Principal, check_scopes, new_token_id, record
from .access import create_token as _create_token
from .access_sql import Access

if TYPE_CHECKING:
    from ..app import App
    from ..engine.retention import GcReport
    from ..store.base import RunRow
    from ..triggers.schedule_sql import ScheduleRow
    from ..triggers.schedules import Schedule

APPROVE_PREFIX = "event:approve:"
QUESTION_PREFIX = "event:human:"
OK, REFUSED, FAILED = "ok", "refused", "failed"

log = logging.getLogger("perdure.audit")
T = TypeVar("T")


class Forbidden(PerdureError):
    """The token's scopes do not allow this action."""


def require(who: Principal, scope: str, action: str) -> None:
    if not who.allows(scope):
        raise Forbidden(
            f"{action} needs the {scope!r} scope; {who.name!r} has {sorted(who.scopes)}"
        )


@dataclass(frozen=True)
class Action:
    """One operator action as a value: what (`run.cancel`), on what (`run:ID`), the scope
    it needs, and the detail the audit log keeps (a comment, options)."""

    name: str
    target: str
    scope: str
    detail: dict[str, Any] = field(default_factory=dict)

    def with_detail(self, **more: Any) -> Action:
        return replace(self, detail={**self.detail, **more})


async def perform(
    app: App,
    who: Principal,
    action: Action,
    do: Callable[[], Awaitable[T]],
    settled: Callable[[T], Action] | None = None,
) -> T:
    """Check `who` may do `action`, do it, and audit how it ended; returns what `do` did.

    `settled` gives the action as recorded on success (a target or detail known only
    then, e.g. a new run's id). A refusal or failure is recorded, then raised as it was.
    """
    try:
        require(who, action.scope, action.name)
        result = await do()
    except PerdureError as exc:
        outcome = FAILED if isinstance(exc, StoreError) else REFUSED
        await _record_quietly(app, who, action, outcome, exc)
        raise
    except Exception as exc:  # a bug or an outside failure: the log says so, then it goes on up
        await _record_quietly(app, who, action, FAILED, exc)
        raise
    done = settled(result) if settled is not None else action
    await record(app, who.name, done.name, done.target, _kept(done.detail))
    return result


async def refuse(app: App, who: Principal, action: Action, reason: PerdureError) -> None:
    """Audit an action refused before it could be performed (e.g. an HTTP request whose
    token lacks the scope), as `perform` would have."""
    await _record_quietly(app, who, action, REFUSED, reason)


async def _record_quietly(
    app: App, who: Principal, action: Action, outcome: str, exc: BaseException
) -> None:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    try:
        await record(app, who.name, action.name, action.target, _kept(action.detail),
                     outcome, reason[:500])  # fmt: skip
    except Exception as failure:  # the store that refused the action may refuse this too
        log.warning("audit: could not record %s %s (%s): %s", action.name, action.target,
                    outcome, failure)  # fmt: skip


def parse_since(text: str, now: float) -> float:
    """The time `--since`/`since=` names: a duration back from `now` (90s, 30m, 2h, 7d, as
    `perdure usage --since` takes), an ISO 8601 time or date (UTC unless it says), or Unix
    seconds. Raises ConfigError, naming the forms, for anything else."""
    from ..agent.spec import duration

    text = text.strip()
    try:
        return now - duration(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"since {text!r}: give a duration (90m, 24h, 7d), an ISO time "
            "(2026-12-01T09:00) or Unix seconds"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _kept(detail: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in detail.items() if v is not None and v != ""}


# -- runs ----------------------------------------------------------------------------------


async def start(
    app: App,
    who: Principal,
    workflow: str,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    via: str | None = None,
    **options: Any,
) -> tuple[RunRow, bool]:
    """Start a run of `workflow` (or find the run `run_id` names): (the run, created)."""
    target = f"run:{run_id}" if run_id else f"workflow:{workflow}"
    action = Action("run.start", target, "operate", {"workflow": workflow, "via": via})

    async def do() -> tuple[RunRow, bool]:
        return await app.client.start_run(workflow, args, kwargs, run_id=run_id, **options)

    def settled(done: tuple[RunRow, bool]) -> Action:
        return replace(action, target=f"run:{done[0].id}").with_detail(created=done[1])

    return await perform(app, who, action, do, settled)


async def cancel(app: App, who: Principal, run_id: str, comment: str = "") -> str:
    """Cancel a run and its children; returns its status."""
    action = Action("run.cancel", f"run:{run_id}", "operate", {"comment": comment})
    return await perform(app, who, action, lambda: app.client.cancel(run_id))


async def pause(app: App, who: Principal, run_id: str, comment: str = "", now: bool = False) -> str:
    """Pause a run (`now`: abort its calls in flight that allow it); returns its status."""
    detail: dict[str, Any] = {"comment": comment, **({"now": True} if now else {})}
    action = Action("run.pause", f"run:{run_id}", "operate", detail)
    return await perform(app, who, action, lambda: app.client.pause(run_id, now=now))


async def resume(app: App, who: Principal, run_id: str, comment: str = "") -> str:
    action = Action("run.resume", f"run:{run_id}", "operate", {"comment": comment})
    return await perform(app, who, action, lambda: app.client.resume(run_id))


async def resolve(
    app: App,
    who: Principal,
    run_id: str,
    step: int | str,
    *,
    value: Any = None,
    retry: bool = False,
    fail: bool = False,
    probe: bool = False,
    comment: str = "",
) -> str:
    """Settle a needs_attention step: a value (none of `retry`, `fail`, `probe`), retry,
    fail, or have the step's probe asked again (`probe`)."""
    how = "retry" if retry else "fail" if fail else "probe" if probe else "value"
    detail = {"step": step, "how": how, "value": value, "comment": comment}
    action = Action("run.resolve", f"run:{run_id}", "operate", detail)

    async def do() -> str:
        return await app.client.resolve(
            run_id, step, value=value, has_value=how == "value", retry=retry, fail=fail,
            probe=probe,
        )  # fmt: skip

    return await perform(app, who, action, do)


async def fork(
    app: App,
    who: Principal,
    run_id: str,
    from_step: int,
    new_id: str | None = None,
    comment: str = "",
) -> RunRow:
    """A new run reusing `run_id`'s first `from_step` outcomes; the action's target is the
    source, the new run's id is in the detail."""
    detail = {"from_step": from_step, "new_id": new_id, "comment": comment}
    action = Action("run.fork", f"run:{run_id}", "operate", detail)

    async def do() -> RunRow:
        return await app.client.fork(run_id, from_step, new_id)

    return await perform(app, who, action, do, lambda run: action.with_detail(new_id=run.id))


async def send_event(
    app: App, who: Principal, run_id: str, name: str, payload: Any = None, key: str | None = None
) -> int:
    """Deliver event `name` to a run (an unknown run is refused before anything is kept)."""
    action = Action("run.event", f"run:{run_id}", "operate", {"event": name, "key": key})

    async def do() -> int:
        await app.client.get(run_id)
        return await app.client.send_event(run_id, name, payload, key=key)

    return await perform(app, who, action, do, lambda eid: action.with_detail(event_id=eid))


AGENT_RUNS = "agent:"  # a spec agent's workflow (agent/loop.py): steered from its start


async def steer(app: App, who: Principal, run_id: str, text: str) -> int:
    """Send a steering message to a run (a spec agent takes it at its next model call);
    its event id. A finished run, or one whose workflow does not take steering, is refused."""
    action = Action("run.steer", f"run:{run_id}", "operate", {"text": text})

    async def do() -> int:
        run = await app.client.latest(run_id)
        takes = run.workflow.startswith(AGENT_RUNS)
        return await app.client.steer(run_id, text, by=who.name, takes=takes)

    return await perform(app, who, action, do, lambda eid: action.with_detail(event_id=eid))


async def emit(
    app: App,
    who: Principal,
    event_type: str,
    payload: Any = None,
    *,
    event_id: str,
    run_id: str | None = None,
) -> list[str]:
    """Ingest an event: start the runs its type triggers, or deliver it to `run_id`."""
    from ..triggers import events

    target = f"run:{run_id}" if run_id else f"event:{event_type}"
    detail = {"event": event_type, "event_id": event_id}
    action = Action("event.emit", target, "operate", detail)

    async def do() -> list[str]:
        emitted = await events.emit(
            app.runtime, event_type, payload, event_id=event_id, run_id=run_id
        )
        return list(emitted.run_ids)

    return await perform(app, who, action, do, lambda ids: action.with_detail(runs=ids))


async def set_pause(
    app: App,
    who: Principal,
    scope: str,
    name: str,
    paused: bool,
    comment: str = "",
    now: bool = False,
) -> bool:
    """Pause or resume a whole workflow or worker (`now`: abort the calls in flight that
    allow it); False if it already was."""
    verb = "pause" if paused else "resume"
    detail: dict[str, Any] = {"comment": comment, **({"now": True} if now and paused else {})}
    action = Action(f"{scope}.{verb}", f"{scope}:{name}", "operate", detail)

    async def do() -> bool:
        if scope not in ("workflow", "worker"):
            raise PerdureError(f"pause: scope {scope!r}: use workflow or worker")
        if now and not paused:
            raise PerdureError("pause: now goes with a pause, not a resume")
        return await app.client.set_pause(scope, name, paused, now=now)

    return await perform(app, who, action, do, lambda changed: action.with_detail(changed=changed))


async def gc(app: App, who: Principal, batch: int = 200) -> GcReport:
    """Delete finished runs beyond their workflow's retention."""
    action = Action("gc", "store", "admin", {"batch": batch})

    def settled(report: GcReport) -> Action:
        return action.with_detail(report=str(report))

    return await perform(app, who, action, lambda: app.client.gc(batch=batch), settled)


async def operate(
    app: App, who: Principal, action: str, run_id: str, comment: str = "", **options: Any
) -> str:
    """cancel | pause | resume | resolve | fork a run by name (the dashboard's and the
    API's verbs); returns the new status (or, for fork, the new run's id)."""
    if action == "cancel":
        return await cancel(app, who, run_id, comment)
    if action == "pause":
        return await pause(app, who, run_id, comment, now=bool(options.get("now")))
    if action == "resume":
        return await resume(app, who, run_id, comment)
    if action == "resolve":
        return await resolve(
            app, who, run_id, options["step"], value=options.get("value"),
            retry=bool(options.get("retry")), fail=bool(options.get("fail")),
            probe=bool(options.get("probe")), comment=comment,
        )  # fmt: skip
    if action == "fork":
        forked = await fork(
            app, who, run_id, int(options["from_step"]), options.get("new_id"), comment
        )
        return forked.id
    raise PerdureError(f"unknown action {action!r}")


# -- schedules, budgets, tokens --------------------------------------------------------------


async def add_schedule(app: App, who: Principal, schedule: Schedule) -> ScheduleRow:
    """Store (add or replace) a schedule."""
    from ..triggers import schedules

    detail = {"workflow": schedule.workflow, "cron": schedule.cron, "every": schedule.every}
    action = Action("schedule.add", f"schedule:{schedule.name}", "admin", detail)
    return await perform(app, who, action, lambda: schedules.add(app.runtime, schedule))


async def pause_schedule(app: App, who: Principal, name: str) -> ScheduleRow:
    from ..triggers import schedules

    action = Action("schedule.pause", f"schedule:{name}", "admin")
    return await perform(app, who, action, lambda: schedules.pause(app.runtime, name))


async def resume_schedule(app: App, who: Principal, name: str) -> ScheduleRow:
    from ..triggers import schedules

    action = Action("schedule.resume", f"schedule:{name}", "admin")
    return await perform(app, who, action, lambda: schedules.resume(app.runtime, name))


async def delete_schedule(app: App, who: Principal, name: str) -> None:
    from ..triggers import schedules

    async def do() -> None:
        await app.runtime.open_store()
        if await Schedules(app.runtime.store).get_schedule(name) is None:
            raise PerdureError(f"no schedule named {name!r} (list them: perdure schedules ls)")
        await schedules.delete(app.runtime, name)

    await perform(app, who, Action("schedule.delete", f"schedule:{name}", "admin"), do)


async def retry_table_changes(app: App, who: Principal, name: str) -> int:
    """Make a table change trigger's refused changes pending again; how many."""

    async def do() -> int:
        await app.runtime.open_store()
        return await Outbox(app.runtime.store).retry_changes(name)

    action = Action("table_change.retry", f"table_change:{name}", "admin")
    return await perform(app, who, action, do)


async def uninstall_table_trigger(app: App, who: Principal, name: str) -> int:
    """Drop a table change trigger from its table (its recorded changes stay)."""

    async def do() -> int:
        await app.runtime.open_store()
        return await Outbox(app.runtime.store).uninstall_table_trigger(name)

    action = Action("table_change.uninstall", f"table_change:{name}", "admin")
    return await perform(app, who, action, do)


async def forget_dead_message(app: App, who: Principal, trigger: str, message_id: str) -> None:
    """Drop a dead message an operator dealt with (it stops showing in `perdure stuck`)."""

    async def do() -> None:
        await app.runtime.open_store()
        if not await DeadMessages(app.runtime.store).forget_dead_message(trigger, message_id):
            raise PerdureError(f"no dead message {message_id!r} of trigger {trigger!r} (list "
                               "them: perdure dead ls)")  # fmt: skip

    action = Action("dead_message.forget", f"message:{trigger}:{message_id}", "operate")
    await perform(app, who, action, do)


def _budget_change(
    target: str, changes: dict[str, Any], reset: bool
) -> tuple[dict[str, Any], Action]:
    """The limits `changes` gives (None: unchanged) and the audited action changing `target`."""
    given = {k: v for k, v in changes.items() if v is not None}
    detail: dict[str, Any] = {"reset": True} if reset else dict(given)
    return given, Action("budget.set", target, "admin", detail)


def _no_limit_given(what: str) -> PerdureError:
    """The error for a budget change that names no limit and no reset."""
    return PerdureError(
        f"{what}: give a limit to change (--tokens-per-hour, --tokens-per-day, "
        "--cost-per-hour, --cost-per-day) or --reset"
    )


async def set_budget(
    app: App, who: Principal, agent: str, changes: dict[str, Any], *, reset: bool = False
) -> int:
    """Change only the limits in `changes` (None: unchanged) of a known agent's stored budget,
    or with `reset` forget it (the spec's is in force again); wakes the parked runs that now
    fit and returns how many."""
    from ..agent import budgets  # the agent layer, only when a budget changes

    given, action = _budget_change(f"agent:{agent}", changes, reset)

    async def do() -> int:
        await app.runtime.open_store()
        await budgets.declared(app.runtime, agent)  # an unknown agent is refused
        if reset:
            return await budgets.set_budget(app.runtime, agent, None)
        if not given:
            raise _no_limit_given(f"budget {agent}")
        stored = await Budgets(app.runtime.store).get_budget(agent)
        return await budgets.set_budget(app.runtime, agent, budgets.merged(agent, stored, given))

    return await perform(app, who, action, do, lambda woken: action.with_detail(woken=woken))


async def set_shared_budget(
    app: App, who: Principal, name: str, changes: dict[str, Any], *, reset: bool = False
) -> int:
    """Change only the limits in `changes` (None: unchanged) of a shared budget some agent's
    spec names (or one already stored), or with `reset` forget them; wakes the parked runs
    of its agents that now fit and returns how many."""
    from ..agent import budgets

    given, action = _budget_change(f"shared:{name}", changes, reset)

    async def do() -> int:
        await app.runtime.open_store()
        await budgets.known_shared(app.runtime, name)  # an unknown shared budget is refused
        if reset:
            return await budgets.set_shared(app.runtime, name, None)
        if not given:
            raise _no_limit_given(f"budget --shared {name}")
        stored = await Budgets(app.runtime.store).get_shared_budget(name)
        return await budgets.set_shared(
            app.runtime, name, budgets.merged_shared(name, stored, given)
        )

    return await perform(app, who, action, do, lambda woken: action.with_detail(woken=woken))


async def create_token(
    app: App, who: Principal, name: str, scopes: Sequence[str]
) -> tuple[str, str]:
    """A new token for `name`: (its id, the token, shown only now; never recorded)."""
    token_id = new_token_id()
    detail = {"name": name, "scopes": " ".join(scopes)}
    action = Action("token.create", f"token:{token_id}", "admin", detail)

    async def do() -> tuple[str, str]:
        check_scopes(list(scopes))
        return await _create_token(app, name, list(scopes), token_id)

    return await perform(app, who, action, do)


async def revoke_token(app: App, who: Principal, token_id: str) -> None:
    """Revoke a token at once (an unknown or already revoked one is refused)."""

    async def do() -> None:
        await app.runtime.open_store()
        if not await Access(app.runtime.store).revoke_token(token_id, app.clock.now()):
            raise PerdureError(f"{token_id}: no such active token (list them: perdure token ls)")

    await perform(app, who, Action("token.revoke", f"token:{token_id}", "admin"), do)


# -- gates ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """A run waiting for a person: approve or deny a tool call, or answer a question."""

    run_id: str
    workflow: str
    kind: str  # "approval" | "question"
    call_id: str
    tool: str
    arguments: dict[str, Any]
    since: float


async def pending_gates(app: App, limit: int = 200) -> list[Gate]:
    """Every run waiting at a gate, with the tool call (or question) it waits on."""
    await app.runtime.open_store()
    gates: list[Gate] = []
    for run in await app.runtime.store.list_runs(statuses=["waiting"], limit=10_000):
        waiting = run.waiting_for or ""
        if waiting.startswith(APPROVE_PREFIX):
            kind, call_id = "approval", waiting[len(APPROVE_PREFIX) :]
        elif waiting.startswith(QUESTION_PREFIX):
            kind, call_id = "question", waiting[len(QUESTION_PREFIX) :]
        else:
            continue
        tool, arguments = await gate_call(app, run.id, call_id)
        gates.append(Gate(run.id, run.workflow, kind, call_id, tool, arguments, run.updated_at))
        if len(gates) >= limit:
            break
    return gates


async def gate_call(app: App, run_id: str, call_id: str) -> tuple[str, dict[str, Any]]:
    """The tool name and arguments a gate waits on (`call_id`), from the model's journaled
    reply; ("", {}) if none is found."""
    for entry in reversed(await app.client.journal(run_id)):
        if entry.kind != "step.outcome" or not entry.data or call_id not in entry.data:
            continue
        value = json.loads(entry.data).get("value") or {}
        for call in (value.get("message") or {}).get("tool_calls") or []:
            if call.get("id") == call_id:
                return str(call.get("name", "")), dict(call.get("arguments") or {})
    return "", {}


async def decide(
    app: App,
    who: Principal,
    run_id: str,
    call_id: str,
    approve: bool,
    comment: str = "",
    *,
    key: str | None = None,
) -> None:
    """Approve or deny a gated tool call (the run continues either way). With `key`, a second
    decision under the same key is dropped by the store (two servers answering one gate)."""
    name = "gate.approve" if approve else "gate.deny"
    action = Action(name, f"run:{run_id}", "approve", {"call": call_id, "comment": comment})

    async def do() -> None:
        await _expect_gate(app, run_id, APPROVE_PREFIX + call_id)
        await app.client.send_event(
            run_id, f"approve:{call_id}", {"approve": approve, "comment": comment}, key=key
        )

    await perform(app, who, action, do)


async def answer(
    app: App, who: Principal, run_id: str, call_id: str, text: str, *, key: str | None = None
) -> None:
    """Answer an agent's question (ask_human); `key` as for `decide`."""
    action = Action("gate.answer", f"run:{run_id}", "approve", {"call": call_id, "answer": text})

    async def do() -> None:
        await _expect_gate(app, run_id, QUESTION_PREFIX + call_id)
        await app.client.send_event(run_id, f"human:{call_id}", text, key=key)

    await perform(app, who, action, do)


async def _expect_gate(app: App, run_id: str, waiting_for: str) -> None:
    run = await app.client.get(run_id)
    if run.status != "waiting" or run.waiting_for != waiting_for:
        raise PerdureError(f"run {run_id!r} is not waiting at that gate (it is {run.status})")
