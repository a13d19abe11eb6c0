"""Issue 12 §1 in a real Chromium against a real `perdure serve`: a page served from another
port of 127.0.0.1 (browsers share cookies across ports) plants its own `perdure_csrf`
cookie and auto-posts a cancel with that value while an admin is signed in. The CSRF token
is bound to the session and the post is not same-origin: refused, the run goes on, nothing
is audited as the admin's."""

from __future__ import annotations

import http.server
import shutil
import threading
from pathlib import Path

import pytest
from served import Served

import perdure
from local_servers import free_port
from perdure.server.access_sql import Access

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def attacker(folder: Path, target: str) -> http.server.ThreadingHTTPServer:
    """The attacker's server on another port: one page that sets `perdure_csrf=evil` for
    /ui and submits a cancel form to `target` as soon as it loads."""
    folder.mkdir()
    (folder / "index.html").write_text(
        "<!doctype html><html><body>"
        f'<form id="f" method="post" action="{target}/ui/runs/act">'
        '<input name="csrf" value="evil"><input name="run_id" value="victim">'
        '<input name="action" value="cancel"></form>'
        '<script>document.getElementById("f").submit();</script></body></html>'
    )

    class Page(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)  # type: ignore[arg-type]

        def end_headers(self) -> None:  # a server's Set-Cookie replaces even HttpOnly ones
            self.send_header("Set-Cookie", "perdure_csrf=evil; Path=/ui")
            super().end_headers()

        def log_message(self, format: str, *args: object) -> None: ...

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    return evil


def test_a_page_on_another_port_cannot_act_for_a_signed_in_admin(
    serve: Served, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"Debian's chromium is needed at {CHROMIUM} (.ci/run)"
    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "victim"}).is_success
    evil = attacker(tmp_path / "attack", serve.url)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_context().new_page()
                page.goto(f"{serve.url}/ui/login")
                page.fill("#token", serve.tokens["admin"])
                page.click("button[type=submit]")
                page.wait_for_url(f"{serve.url}/ui/runs")
                with page.expect_response(lambda r: r.url.endswith("/ui/runs/act")) as posted:
                    page.goto(f"http://127.0.0.1:{evil.server_address[1]}/index.html")
                assert posted.value.status == 403
                page.wait_for_load_state()
                assert "CSRF check failed" in page.content()
            finally:
                browser.close()
    finally:
        evil.shutdown()
    reader = perdure.App(serve.db)
    try:
        assert reader.get_run("victim").status == "pending"
        audit = reader.runtime.sync(
            Access(reader.runtime.store).audit_log(target="run:victim", limit=10), "audit"
        )
        assert [(a.action, a.actor) for a in audit] == [("run.start", "sec-operate")]
    finally:
        reader.close()
