"""Fixtures of tests/security/: each test meets a real server process (see served.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from served import Served, start


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Served]:
    """`perdure serve` on a free port of 127.0.0.1, its store fresh, a token per scope."""
    yield from start(tmp_path, ["serve"], "/healthz")


@pytest.fixture
def serve_with(tmp_path: Path) -> Callable[..., AbstractContextManager[Served]]:
    """`perdure serve` with extra options and environment, stopped when the block ends:
    `with serve_with("--metrics-public", env={...}) as served: ...`."""

    def made(*options: str, env: dict[str, str] | None = None) -> AbstractContextManager[Served]:
        return contextmanager(start)(tmp_path, ["serve", *options], "/healthz", env)

    return made


@pytest.fixture
def mcp_http(tmp_path: Path) -> Iterator[Served]:
    """`perdure mcp --http` on a free port of 127.0.0.1 (endpoint /mcp), a token per scope."""
    yield from start(tmp_path, ["mcp", "--http"], "/mcp")


@pytest.fixture
def mcp_http_with(tmp_path: Path) -> Callable[..., AbstractContextManager[Served]]:
    """`perdure mcp --http` with extra options and environment, stopped when the block ends:
    `with mcp_http_with("--allowed-host", "mcp.example") as served: ...`."""

    def made(*options: str, env: dict[str, str] | None = None) -> AbstractContextManager[Served]:
        return contextmanager(start)(tmp_path, ["mcp", "--http", *options], "/mcp", env)

    return made
