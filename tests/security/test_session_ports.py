"""Issue 35 §1 in a real Chromium against a real `perdure serve`: a page served from another
port of 127.0.0.1 loads `<img src="/ui/steal.png">` from its own server, and so receives the
signed-in admin's session cookie (browsers share cookies across ports). With that cookie
alone a plain HTTP client can no longer act (the cancel it posts with a scraped CSRF token
is refused for want of the tab key) nor open the event stream; a cookie tossed into the
victim's browser does not put the victim in the attacker's session; the admin's own tab
still cancels a run through the page."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from served import Served, form_csrf, sign_in
from test_csrf_browser import CHROMIUM

import perdure
from local_servers import free_port
from perdure.server.access_sql import Access

pytestmark = pytest.mark.slow


def thief(cookies: list[str], sets: str = "") -> http.server.ThreadingHTTPServer:
    """The other process: one page with an image from its own port's /ui/, whose request's
    Cookie header it keeps; `sets`: a Set-Cookie header its page sends."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/ui/steal.png"):
                cookies.append(self.headers.get("Cookie", ""))
                body, kind = b"", "image/png"
            else:
                body, kind = b'<!doctype html><img src="/ui/steal.png">', "text/html"
            self.send_response(200)
            if sets:
                self.send_header("Set-Cookie", sets)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None: ...

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def audit_of(served: Served, run: str) -> list[tuple[str, str]]:
    reader = perdure.App(served.db)
    try:
        rows = reader.runtime.sync(
            Access(reader.runtime.store).audit_log(target=f"run:{run}", limit=10), "audit"
        )
        return [(a.action, a.actor) for a in rows]
    finally:
        reader.close()


def test_a_session_cookie_taken_from_another_port_authorises_nothing(serve: Served) -> None:
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), f"Debian's chromium is needed at {CHROMIUM} (.ci/run)"
    with serve.client("operate") as api:
        for run in ("victim", "mine"):
            assert api.post("/api/v1/runs", json={"workflow": "waits", "id": run}).is_success
    stolen: list[str] = []
    evil = thief(stolen)
    attacker = sign_in(serve, serve.tokens["operate"])  # the attacker's own session
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{serve.url}/ui/login")
                page.fill("#token", serve.tokens["admin"])
                page.click("button[type=submit]")
                page.wait_for_url(f"{serve.url}/ui/runs")
                assert "#tab=" not in page.url  # the key left the address bar
                other = context.new_page()
                other.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
                other.wait_for_load_state("networkidle")
                [cookie] = stolen
                session = re.search(r"perdure_session=(pds_[\w-]+)", cookie)
                assert session, cookie  # the browser did hand the cookie to the other port

                with httpx.Client(base_url=serve.url, timeout=10) as http:
                    http.cookies.set("perdure_session", session.group(1))
                    for name in ("perdure_csrf",):
                        found = re.search(rf"{name}=(\w+)", cookie)
                        if found:
                            http.cookies.set(name, found.group(1))
                    csrf = form_csrf(http.get("/ui/runs/victim").text)
                    form = {"csrf": csrf, "run_id": "victim", "action": "cancel"}
                    posted = http.post("/ui/runs/act", data=form)
                    assert posted.status_code == 403 and "tab key" in posted.text
                    forged = http.post("/ui/runs/act", data=form,
                                       headers={"X-Perdure-Tab": "pdt_guess"})  # fmt: skip
                    assert forged.status_code == 403
                    assert http.get("/ui/stream").status_code == 403

                # a cookie tossed into the admin's browser (for the whole host, so sent too):
                # the admin is not swapped into the attacker's session but asked to sign in
                tossed = attacker.cookies["perdure_session"]
                context.add_cookies([{"name": "perdure_session", "value": tossed,
                                      "domain": "127.0.0.1", "path": "/"}])  # fmt: skip
                page.goto(f"{serve.url}/ui/runs/mine")
                expect(page).to_have_url(re.compile(r"/ui/login\?next="))

                # signed in again (the tossed cookie is deleted), the admin's own tab
                # cancels through the page
                page.fill("#token", serve.tokens["admin"])
                page.click("button[type=submit]")
                page.wait_for_url(f"{serve.url}/ui/runs/mine")  # where it was going
                page.once("dialog", lambda dialog: dialog.accept())
                page.locator("button.danger").click()
                expect(page.locator(".flash")).to_be_visible(timeout=15_000)
            finally:
                browser.close()
    finally:
        evil.shutdown()
        attacker.close()
    assert audit_of(serve, "victim") == [("run.start", "sec-operate")]
    reader = perdure.App(serve.db)
    try:
        assert reader.get_run("victim").status == "pending"
        assert reader.get_run("mine").status == "cancelled"
    finally:
        reader.close()


def test_a_flash_message_set_from_another_port_is_not_shown(serve: Served) -> None:
    """Issue 35 §11: a page of another port sets `perdure_flash` for /ui (browsers let it);
    the dashboard shows no banner of it, while its own messages still show."""
    from playwright.sync_api import expect, sync_playwright

    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "mine"}).is_success
    lure = "Session%20expired%3A%20paste%20your%20token%20at%20evil.example"
    evil = thief([], sets=f"perdure_flash={lure}; Path=/ui")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_context().new_page()
                page.goto(f"{serve.url}/ui/login")
                page.fill("#token", serve.tokens["admin"])
                page.click("button[type=submit]")
                page.wait_for_url(f"{serve.url}/ui/runs")
                page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
                page.goto(f"{serve.url}/ui/runs/mine")
                expect(page.locator("#run-status")).to_have_text("pending")
                expect(page.locator(".flash")).to_have_count(0)
                assert "evil.example" not in page.content()
                page.once("dialog", lambda dialog: dialog.accept())
                page.locator("button.danger").click()
                expect(page.locator(".flash")).to_contain_text("the run is now cancelled")
            finally:
                browser.close()
    finally:
        evil.shutdown()


def test_behind_a_tls_proxy_the_cookies_are_host_only_and_secure(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    """`--trusted-proxy 127.0.0.1` and `X-Forwarded-Proto: https` (a TLS proxy in front):
    the session cookie is `__Host-perdure_session`, `Secure`, `Path=/` (no other port's
    plain-HTTP page receives it, and no other host may set it)."""
    with serve_with("--trusted-proxy", "127.0.0.1") as served:
        https = {"X-Forwarded-Proto": "https", "Host": f"127.0.0.1:{served.port}",
                 "Origin": f"https://127.0.0.1:{served.port}"}  # fmt: skip
        with httpx.Client(base_url=served.url, headers=https, timeout=10) as http:
            page = http.get("/ui/login")
            csrf_cookie = page.headers["set-cookie"]
            assert csrf_cookie.startswith("__Host-perdure_csrf=") and "Secure" in csrf_cookie
            nonce = csrf_cookie.split(";")[0].split("=", 1)[1]
            signed = http.post("/ui/login", data={"token": served.tokens["read"],
                               "csrf": form_csrf(page.text)},
                               headers={"Cookie": f"__Host-perdure_csrf={nonce}"})  # fmt: skip
    assert signed.status_code == 303, signed.text[:300]
    [session] = [c for c in signed.headers.get_list("set-cookie") if "perdure_session=pds_" in c]
    parts = {p.strip().lower() for p in session.split(";")}
    assert session.startswith("__Host-perdure_session=pds_")
    assert {"secure", "path=/", "httponly", "samesite=strict"} <= parts
