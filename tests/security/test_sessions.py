"""Issue 12 §3 against a real `perdure serve`: a dashboard session is a random id that dies
on sign-out and with its token (a copied cookie is then worthless), an open event stream
stops when its credential is revoked by another process, and wrong tokens are limited per
client address with 429 while the real token keeps working; an idle session ends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

import httpx
from served import HERE, Served, form_csrf, perdure, sign_in

from perdure.server.sse import RECHECK


def signed_in(client: httpx.Client) -> bool:
    answer = client.get("/ui/runs", follow_redirects=False)
    assert answer.status_code in (200, 303), answer.text[:300]
    return answer.status_code == 200


def test_a_copied_session_cookie_is_worthless_after_sign_out(serve: Served) -> None:
    browser = sign_in(serve, serve.tokens["operate"])
    session = browser.cookies["perdure_session"]
    assert session.startswith("pds_") and serve.tokens["operate"] not in session
    with serve.client() as thief:
        thief.cookies.set("perdure_session", session)
        assert signed_in(thief)
        csrf = form_csrf(browser.get("/ui/runs").text)
        out = browser.post("/ui/logout", data={"csrf": csrf})
        assert out.url.path == "/ui/login"
        thief.cookies.set("perdure_session", session)
        assert not signed_in(thief)
        assert thief.get("/ui/stream").status_code == 401
    browser.close()


def open_stream(served: Served, path: str, header: str) -> socket.socket:
    """A raw event-stream connection, its response head read (200 expected)."""
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}\r\n\r\n".encode())
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it ends the response (the socket's timeout, 30 s,
    far beyond RECHECK, fails the test if it never does)."""
    seen = b""
    while not seen.endswith(b"0\r\n\r\n"):  # the last chunk of a chunked response
        chunk = sock.recv(65536)
        if not chunk:
            break
        seen += chunk
    sock.close()
    return seen


def test_a_revoked_token_stops_its_open_streams(serve: Served) -> None:
    """`perdure token revoke`, in a process of its own, ends the API stream of a bearer
    token and the dashboard stream of a session signed in with it."""
    with serve.client("operate") as api:
        started = api.post("/api/v1/runs", json={"workflow": "waits", "id": "watched"})
        assert started.status_code in (200, 201), started.text
    auth = f"Authorization: Bearer {serve.tokens['read']}"
    api_stream = open_stream(serve, "/api/v1/events/stream?run=watched", auth)
    browser = sign_in(serve, serve.tokens["read"])
    cookie = f"Cookie: perdure_session={browser.cookies['perdure_session']}"
    ui_stream = open_stream(serve, f"/ui/stream?tab={browser.headers['X-Perdure-Tab']}", cookie)
    time.sleep(RECHECK / 2)  # both streams are well under way
    perdure(serve.env, "token", "revoke", serve.token_ids["read"])
    api_text, ui_text = read_to_end(api_stream), read_to_end(ui_stream)
    assert b"event: end" in api_text and b"revoked or expired" in api_text, api_text[-500:]
    assert b"event: signed-out" in ui_text, ui_text[-500:]
    assert not signed_in(browser)
    browser.close()


def test_wrong_tokens_are_limited_per_address_without_locking_out_the_real_one(
    serve: Served,
) -> None:
    """After 20 wrong tokens in a minute a wrong one from the address is answered 429 with
    Retry-After; the read token goes on working, and the admin token, never used here
    before, signs in; a request with no token at all is no guess (still 401)."""
    with serve.client() as http:
        real = {"Authorization": f"Bearer {serve.tokens['read']}"}
        assert http.get("/api/v1/runs", headers=real).status_code == 200
        codes = [
            http.get("/api/v1/runs", headers={"Authorization": f"Bearer pdr_guess{i}"}).status_code
            for i in range(40)
        ]
        assert codes[:20] == [401] * 20 and codes[20:] == [429] * 20, codes
        held = http.get("/api/v1/runs", headers={"Authorization": "Bearer pdr_guess_more"})
        assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1
        assert "too many failed sign-ins" in held.json()["error"]
        assert http.get("/api/v1/runs", headers=real).status_code == 200
        assert http.get("/api/v1/runs").status_code == 401
        signed = sign_in_answer(http, serve.tokens["admin"])  # never used here before
        assert signed == 303
    assert "pdr_guess" not in serve.output()


def sign_in_answer(http: httpx.Client, token: str) -> int:
    csrf = form_csrf(http.get("/ui/login").text)
    return http.post("/ui/login", data={"token": token, "csrf": csrf}).status_code


def test_an_idle_session_ends_by_itself(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    """`perdure serve --session-idle 2`: a session used within 2 s lives on; one left alone
    longer is over, and its cookie is cleared."""
    with serve_with("--session-idle", "2", "--session-max", "60") as served:
        browser = sign_in(served, served.tokens["read"])
        time.sleep(1.0)
        assert signed_in(browser)
        time.sleep(2.5)
        assert not signed_in(browser)
        browser.close()


def test_session_limits_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--app", "sec_app:app", "serve",
         "--session-idle", "100", "--session-max", "10"],
        cwd=HERE, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PERDURE_DB": f"sqlite:///{tmp_path}/x.db"},
    )  # fmt: skip
    assert done.returncode == 2 and "--session-idle (100 s) is longer" in done.stderr
    assert "Traceback" not in done.stderr
