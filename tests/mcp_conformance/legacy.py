"""Raw JSON-RPC of the 2025-11-25 revision over Streamable HTTP: a session opened with
initialize, then requests answered as JSON or as an SSE stream (both read here)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from serving import ACCEPT

LEGACY = "2025-11-25"


class Session:
    """One 2025-11-25 session with one token (Mcp-Session-Id from initialize)."""

    def __init__(self, url: str, token: str, *, elicitation: bool = False) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}", **ACCEPT}
        self.http = httpx.Client(headers=self.headers, timeout=httpx.Timeout(30, read=120))
        self.next_id = 0
        capabilities = {"elicitation": {}} if elicitation else {}
        opened = self.http.post(url, json=self.body("initialize", {
            "protocolVersion": LEGACY, "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "1"}}))  # fmt: skip
        assert opened.status_code == 200, opened.text
        self.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        self.headers["MCP-Protocol-Version"] = LEGACY
        self.http.headers.update(self.headers)
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert self.http.post(url, json=note).status_code == 202

    def body(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        return {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}

    def post(self, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        return self.http.post(self.url, json=self.body(method, params))

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response message (result or error) to one request, from JSON or SSE."""
        return answer_of(self.post(method, params))

    def close(self) -> None:
        self.http.close()


def answer_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("application/json"):
        found: dict[str, Any] = response.json()
        return found
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if "result" in message or "error" in message:
                return dict(message)
    raise AssertionError(f"no answer in the stream: {response.text[:500]}")
