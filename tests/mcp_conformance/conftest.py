"""Fixtures of tests/mcp: real `perdure mcp --http` processes (serving.py) on a fresh store."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving import Store, sqlite_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A SQLite store for `perdure mcp --http` processes (`store.serve()`), stopped afterwards."""
    with sqlite_store(tmp_path) as made:
        yield made


@pytest.fixture(scope="session")
def clients() -> Path:
    """The real MCP clients (`scripts/mcp-clients.sh`: the TypeScript SDK, FastMCP 3.x and
    4.x, each in its own folder under .mcp-clients/), installed once and kept."""
    root = Path(__file__).parents[2]
    done = subprocess.run(["bash", str(root / "scripts" / "mcp-clients.sh")],
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert done.returncode == 0, f"installing the MCP clients failed: {done.stderr[-3000:]}"
    return root / ".mcp-clients"
