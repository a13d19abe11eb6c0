"""The MCP tool `perdure_steer`: a client steers a running agent as `perdure steer` does.

Offered when the server serves an agent (`perdure mcp --agent SPEC`). Its call goes
through `operations.steer` (the one route), so it is checked against the caller's
scopes (`operate`) and audited with the caller's name, refusals too. It answers at once
(`execution.taskSupport: forbidden`), as a tool result: `{run_id, event_id}`, or why it
was refused (`isError`), so the model reads the reason.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import mcp.types as types
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import PerdureError, StoreError
from .. import operations as ops
from ..access import Principal

if TYPE_CHECKING:
    from ...app import App

STEER_TOOL = "perdure_steer"


class SteerArgs(BaseModel):
    """The arguments of `perdure_steer`."""

    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(description="The run's id (a task id is a run id).")
    text: str = Field(min_length=1, description="The message the agent reads at its next "
                      "model call: what to do differently, in words.")  # fmt: skip


async def steer_run(app: App, who: Principal, args: SteerArgs) -> dict[str, Any]:
    """Send the steer (checked and audited by `operations.steer`)."""
    return {"run_id": args.run_id, "event_id": await ops.steer(app, who, args.run_id, args.text)}


def steer_tool() -> types.Tool:
    """The tool's MCP definition."""
    schema = SteerArgs.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    return types.Tool(
        name=STEER_TOOL,
        title="perdure steer",
        description=(
            "Steer a running agent: your message joins its transcript at its next model call "
            "(journaled, given once, even if its worker dies first). Refused for a finished "
            "run or one whose workflow does not take steering. Needs the 'operate' scope."
        ),
        inputSchema=schema,
        annotations=types.ToolAnnotations(
            readOnlyHint=False, destructiveHint=False, openWorldHint=False
        ),
        execution=types.ToolExecution(taskSupport=types.TASK_FORBIDDEN),
    )


async def call_steer(app: App, who: Principal, arguments: dict[str, Any]) -> types.CallToolResult:
    """A tools/call of `perdure_steer`: its answer, or why it was refused, as a tool result."""
    try:
        args = SteerArgs.model_validate(arguments)
        answer = await steer_run(app, who, args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        return _refused(f"{STEER_TOOL}: {problems}")
    except StoreError:  # not the caller's fault: a JSON-RPC error, as for every tool
        raise
    except PerdureError as exc:  # not allowed, an unknown or finished run, one not steerable
        return _refused(f"{STEER_TOOL} refused: {exc}")
    text = json.dumps(answer, sort_keys=True)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=answer
    )


def _refused(text: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent={"refused": text},
        isError=True,
    )
