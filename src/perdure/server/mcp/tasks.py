"""Runs seen as MCP tasks: the status mapping, the `Task` a run is, its result, its gate.

A task is a run (the task id is the run id), so any server process on the same
store answers for it, before and after a restart. Status mapping (perdure → MCP):

| run status | task status | statusMessage |
|---|---|---|
| pending, running, sleeping, cancelling | working | what it is doing or waiting for |
| waiting at a gate (`approve:<call>`, `human:<call>`) | input_required | the call or question |
| waiting for anything else (event, child, budget) | working | what it waits for |
| paused | working | paused by an operator |
| needs_attention, dead | working | what an operator must do |
| completed / failed / cancelled | completed / failed / cancelled | the error, for failed |

`needs_attention` and `dead` stay `working`: they are not terminal in perdure (an
operator resolves or resumes the run and it goes on, possibly to completion),
while MCP terminal states are final; nor are they `input_required`, which would
tell the client to answer through `tasks/result`, and the client cannot settle
them: settling an interrupted side effect is an operator's decision (`perdure
resolve`, `perdure resume`). The message says so.

Run data a client sees (results, errors, gate calls and questions) is masked by
`observe.redact`, as the CLI, the API and the dashboard show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import mcp.types as types

from ...engine.client import unblob_text
from ...engine.reasons import cause_of, reason_of
from ...observe.redact import Redactor
from ...store.base import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    DEAD,
    FAILED,
    NEEDS_ATTENTION,
    PAUSED,
    PENDING,
    RUNNING,
    SLEEPING,
    WAITING,
    RunRow,
)
from ..operations import APPROVE_PREFIX, QUESTION_PREFIX, gate_call

if TYPE_CHECKING:
    from ...app import App

TASK_PREFIX = "mcp:"  # runs started by a tools/call have the id `mcp:<uuid>`
DEFAULT_POLL_MS = 500
FOREVER_MS = 365 * 86_400_000  # the ttl of a run kept until an operator deletes it

_FINAL_STATUS: dict[str, types.TaskStatus] = {
    COMPLETED: types.TASK_STATUS_COMPLETED,
    FAILED: types.TASK_STATUS_FAILED,
    CANCELLED: types.TASK_STATUS_CANCELLED,
}


@dataclass(frozen=True)
class GateQuestion:
    """A run waiting at a gate, as the MCP client is asked about it."""

    kind: str  # "approval" | "question"
    call_id: str
    tool: str
    arguments: dict[str, Any]
    message: str  # the statusMessage and the elicitation's message

    def schema(self) -> dict[str, Any]:
        """The elicitation form (flat, primitive properties, as the spec requires)."""
        if self.kind == "approval":
            return {
                "type": "object",
                "properties": {
                    "approve": {"type": "boolean", "title": "Approve",
                                "description": "Let the tool call run (false: deny it)."},
                    "comment": {"type": "string", "title": "Comment",
                                "description": "Why (shown to the agent on a denial)."},
                },
                "required": ["approve"],
            }  # fmt: skip
        return {
            "type": "object",
            "properties": {"answer": {"type": "string", "title": "Answer"}},
            "required": ["answer"],
        }


async def gate_of(app: App, run: RunRow) -> GateQuestion | None:
    """The gate `run` waits at (an approval or a question), or None."""
    waiting = run.waiting_for or ""
    if run.status != WAITING:
        return None
    if waiting.startswith(APPROVE_PREFIX):
        call_id = waiting[len(APPROVE_PREFIX) :]
        tool, arguments = await gate_call(app, run.id, call_id)
        shown = json.dumps(Redactor().value(arguments), sort_keys=True)
        shown = shown if len(shown) <= 400 else shown[:400] + "…"
        message = f"Approve the call {tool or 'tool'}({shown}) of run {run.id}?"
        return GateQuestion("approval", call_id, tool, arguments, message)
    if waiting.startswith(QUESTION_PREFIX):
        call_id = waiting[len(QUESTION_PREFIX) :]
        tool, arguments = await gate_call(app, run.id, call_id)
        question = str(arguments.get("question") or f"Run {run.id} asks for an answer.")
        question = Redactor().text(question)
        return GateQuestion("question", call_id, tool, arguments, question)
    return None


def status_of(run: RunRow, gate: GateQuestion | None) -> tuple[types.TaskStatus, str | None]:
    """The task status and statusMessage of a run (see the table in this module's doc)."""
    status = run.status
    if status in _FINAL_STATUS:
        message = None
        if status == FAILED:
            message = error_text(run)
        elif status == CANCELLED:
            message = "cancelled"
        return _FINAL_STATUS[status], message
    if gate is not None:
        return types.TASK_STATUS_INPUT_REQUIRED, gate.message
    if status == PENDING:
        message = "pending: waiting for a worker"
    elif status == RUNNING:
        message = "running"
    elif status == SLEEPING:
        message = f"sleeping until {_iso(run.wake_at)}" if run.wake_at else "sleeping"
    elif status == WAITING:
        message = f"waiting for {run.waiting_for or 'an event'}"
    elif status == CANCELLING:
        message = "cancelling: it stops at its next step"
    elif status == PAUSED:
        message = "paused by an operator; it goes on when resumed"
    elif status == NEEDS_ATTENTION:
        said = Redactor().text(reason_of(run)) or "a step was interrupted mid-effect"
        probe = " | --probe" if cause_of(run) == "probe" else ""  # its probe can be asked again
        message = (
            f"needs_attention: {said}; an operator must settle it "
            f"(perdure resolve {run.id} STEP --value JSON | --retry | --fail{probe})"
        )
    elif status == DEAD:
        message = (
            "dead: its recoveries kept crashing workers; an operator must resume it "
            f"(perdure resume {run.id}) or cancel it"
        )
    else:
        message = status
    return types.TASK_STATUS_WORKING, message


def error_text(run: RunRow) -> str:
    """`Type: message` of a failed run's error (never its traceback)."""
    kind, message = _error(run)
    return f"{kind}: {message}" if kind else message


def _error(run: RunRow) -> tuple[str, str]:
    redactor = Redactor()
    try:
        error = redactor.value(json.loads(run.error)) if run.error else None
    except json.JSONDecodeError:
        return "", redactor.text(run.error or "")
    if isinstance(error, dict):
        return str(error.get("type") or ""), str(error.get("message") or "")
    return "", "" if error is None else str(error)


def ttl_ms(app: App, run: RunRow) -> int:
    """How long the run is kept, from its workflow's retention: `keep_days` (a lower bound,
    since it counts from the end of the run), else `FOREVER_MS`.

    The spec allows null (unlimited), but the SDK drops null fields when it
    serialises a result and its client then refuses the task, so it is a number.
    A `keep_last`-only policy has no time bound and also reports `FOREVER_MS`.
    """
    definition = app.runtime.workflows.get(run.workflow)
    retention = definition.retention if definition else None
    if retention is None or retention.keep_days is None:
        return FOREVER_MS
    return int(retention.keep_days * 86_400_000)


async def task_of(app: App, run: RunRow, poll_ms: int = DEFAULT_POLL_MS) -> types.Task:
    """The MCP task a run is."""
    status, message = status_of(run, await gate_of(app, run))
    return types.Task(
        taskId=run.id,
        status=status,
        statusMessage=message,
        createdAt=_time(run.created_at),
        lastUpdatedAt=_time(max(run.updated_at, run.created_at)),
        ttl=ttl_ms(app, run),
        pollInterval=poll_ms,
    )


async def tool_result(app: App, run: RunRow) -> types.CallToolResult:
    """What the tools/call would have returned: the run's result, or its error (isError).

    A JSON object result is the structuredContent as it is; any other value is
    wrapped as `{"result": value}`. The text content is the string itself, or the JSON.
    """
    if run.status == COMPLETED:
        text = await unblob_text(app.runtime.store, run.result)
        value = Redactor().value(json.loads(text)) if text else None
        shown = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)
        structured = value if isinstance(value, dict) else {"result": value}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=shown)], structuredContent=structured
        )
    if run.status == FAILED:
        kind, message = _error(run)
        text = f"run {run.id} failed: {error_text(run)}"
        structured = {"run_id": run.id, "status": run.status,
                      "error": {"type": kind, "message": message}}  # fmt: skip
    else:
        text = f"run {run.id} was {run.status}"
        structured = {"run_id": run.id, "status": run.status}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=structured,
        isError=True,
    )


def _time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _iso(ts: float | None) -> str:
    return _time(ts or 0.0).isoformat(timespec="seconds")
