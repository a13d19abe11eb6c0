"""Tools from MCP servers (stdio or Streamable HTTP), through the official `mcp` SDK.

    tools = await mcp_tools(McpServer("files", command="uvx", args=("mcp-server-git",)))

Each server tool becomes a `Tool` named `<server>__<tool>` (grant one by name, or
all with `"<server>__*"`), with the server's input schema and the effect the spec
declares for the server (default `once`; per tool in `effects`). The server's own
hints (readOnlyHint, ...) are not trusted for recovery. Each call opens its own
session, so a call after a crash or on another worker needs nothing from before.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...extras import require_extra
from ..messages import ToolSpec
from .base import Tool, ToolContext, ToolEffect, ToolFailed, check_tool_effect
from .boundary import ToolRefused

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp import types as mcp_types

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,30}$")


@dataclass(frozen=True)
class McpServer:
    """One MCP server: `command` (+ `args`, `env`, `cwd`) for stdio, or `url` for Streamable
    HTTP (+ `headers`). `effect` applies to its tools unless `effects` names one."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None  # added to a minimal safe environment
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    effect: ToolEffect = "once"
    effects: Mapping[str, ToolEffect] = field(default_factory=dict)
    timeout: float = 60.0  # seconds per request

    def __post_init__(self) -> None:
        where = f"MCP server {self.name!r}"
        if not _SERVER_NAME.match(self.name):
            raise ConfigError(f"{where}: names are 1-30 of A-Z a-z 0-9 _ -")
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"{where}: give either command (stdio) or url (Streamable HTTP)")
        for effect in (self.effect, *self.effects.values()):
            check_tool_effect(effect, where)


async def mcp_tools(server: McpServer) -> list[Tool]:
    """The tools the server lists, as Tools (nothing is granted by listing).

    Raises:
        ConfigError: the mcp extra is missing, or the server cannot be reached or listed.
    """
    try:
        async with _session(server) as session:
            listed: list[mcp_types.Tool] = []
            cursor: str | None = None
            while True:
                page = await session.list_tools(cursor)
                listed.extend(page.tools)
                cursor = page.nextCursor
                if not cursor:
                    break
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"MCP server {server.name!r}: cannot list tools: {_why(exc)}") from exc
    tools: dict[str, Tool] = {}
    for remote in listed:
        made = McpTool(server, remote)
        if made.name in tools:
            raise ConfigError(f"MCP server {server.name!r}: two tools map to {made.name!r}")
        tools[made.name] = made
    return list(tools.values())


class McpTool(Tool):
    """One tool of an MCP server, executed with `tools/call` on a fresh session."""

    def __init__(self, server: McpServer, remote: mcp_types.Tool) -> None:
        self.server = server
        self.remote_name = remote.name
        self.name = f"{server.name}__{_UNSAFE.sub('_', remote.name)}"[:64]
        self.description = remote.description or remote.title or remote.name
        self.effect = server.effects.get(remote.name, server.effect)
        self.permissions = (f"mcp:{server.name}",)
        self.destructive = self.effect != "read"
        schema = dict(remote.inputSchema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self._schema = schema

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self._schema)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """A light check (object, required keys, no unknown keys when the schema forbids
        them); the server validates types itself and answers errors the model sees."""
        if not isinstance(arguments, Mapping):
            raise ToolRefused(f"{self.name}: arguments must be a JSON object")
        properties = self._schema.get("properties") or {}
        missing = [k for k in self._schema.get("required") or [] if k not in arguments]
        if missing:
            raise ToolRefused(f"invalid arguments for {self.name}: missing {', '.join(missing)}")
        if self._schema.get("additionalProperties") is False:
            unknown = [k for k in arguments if k not in properties]
            if unknown:
                raise ToolRefused(
                    f"invalid arguments for {self.name}: unknown {', '.join(unknown)}"
                )
        return dict(arguments)

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> Any:
        try:
            async with _session(self.server) as session:
                result = await session.call_tool(self.remote_name, dict(arguments))
        except ConfigError:
            raise
        except Exception as exc:
            raise ToolFailed(f"MCP server {self.server.name!r}: {_why(exc)}") from exc
        text = _result_text(result)
        if result.isError:
            raise ToolFailed(text or f"{self.remote_name} failed")
        return text


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[ClientSession]:
    """An initialized client session to the server, closed (process stopped) on exit."""
    require_extra("mcp", f"the spec's MCP server {server.name!r}")
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    timeout = timedelta(seconds=server.timeout)
    async with AsyncExitStack() as stack:
        if server.command is not None:
            params = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                env=dict(server.env) if server.env is not None else None,
                cwd=server.cwd,
            )
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            import httpx

            client = httpx.AsyncClient(
                headers=dict(server.headers or {}),
                timeout=httpx.Timeout(server.timeout, read=server.timeout),
            )
            await stack.enter_async_context(client)
            assert server.url is not None
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(server.url, http_client=client)
            )
        session = await stack.enter_async_context(
            ClientSession(read, write, read_timeout_seconds=timeout)
        )
        await session.initialize()
        yield session


def _result_text(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
            parts.append(str(block.resource.text))  # type: ignore[union-attr]
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind} {getattr(block, 'mimeType', '')}]".replace(" ]", "]"))
    if not parts and result.structuredContent is not None:
        return json.dumps(result.structuredContent, ensure_ascii=False)
    return "\n".join(parts)


def _why(exc: BaseException) -> str:
    """The innermost single cause (the SDK wraps errors in task-group exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"
