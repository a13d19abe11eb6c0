"""Issue 35 §2 against a real `perdure serve` and `perdure mcp --http`: `X-Forwarded-For` is
believed only from a proxy the operator names (`--trusted-proxy`), so a local client can
neither dodge the wrong-token limit by rotating the header nor lock another address out by
naming it; and the limit never refuses a valid token, even one this process has not seen."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import httpx
from served import Served, form_csrf
from test_mcp_rebinding import ACCEPT, INITIALIZE

ServedWith = Callable[..., AbstractContextManager[Served]]


def wrong(http: httpx.Client, i: int, path: str = "/api/v1/runs", **headers: str) -> int:
    guess = {"Authorization": f"Bearer pdr_guess{i}", **headers}
    if path == "/mcp":
        return http.post(path, json=INITIALIZE, headers={**ACCEPT, **guess}).status_code
    return http.get(path, headers=guess).status_code


def test_rotated_forwarded_addresses_still_hit_the_limit(serve: Served) -> None:
    """40 wrong tokens, each claiming another X-Forwarded-For: the 21st on is 429 (the
    header of an unnamed proxy is ignored); a client that names 10.9.9.9 locks nobody out
    there."""
    with serve.client() as http:
        codes = [wrong(http, i, **{"X-Forwarded-For": f"10.0.{i}.1"}) for i in range(40)]
        assert codes[:20] == [401] * 20 and codes[20:] == [429] * 20, codes
    assert "10.0." not in serve.output()


def test_a_valid_token_never_seen_before_passes_a_held_back_address(serve: Served) -> None:
    """The address is held back (429 for wrong tokens), yet a token this process has never
    seen works on the API and signs in to the dashboard."""
    with serve.client() as http:
        codes = [wrong(http, i) for i in range(25)]
        assert codes[-1] == 429, codes
        fresh = {"Authorization": f"Bearer {serve.tokens['approve']}"}
        assert http.get("/api/v1/runs", headers=fresh).status_code == 200
    with serve.client(follow_redirects=True) as browser:
        csrf = form_csrf(browser.get("/ui/login").text)
        answer = browser.post("/ui/login", data={"token": serve.tokens["admin"], "csrf": csrf})
        assert answer.status_code == 200 and answer.url.path == "/ui/runs", answer.text[:300]
    with serve.client() as http:
        assert wrong(http, 99) == 429  # still held back for guesses


def test_a_named_proxy_is_believed(serve_with: ServedWith) -> None:
    """`--trusted-proxy 127.0.0.1`: the forwarded address is the client's, so 40 wrong tokens
    over 40 claimed addresses are 40 clients with one failure each (all 401), while 21 from
    one claimed address hold that one back and not the next."""
    with serve_with("--trusted-proxy", "127.0.0.1") as served, served.client() as http:
        codes = [wrong(http, i, **{"X-Forwarded-For": f"10.0.{i}.1"}) for i in range(40)]
        assert codes == [401] * 40, codes
        one = [wrong(http, i, **{"X-Forwarded-For": "10.1.1.1"}) for i in range(21)]
        assert one[-1] == 429 and wrong(http, 0, **{"X-Forwarded-For": "10.1.1.2"}) == 401


def test_mcp_http_ignores_forwarded_addresses_too(mcp_http: Served) -> None:
    with mcp_http.client() as http:
        codes = [wrong(http, i, "/mcp", **{"X-Forwarded-For": f"10.0.{i}.1"}) for i in range(25)]
        assert codes[:20] == [401] * 20 and codes[20:] == [429] * 5, codes
        fresh = {"Authorization": f"Bearer {mcp_http.tokens['read']}"}
        assert http.post("/mcp", json=INITIALIZE, headers={**ACCEPT, **fresh}).status_code == 200
