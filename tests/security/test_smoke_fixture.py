"""The fixtures themselves: both servers come up and refuse a request without a token."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from served import Served


def test_serve_answers_and_requires_a_token(serve: Served) -> None:
    with serve.client() as http:
        assert http.get("/api/v1/runs").status_code == 401
    with serve.client("read") as http:
        assert http.get("/api/v1/runs").status_code == 200


def test_mcp_http_requires_a_token(mcp_http: Served) -> None:
    with mcp_http.client() as http:
        assert http.post("/mcp", json={}).status_code == 401


def test_serve_with_options(serve_with: Callable[..., AbstractContextManager[Served]]) -> None:
    with serve_with(env={"HOOK_SECRET": "other"}) as served, served.client("read") as http:
        assert http.get("/api/v1/runs").json()["runs"] == []
