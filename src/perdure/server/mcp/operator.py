"""Operator tools: an MCP client (a person's assistant, a supervising agent) works the stuck
queue as an operator at the CLI or the dashboard would, under its token's scopes.

| tool | scope | what it does (the CLI's words) |
|---|---|---|
| `perdure_stuck` | read | what waits for a person (`perdure stuck --json`) |
| `perdure_explain` | read | per step, what happened and what recovery would do now |
| `perdure_resolve` | operate | settle a needs_attention step: value, retry, fail or probe |
| `perdure_cancel` | operate | cancel a run and its children |
| `perdure_pause` | operate | pause a run (`now`: abort its calls in flight that allow it) |
| `perdure_resume` | operate | resume a paused or dead run |
| `perdure_fork` | operate | a new run reusing a run's first `from_step` outcomes |
| `perdure_steer` | operate | a message an agent run reads at its next model call |

Each action goes through `operations` (the one route for operator actions), so it is
checked and audited exactly as the same action from the CLI, the API or the dashboard,
with the token's name as the actor; a refusal is audited too. Reads answer the same
objects as the HTTP API (`GET /api/v1/stuck`, `GET /api/v1/runs/{id}/explain`), masked by
`observe.redact`. The tools run at once (`execution.taskSupport: forbidden`); what they
answer, refusals included, is a tool result (`isError` for a refusal), so the model reads
why. Offered with `perdure mcp --operator` (`perdure_steer` also whenever an agent is
served: its runs take steering); `SKILL.md` beside this module tells a model
how to use them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Literal

import mcp.types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...engine.inspection import explain
from ...engine.reasons import cause_of, reason_of
from ...errors import PerdureError, StoreError
from ...observe.redact import Redactor
from .. import operations as ops
from ..access import Principal
from ..answers import explanation
from ..operations import require
from ..stuck import stuck

if TYPE_CHECKING:
    from ...app import App

OPERATOR_PREFIX = "perdure_"
STEER = OPERATOR_PREFIX + "steer"  # also offered, alone, wherever an agent is served


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StuckArgs(_Arguments):
    grace: float = Field(
        60.0, ge=0, description="Seconds past its time before a run nobody moved counts as stuck."
    )


class RunArgs(_Arguments):
    run_id: str = Field(description="The run's id (from perdure_stuck).")


class ActionArgs(RunArgs):
    comment: str = Field("", description="Why, for the audit log (say what you saw).")


class PauseArgs(ActionArgs):
    now: bool = Field(False, description="Also abort its calls in flight that allow it.")


class ResolveArgs(ActionArgs):
    step: int | str = Field(description="The step's position (or name) perdure_explain shows.")
    how: Literal["value", "retry", "fail", "probe"] = Field(
        description=(
            "value: the effect happened, here is what the step returned (give `value`); "
            "retry: it did not happen, run the step again; fail: fail the step (the run's "
            "error handling goes on); probe: ask the step's probe again."
        )
    )
    value: Any = Field(None, description="The step's return value, with how=value.")


class ForkArgs(ActionArgs):
    from_step: int = Field(ge=0, description="Reuse the outcomes of steps before this one.")
    new_id: str | None = Field(None, description="The new run's id (default: a new one).")


class SteerArgs(RunArgs):
    text: str = Field(min_length=1, description="The message the agent reads at its next "
                      "model call: what to do differently, in words.")  # fmt: skip


Act = Callable[["App", Principal, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class OperatorTool:
    """One operator tool: its MCP definition, the scope it needs, its arguments, what it does."""

    tool: types.Tool
    scope: str
    arguments: type[_Arguments]
    act: Act

    @property
    def name(self) -> str:
        return self.tool.name


async def _stuck(app: App, who: Principal, args: StuckArgs) -> dict[str, Any]:
    return await stuck(app, args.grace)


async def _explain(app: App, who: Principal, args: RunArgs) -> dict[str, Any]:
    run = await app.client.get(args.run_id)
    steps = explain(app.runtime, run, await app.runtime.store.journal(run.id))
    found = explanation(run, steps)
    return {**found, "cause": cause_of(run), "reason": Redactor().text(reason_of(run))}


async def _resolve(app: App, who: Principal, args: ResolveArgs) -> dict[str, Any]:
    if args.how == "value" and "value" not in args.model_fields_set:
        raise PerdureError("how=value needs `value`: what the step returned")
    status = await ops.resolve(
        app, who, args.run_id, args.step, value=args.value, retry=args.how == "retry",
        fail=args.how == "fail", probe=args.how == "probe", comment=args.comment,
    )  # fmt: skip
    return {"run_id": args.run_id, "status": status}


async def _cancel(app: App, who: Principal, args: ActionArgs) -> dict[str, Any]:
    return {"run_id": args.run_id, "status": await ops.cancel(app, who, args.run_id, args.comment)}


async def _pause(app: App, who: Principal, args: PauseArgs) -> dict[str, Any]:
    status = await ops.pause(app, who, args.run_id, args.comment, now=args.now)
    return {"run_id": args.run_id, "status": status}


async def _resume(app: App, who: Principal, args: ActionArgs) -> dict[str, Any]:
    return {"run_id": args.run_id, "status": await ops.resume(app, who, args.run_id, args.comment)}


async def _fork(app: App, who: Principal, args: ForkArgs) -> dict[str, Any]:
    run = await ops.fork(app, who, args.run_id, args.from_step, args.new_id, args.comment)
    return {"run_id": run.id, "status": run.status, "forked_from": args.run_id}


async def _steer(app: App, who: Principal, args: SteerArgs) -> dict[str, Any]:
    return {"run_id": args.run_id, "event_id": await ops.steer(app, who, args.run_id, args.text)}


def _tool(
    name: str,
    scope: str,
    arguments: type[_Arguments],
    act: Act,
    description: str,
    *,
    read_only: bool = False,
    destructive: bool = False,
) -> OperatorTool:
    schema = arguments.model_json_schema()
    schema.pop("title", None)
    tool = types.Tool(
        name=OPERATOR_PREFIX + name,
        title=f"perdure {name}",
        description=f"{description} Needs the {scope!r} scope.",
        inputSchema=schema,
        annotations=types.ToolAnnotations(
            readOnlyHint=read_only, destructiveHint=destructive, openWorldHint=False
        ),
        execution=types.ToolExecution(taskSupport=types.TASK_FORBIDDEN),
    )
    return OperatorTool(tool, scope, arguments, act)


def operator_tools() -> dict[str, OperatorTool]:
    """The operator tools, by name (see the table in this module's doc)."""
    made = [
        _tool("stuck", "read", StuckArgs, _stuck,
              "List what waits for a person: runs parked for an operator (a once step in "
              "doubt, a dead run, a step that parked it, a run nobody moves), schedules they "
              "hold back, broker messages that started no run. Each run has its cause, "
              "reason and the fix command.", read_only=True),
        _tool("explain", "read", RunArgs, _explain,
              "Explain a run: per step, its effect, attempts, state and what recovery would "
              "do if the worker died now; with the run's cause and reason.", read_only=True),
        _tool("resolve", "operate", ResolveArgs, _resolve,
              "Settle a step that needs attention: give its value (the effect happened), "
              "retry it (it did not), fail it, or ask its probe again. The run then goes on."),
        _tool("cancel", "operate", ActionArgs, _cancel,
              "Cancel a run and its children.", destructive=True),
        _tool("pause", "operate", PauseArgs, _pause,
              "Pause a run at its next step (it goes on when resumed)."),
        _tool("resume", "operate", ActionArgs, _resume,
              "Resume a paused run, or a dead one (its recovery is tried again)."),
        _tool("fork", "operate", ForkArgs, _fork,
              "Start a new run of the same workflow reusing the first `from_step` outcomes "
              "of a run (the rest runs again)."),
        _tool("steer", "operate", SteerArgs, _steer,
              "Steer a running agent: your message joins its transcript at its next model "
              "call (journaled, given once, even if its worker dies first). Refused for a "
              "finished run or one whose workflow does not take steering."),
    ]  # fmt: skip
    return {tool.name: tool for tool in made}


async def call_operator(
    app: App, who: Principal, tool: OperatorTool, arguments: dict[str, Any]
) -> types.CallToolResult:
    """Check the arguments and the scope, do what the tool does (audited by `operations`);
    its answer, or why it was refused, as a tool result."""
    try:
        args = tool.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return refused(f"{tool.name}: {problems}")
    try:
        if tool.scope == "read":  # actions check their scope in `operations.perform`
            require(who, "read", tool.name)
        answer = await tool.act(app, who, args)
    except StoreError:  # not the caller's fault: a JSON-RPC error, as for every tool
        raise
    except PerdureError as exc:
        return refused(f"{tool.name} refused: {exc}")
    text = json.dumps(answer, indent=2, sort_keys=True, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=answer
    )


def refused(text: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent={"refused": text},
        isError=True,
    )


def skill() -> str:
    """SKILL.md: how a model works the stuck queue with these tools."""
    return files(__package__).joinpath("SKILL.md").read_text(encoding="utf-8")
