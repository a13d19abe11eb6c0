"""Issue 35 §6 (in part) against real processes: `GET /api/v1/audit` masks secrets in what it
shows of an action (a comment quoting a key), as the dashboard's audit page does; and
`perdure mcp --http` logs through the redactor (a `?token=pdr_...` in a request line used to
reach its log as written)."""

from __future__ import annotations

from served import Served
from test_mcp_rebinding import ACCEPT, INITIALIZE

KEY = "sk-live0123456789abcdefghijklmnop"


def test_the_audit_api_masks_secrets(serve: Served) -> None:
    operate = {"Authorization": f"Bearer {serve.tokens['operate']}"}
    with serve.client() as http:
        assert http.post("/api/v1/runs", json={"workflow": "waits", "id": "calm"},
                         headers=operate).is_success  # fmt: skip
        comment = f"rotated {KEY}, pasted {serve.tokens['admin']}"
        cancelled = http.post("/api/v1/runs/calm/cancel", headers=operate,
                              json={"comment": comment})  # fmt: skip
        assert cancelled.is_success, cancelled.text
        audit = http.get("/api/v1/audit", headers=operate)
    assert audit.status_code == 200
    assert KEY not in audit.text and serve.tokens["admin"] not in audit.text
    [row] = [r for r in audit.json()["entries"] if r["action"] == "run.cancel"]
    assert row["detail"]["comment"].startswith("rotated sk-***")


def test_mcp_logs_mask_a_token_in_the_request_line(mcp_http: Served) -> None:
    leaked = mcp_http.tokens["read"]
    with mcp_http.client("read") as http:
        answer = http.post(f"/mcp?token={leaked}", json=INITIALIZE, headers=ACCEPT)
        assert answer.status_code in (200, 400, 404), answer.text
        http.post("/mcp", json=INITIALIZE,
                  headers={**ACCEPT, "Authorization": f"Bearer {leaked}x"})  # fmt: skip
    assert leaked not in mcp_http.output(), mcp_http.output()[-2000:]


def test_mcp_access_log_keeps_no_credential_from_a_query(mcp_http: Served) -> None:
    """A credential in a query that is not perdure-token-shaped (a wrong guess, another
    service's key) is masked by its parameter's name in the access log's request line."""
    with mcp_http.client("read") as http:
        for query in ("token=guess-0123456789", "api_key=other-service-9876543210"):
            http.post(f"/mcp?{query}", json=INITIALIZE, headers=ACCEPT)
    output = mcp_http.output()
    assert "guess-0123456789" not in output and "other-service-9876543210" not in output
    assert "/mcp?token=*** " in output and "/mcp?api_key=*** " in output, output[-2000:]


def test_perdure_tail_masks_what_a_step_wrote() -> None:
    """`perdure tail` prints a run's stream through the redactor, as the API's run-output
    stream now does: a key a step printed is shown masked, text and JSON alike."""
    from perdure.cli.tail import line
    from perdure.engine.streams import StreamChunk

    printed = line(StreamChunk(1, "chunk", "out", f"using {KEY}\n", 0.0))
    logged = line(StreamChunk(2, "chunk", "log", {"api_key": KEY, "n": 1}, 0.0))
    assert KEY not in printed and "sk-***" in printed
    assert KEY not in logged and logged.startswith("log: ")
