"""DNS rebinding against a real `perdure mcp --http` (and `perdure serve`): a request whose Host
or Origin is not the server's is refused before its token is even looked at; the right
Host, with or without a same-origin Origin, reaches the usual 401/200, and wrong tokens there
are limited per address (429)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import httpx
from served import Served

ServedWith = Callable[..., AbstractContextManager[Served]]
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "sec", "version": "1"}},
}  # fmt: skip
ACCEPT = {"Accept": "application/json, text/event-stream"}


def initialize(served: Served, scope: str | None, **headers: str) -> httpx.Response:
    with served.client(scope) as http:
        return http.post("/mcp", json=INITIALIZE, headers={**ACCEPT, **headers})


def one_line_error(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    assert response.text.count("\n") == 1 and response.text.endswith("\n")
    error: str = response.json()["error"]
    return error


def test_a_foreign_host_is_refused_before_the_token(mcp_http: Served) -> None:
    for scope in (None, "admin"):
        response = initialize(mcp_http, scope, Host="evil.example")
        assert response.status_code == 421
        assert "'evil.example' is not served here" in one_line_error(response)
    with_port = initialize(mcp_http, "admin", Host=f"evil.example:{mcp_http.port}")
    assert with_port.status_code == 421
    other_port = initialize(mcp_http, "admin", Host="127.0.0.1:1")  # our address, not our port
    assert other_port.status_code == 421


def test_a_foreign_origin_is_refused(mcp_http: Served) -> None:
    for origin in ("http://evil.example", f"http://evil.example:{mcp_http.port}", "null"):
        response = initialize(mcp_http, "admin", Origin=origin)
        assert response.status_code == 403, origin
        assert "may not call this server" in one_line_error(response)


def test_the_right_host_reaches_authentication(mcp_http: Served) -> None:
    """No Origin (a non-browser client) or our own: 401 without a token, 200 with one;
    localhost and [::1] name the loopback server too."""
    assert initialize(mcp_http, None).status_code == 401
    assert initialize(mcp_http, "read").status_code == 200
    own = f"http://127.0.0.1:{mcp_http.port}"
    assert initialize(mcp_http, "read", Origin=own).status_code == 200
    for host in (f"localhost:{mcp_http.port}", f"[::1]:{mcp_http.port}"):
        assert initialize(mcp_http, "read", Host=host).status_code == 200, host


def test_an_allowed_host_name_is_served(mcp_http_with: ServedWith) -> None:
    with mcp_http_with("--allowed-host", "MCP.example") as served:
        assert initialize(served, None, Host="mcp.example").status_code == 401
        assert initialize(served, "read", Host="mcp.example:443",
                          Origin="https://mcp.example").status_code == 200  # fmt: skip
        assert initialize(served, "read", Host="evil.example").status_code == 421


def test_perdure_serve_checks_host_too(serve: Served) -> None:
    """The dashboard is a browser target as well (its Origin it judges itself: CSRF)."""
    with serve.client("read") as http:
        for path in ("/healthz", "/ui/", "/api/v1/runs"):
            refused = http.get(path, headers={"Host": "evil.example"})
            assert refused.status_code == 421, path
            assert "--allowed-host" in one_line_error(refused)
        assert http.get("/api/v1/runs", headers={"Host": f"localhost:{serve.port}"}).is_success
        assert http.get("/api/v1/runs", headers={"Host": "127.0.0.1"}).is_success  # no port


def test_wrong_tokens_to_mcp_are_limited_per_address(mcp_http: Served) -> None:
    """`perdure mcp --http` limits wrong tokens as `perdure serve` does: after 20 a minute
    from one address, 429 with Retry-After; the token that worked before still works."""
    assert initialize(mcp_http, "read").status_code == 200
    with mcp_http.client() as http:
        codes = [
            http.post("/mcp", json=INITIALIZE,
                      headers={**ACCEPT, "Authorization": f"Bearer pdr_guess{i}"}).status_code
            for i in range(25)
        ]  # fmt: skip
        held = http.post("/mcp", json=INITIALIZE,
                         headers={**ACCEPT, "Authorization": "Bearer pdr_more"})  # fmt: skip
    assert codes[:20] == [401] * 20 and codes[20:] == [429] * 5, codes
    assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1
    assert "too many failed sign-ins" in held.json()["error"]
    assert initialize(mcp_http, "read").status_code == 200
