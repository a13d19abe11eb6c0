"""A tiny MCP server for the tool tests: stdio by default, Streamable HTTP with `--http PORT`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP

server = FastMCP("fixture")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def touch(path: str) -> str:
    """Create a file (the tests check whether a call really ran)."""
    Path(path).write_text("touched")
    return f"touched {path}"


@server.tool()
def find_touched(path: str) -> str:
    """Whether `touch` created the file: a probe's answer, as JSON."""
    if Path(path).exists():
        return json.dumps({"done": True, "value": f"touched {path}"})
    return json.dumps({"done": False})


@server.tool()
def boom() -> str:
    """Always fail."""
    raise ValueError("boom on purpose")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.settings.host = "127.0.0.1"
        server.settings.port = int(sys.argv[2])
        server.run(transport="streamable-http")
    else:
        server.run()
