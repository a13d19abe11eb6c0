"""The toolbox an agent runs with: what is offered, what is refused, what needs approval.

Deny by default: a tool the spec does not grant is never offered to the model,
and a call to it (or to a tool that does not exist, or with bad arguments, or
outside the boundary) is prepared as a `Refusal`: the loop journals it and
answers the model with `refusal.text`, without executing anything.

    prepared = toolbox.prepare(call)
    if isinstance(prepared, Refusal): answer(prepared.text)
    elif toolbox.needs_approval(prepared): open a gate, then execute
    else: answer(await toolbox.execute(prepared, toolbox.context(call.id)))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from ...errors import ConfigError
from ..messages import ToolCall, ToolSpec
from .base import Memory, Tool, ToolContext, ToolEffect, ToolFailed
from .boundary import Boundary, ToolRefused

REFUSED = "refused: "
ERROR = "error: "


@dataclass(frozen=True)
class PreparedCall:
    """A granted call with validated arguments, inside the boundary; ready to execute."""

    call: ToolCall
    tool: Tool
    arguments: dict[str, Any]
    effect: ToolEffect  # of this call (an HTTP GET is `read`, a POST `once`)


@dataclass(frozen=True)
class Refusal:
    """A call that is not executed; `text` is what the model is told."""

    call: ToolCall
    reason: str

    @property
    def text(self) -> str:
        return REFUSED + self.reason


class Toolbox:
    """The tools an agent may use within its boundary.

    `effects`: the effect of a tool's calls where the spec declares one (`[tools.effects]`),
    over the tool's own.

    Raises:
        ConfigError: two tools share a name.
    """

    def __init__(
        self,
        tools: Iterable[Tool],
        boundary: Boundary,
        effects: Mapping[str, ToolEffect] | None = None,
    ) -> None:
        self.boundary = boundary
        self.effects = dict(effects or {})  # declared by the spec, over the tools' own
        self.tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self.tools:
                raise ConfigError(f"two tools are named {item.name!r}; rename one")
            self.tools[item.name] = item

    def is_granted(self, name: str) -> bool:
        """Whether the tool exists, the spec grants it and the boundary gives what it needs."""
        found = self.tools.get(name)
        return (
            found is not None
            and self.boundary.grants(name)
            and all(self.boundary.allows(p) for p in found.permissions)
        )

    def offered(self) -> list[ToolSpec]:
        """The specs of the granted tools, the only ones the model is shown."""
        return [t.spec() for name, t in self.tools.items() if self.is_granted(name)]

    def prepare(self, call: ToolCall) -> PreparedCall | Refusal:
        """Validate a call and check it against the boundary, without executing it."""
        found = self.tools.get(call.name)
        if found is None or not self.boundary.grants(call.name):
            return Refusal(call, f"tool {call.name!r} is not granted")
        missing = [p for p in found.permissions if not self.boundary.allows(p)]
        if missing:
            return Refusal(call, f"tool {call.name!r} needs {', '.join(missing)}, not granted")
        try:
            arguments = found.validate(call.arguments)
            found.guard(self.boundary, arguments)
        except ToolRefused as exc:
            return Refusal(call, str(exc))
        effect = self.effects.get(call.name) or found.effect_for(arguments)
        return PreparedCall(call, found, arguments, effect)

    def needs_approval(self, call: ToolCall | PreparedCall) -> bool:
        """Whether a human must approve the call first: the tool is named in the spec's
        `approval_required`, or that lists `"*"` and the call is destructive (a destructive
        tool's `read` call, such as an HTTP GET, is not)."""
        name = call.call.name if isinstance(call, PreparedCall) else call.name
        found = self.tools.get(name)
        if found is None:
            return False
        if name in self.boundary.approval_required:
            return True
        if "*" not in self.boundary.approval_required or not found.destructive:
            return False
        return found.effect_for(call.arguments) != "read"

    def context(self, call_id: str, memory: Memory | None = None) -> ToolContext:
        """The context a call executes with."""
        return ToolContext(boundary=self.boundary, memory=memory, call_id=call_id)

    async def execute(self, prepared: PreparedCall, ctx: ToolContext) -> str:
        """Run a prepared call; returns the text the model is shown.

        A refusal inside the tool gives `"refused: ..."`, a `ToolFailed` `"error: ..."`;
        any other exception propagates (the durable step around the call retries or
        records it).
        """
        tool = prepared.tool
        if self.tools.get(tool.name) is not tool or not self.is_granted(tool.name):
            return f"{REFUSED}tool {tool.name!r} is not granted"
        try:
            tool.guard(ctx.boundary, prepared.arguments)
            result = await tool.invoke(ctx, prepared.arguments)
        except ToolRefused as exc:
            return f"{REFUSED}{exc}"
        except ToolFailed as exc:
            return f"{ERROR}{exc}"
        return render(result)


def render(result: Any) -> str:
    """A tool's result as the text the model reads: strings as they are, the rest as JSON."""
    if isinstance(result, str):
        return result
    return json.dumps(to_jsonable_python(result, fallback=str), ensure_ascii=False)
