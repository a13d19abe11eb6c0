"""Issue 35 §10 against a real `perdure mcp --http`: a `tasks/get` naming another token's
session is answered as the SDK answers any request on a session its credential did not open
(404, as if it did not exist), not on the fast path that made the other session follow the
task (and its client answer the task's gate with its own scope). The session's own token is
still answered there."""

from __future__ import annotations

import httpx
from served import Served
from test_mcp_rebinding import ACCEPT, INITIALIZE


def test_tasks_get_on_another_tokens_session_is_not_found(mcp_http: Served) -> None:
    with mcp_http.client("admin") as admin:
        opened = admin.post("/mcp", json=INITIALIZE, headers=ACCEPT)
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        ready = {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert admin.post("/mcp", json=note, headers=ready).status_code in (200, 202)
        get = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "mcp-x"}}
        own = admin.post("/mcp", json=get, headers=ready)
        assert own.status_code == 200 and "error" in own.json(), own.text  # no such task
    for scope in ("read", None):
        headers = dict(ready)
        if scope:
            headers["Authorization"] = f"Bearer {mcp_http.tokens[scope]}"
        with httpx.Client(base_url=mcp_http.url, timeout=10) as other:
            answer = other.post("/mcp", json=get, headers=headers)
        assert answer.status_code in (401, 404), (scope, answer.status_code, answer.text)
        assert answer.status_code == (404 if scope else 401)
