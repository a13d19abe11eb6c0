"""An Agents SDK agent's MCP servers made durable: each `call_tool` is a perdure step named
after the agent and the tool, with the tool's effect; listing tools, approval policies and
the session stay the server's own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agents.mcp import MCPServer
from mcp.types import CallToolResult

from ..engine.steps import Step

__all__ = ["DurableMCPServer", "mcp_call"]


async def mcp_call(
    call: Callable[[], Awaitable[CallToolResult]], arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The body of an MCP tool step: the server's answer, as JSON (`arguments`: the call's,
    for the tool's probe)."""
    return (await call()).model_dump(mode="json", by_alias=True, exclude_none=True)


class DurableMCPServer(MCPServer):
    """An agent's MCP server whose `call_tool` is a step with the tool's effect; everything
    else (its tools, its approval policy, its session) is the server's own."""

    def __init__(self, inner: MCPServer, step_of: Callable[[str, str], Step[..., Any]]) -> None:
        # no super().__init__(): every attribute but call_tool is read from `inner`
        self.inner = inner
        self._step_of = step_of

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    async def connect(self) -> None:
        await self.inner.connect()  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        await self.inner.cleanup()  # type: ignore[no-untyped-call]

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[Any]:
        return await self.inner.list_tools(run_context, agent)

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        step = self._step_of(self.inner.name, tool_name)
        data = await step(lambda: self.inner.call_tool(tool_name, arguments, meta), arguments)
        return CallToolResult.model_validate(data)

    async def list_prompts(self) -> Any:
        return await self.inner.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self.inner.get_prompt(name, arguments)
