"""MCP tools: a FastMCP server's tools are listed, granted by name and called, over stdio and
Streamable HTTP; ungranted ones are never offered nor called."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from extras_needed import needs
from local_servers import free_port, wait_listening

pytest.importorskip("mcp", reason=needs("mcp"))

from perdure.agent.messages import ToolCall
from perdure.agent.tools import Boundary, PreparedCall, Refusal, Tool, Toolbox
from perdure.agent.tools.mcp import McpServer, mcp_tools
from perdure.errors import ConfigError

FIXTURE = str(Path(__file__).with_name("mcp_server_fixture.py"))
STDIO = McpServer("fx", command=sys.executable, args=(FIXTURE,), effects={"add": "read"})


def execute(toolbox: Toolbox, name: str, **arguments: object) -> str:
    tool_call = ToolCall(id=f"c-{name}", name=name, arguments=dict(arguments))
    prepared = toolbox.prepare(tool_call)
    if isinstance(prepared, Refusal):
        return prepared.text
    return asyncio.run(toolbox.execute(prepared, toolbox.context(tool_call.id)))


@pytest.fixture(scope="module")
def stdio_tools() -> list[Tool]:
    """The fixture server's tools, listed over stdio (once for the module)."""
    return asyncio.run(mcp_tools(STDIO))


def test_stdio_tools_are_listed_with_schema_and_effect(stdio_tools: list[Tool]) -> None:
    """Each server tool becomes `<server>__<tool>` with the server's schema and declared effect."""
    by_name = {t.name: t for t in stdio_tools}
    assert set(by_name) == {"fx__add", "fx__touch", "fx__find_touched", "fx__boom"}
    add = by_name["fx__add"]
    spec = add.spec()
    assert spec.description == "Add two integers."
    assert spec.parameters["required"] == ["a", "b"]
    assert spec.parameters["properties"]["a"]["type"] == "integer"
    assert add.effect == "read"
    assert not add.destructive
    assert by_name["fx__touch"].effect == "once"  # the server's default
    assert by_name["fx__touch"].destructive


def test_stdio_tool_is_called(stdio_tools: list[Tool]) -> None:
    """A granted MCP tool executes through the server and returns its text."""
    toolbox = Toolbox(stdio_tools, Boundary(granted=["fx__*"]))
    assert execute(toolbox, "fx__add", a=2, b=40) == "42"
    assert execute(toolbox, "fx__boom").startswith("error: ")
    assert "boom on purpose" in execute(toolbox, "fx__boom")
    assert execute(toolbox, "fx__add", a=2).startswith("refused: invalid arguments")


def test_ungranted_mcp_tool_is_not_offered_nor_called(
    stdio_tools: list[Tool], tmp_path: Path
) -> None:
    """Only the granted server tool is offered; a call to another never reaches the server."""
    marker = tmp_path / "marker"
    toolbox = Toolbox(stdio_tools, Boundary(granted=["fx__add"]))
    assert [s.name for s in toolbox.offered()] == ["fx__add"]
    assert execute(toolbox, "fx__touch", path=str(marker)) == (
        "refused: tool 'fx__touch' is not granted"
    )
    assert not marker.exists()
    granted = Toolbox(stdio_tools, Boundary(granted=["fx__touch"]))
    prepared = granted.prepare(ToolCall(id="t", name="fx__touch", arguments={"path": str(marker)}))
    assert isinstance(prepared, PreparedCall)
    assert granted.needs_approval(prepared) is False
    asyncio.run(granted.execute(prepared, granted.context("t")))
    assert marker.read_text() == "touched"  # the same call, granted, does run


def test_unreachable_server_is_a_config_error() -> None:
    """A server that cannot start is reported as one ConfigError line naming it."""
    broken = McpServer("gone", command=sys.executable, args=("-c", "raise SystemExit(3)"))
    with pytest.raises(ConfigError, match="'gone'"):
        asyncio.run(asyncio.wait_for(mcp_tools(broken), 30))


def test_server_config_is_checked() -> None:
    """A server needs exactly one transport and known effects."""
    with pytest.raises(ConfigError):
        McpServer("x")
    with pytest.raises(ConfigError):
        McpServer("x", command="a", url="http://b")
    with pytest.raises(ConfigError):
        McpServer("x", command="a", effect="sometimes")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The fixture server over Streamable HTTP on 127.0.0.1."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, FIXTURE, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process, within=20)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def test_streamable_http_tool_is_listed_and_called(http_url: str) -> None:
    """The same tools work over Streamable HTTP."""
    tools = asyncio.run(mcp_tools(McpServer("web", url=http_url)))
    assert {t.name for t in tools} == {"web__add", "web__touch", "web__find_touched", "web__boom"}
    toolbox = Toolbox(tools, Boundary(granted=["web__add"]))
    assert execute(toolbox, "web__add", a=1, b=2) == "3"
