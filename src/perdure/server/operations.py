"""Operator actions for every interface (HTTP API, dashboard, MCP): checked, done, audited.

Each action takes the acting `Principal`, refuses with `Forbidden` unless its
scope allows it, acts through the App, and appends an audit record (who, what,
on which run, when, with the comment). Gates are runs waiting for a person: an
approval (`approve:<call id>`) or a question (`human:<call id>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PerdureError
from .access import Principal, record

if TYPE_CHECKING:
    from ..app import App

APPROVE_PREFIX = "event:approve:"
QUESTION_PREFIX = "event:human:"


class Forbidden(PerdureError):
    """The token's scopes do not allow this action."""


def require(who: Principal, scope: str, action: str) -> None:
    if not who.allows(scope):
        raise Forbidden(
            f"{action} needs the {scope!r} scope; {who.name!r} has {sorted(who.scopes)}"
        )


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
    await app.open_store()
    gates: list[Gate] = []
    for run in await app.store.list_runs(statuses=["waiting"], limit=10_000):
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
    app: App, who: Principal, run_id: str, call_id: str, approve: bool, comment: str = ""
) -> None:
    """Approve or deny a gated tool call (the run continues either way)."""
    require(who, "approve", "approving a gate")
    await _expect_gate(app, run_id, APPROVE_PREFIX + call_id)
    await app.client.send_event(
        run_id, f"approve:{call_id}", {"approve": approve, "comment": comment}
    )
    action = "gate.approve" if approve else "gate.deny"
    await record(app, who.name, action, f"run:{run_id}", {"call": call_id, "comment": comment})


async def answer(app: App, who: Principal, run_id: str, call_id: str, text: str) -> None:
    """Answer an agent's question (ask_human)."""
    require(who, "approve", "answering a question")
    await _expect_gate(app, run_id, QUESTION_PREFIX + call_id)
    await app.client.send_event(run_id, f"human:{call_id}", text)
    await record(app, who.name, "gate.answer", f"run:{run_id}", {"call": call_id, "answer": text})


async def _expect_gate(app: App, run_id: str, waiting_for: str) -> None:
    run = await app.client.get(run_id)
    if run.status != "waiting" or run.waiting_for != waiting_for:
        raise PerdureError(f"run {run_id!r} is not waiting at that gate (it is {run.status})")


async def operate(
    app: App, who: Principal, action: str, run_id: str, comment: str = "", **options: Any
) -> str:
    """cancel | pause | resume | resolve | fork a run, as `who`; returns the new status (or,
    for fork, the new run's id)."""
    require(who, "operate", action)
    client = app.client
    if action == "cancel":
        result = await client.cancel(run_id)
    elif action == "pause":
        result = await client.pause(run_id)
    elif action == "resume":
        result = await client.resume(run_id)
    elif action == "resolve":
        result = await client.resolve(
            run_id, options["step"], value=options.get("value"),
            has_value=not (options.get("retry") or options.get("fail")),
            retry=bool(options.get("retry")), fail=bool(options.get("fail")),
        )  # fmt: skip
    elif action == "fork":
        forked = await client.fork(run_id, int(options["from_step"]), options.get("new_id"))
        result = forked.id
    else:
        raise PerdureError(f"unknown action {action!r}")
    detail = {"comment": comment, **{k: v for k, v in options.items() if v is not None}}
    await record(app, who.name, f"run.{action}", f"run:{run_id}", detail)
    return str(result)
