"""A framework's approvals and questions as perdure gates: durable waits that the CLI
(`perdure send RUN approve:CALL '{"approve": true}'`), the HTTP API, the dashboard and the
MCP server answer, days later if need be, once, audited by the interface that answered.

Before it waits, a gate journals the call it waits on (a `read` step `{agent}.gate` whose
outcome names the call as the agent loop's model replies do), so `GET gates` and the
dashboard's approvals show the tool and its arguments. The answer is the journaled event:
replay returns the same decision, and a second answer finds no gate waiting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine import durable
from ..engine.steps import Step

if TYPE_CHECKING:
    from ..app import App

__all__ = ["Decision", "Gates"]


@dataclass(frozen=True, slots=True)
class Decision:
    """A person's answer to an approval gate."""

    approved: bool
    comment: str = ""


class Gates:
    """The gates of one durable agent, journaled under `{name}.gate`."""

    def __init__(self, app: App, name: str) -> None:
        step_name = f"{name}.gate"
        known = app.runtime.steps.get(step_name)
        if known is not None:
            self._step: Step[..., Any] = Step(known)
        else:

            def gate(kind: str, call_id: str, tool: str, arguments: Any) -> dict[str, Any]:
                call = {"id": call_id, "name": tool, "arguments": arguments}
                return {"kind": kind, "message": {"tool_calls": [call]}}

            self._step = app.step(name=step_name, effect="read")(gate)

    async def approve(self, call_id: str, tool: str, arguments: Any) -> Decision:
        """Wait for a person to approve or deny the call (`approve:{call_id}`)."""
        await self._step("approval", call_id, tool, _args(arguments))
        verdict = await durable.wait_event(f"approve:{call_id}")
        if isinstance(verdict, dict):
            return Decision(verdict.get("approve") is True, str(verdict.get("comment") or ""))
        return Decision(verdict is True)

    async def ask(self, call_id: str, tool: str, arguments: Any) -> Any:
        """Wait for a person's answer to the call (`human:{call_id}`), as sent."""
        await self._step("question", call_id, tool, _args(arguments))
        return await durable.wait_event(f"human:{call_id}")


def _args(arguments: Any) -> dict[str, Any]:
    """The call's arguments as a JSON object (a string that is not one is kept whole)."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            found = json.loads(arguments or "{}")
        except ValueError:
            return {"arguments": arguments}
        return found if isinstance(found, dict) else {"arguments": found}
    return {"arguments": arguments}
