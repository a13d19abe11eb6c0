"""The dashboard under /ui: sign-in, scopes and CSRF on every action, what each page shows,
live-update events, and secrets kept out of the pages."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from datetime import timedelta
from html import unescape
from typing import Any

import pytest

from extras_needed import needs
from parked_runs import crash_and_recover

pytest.importorskip("starlette", reason=needs("server"))

import perdure
from perdure.agent.budget_sql import Budget, Budgets, SharedBudget, UsageRow
from perdure.observe.redact import Redactor
from perdure.server import create_app, dashboard, operations
from perdure.server.access import local_operator
from perdure.server.access_sql import Access
from perdure.testing import TestClock, TestWorker
from perdure.triggers.dead_sql import DeadMessage, DeadMessages

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

PAGES = [
    "/ui/runs",
    "/ui/runs/gate-1",
    "/ui/approvals",
    "/ui/schedules",
    "/ui/triggers",
    "/ui/messages",
    "/ui/agents",
    "/ui/workers",
    "/ui/audit",
]
PROVIDER_KEY = "sk-proj-Zr4nd0mKeyValue1234"
ENV_SECRET = "hunter2-is-the-db-password"
LEAKED_TOKEN = "pdr_NotARealTokenButShaped0123456789"


def register(app: perdure.App) -> None:
    """Workflows: `gated` waits at approve:c1, `asking` at a question, `leaky` fails with
    secrets in its data and error, `quick` completes."""

    @app.step(effect="read", name="fetch")
    def fetch(x: str) -> dict[str, Any]:
        return {
            "got": x,
            "headers": {"Authorization": "Basic dXNlcjpwYXNzd29yZA=="},
            "note": f"used {PROVIDER_KEY}, {LEAKED_TOKEN} and {ENV_SECRET}",
        }

    @app.step(name="explode")
    def explode(x: str) -> str:
        raise RuntimeError(f"refused: Authorization: Bearer {LEAKED_TOKEN} key {PROVIDER_KEY}")

    @app.workflow(name="gated")
    async def gated(x: str) -> str:
        await fetch(x)
        verdict = await perdure.wait_event("approve:c1")
        return f"went on with {verdict}"

    @app.workflow(name="asking")
    async def asking(x: str) -> str:
        return str(await perdure.wait_event("human:q1"))

    @app.workflow(name="leaky")
    async def leaky(x: str) -> str:
        await fetch(x)
        return await explode(x)

    @app.workflow(name="quick")
    def quick(n: int) -> int:
        return n * 2

    app.schedule(every=timedelta(hours=1), workflow="quick", args=[1], name="hourly",
                 catchup="skip")  # fmt: skip


def token(app: perdure.App, *scopes: str, name: str = "ana") -> str:
    """A new token with `scopes`, made as `perdure token create` makes it (audited)."""
    made = operations.create_token(app, local_operator(), name, list(scopes))
    _, value = app.runtime.sync(made, "token")
    return value


def form_csrf(html: str) -> str:
    """The CSRF token a rendered page's forms carry."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no form with a CSRF token on the page"
    return found.group(1)


def sign_in(client: TestClient, value: str) -> str:
    """Sign `client` in with token `value`; returns the CSRF token its forms carry."""
    csrf = form_csrf(client.get("/ui/login").text)
    response = client.post(
        "/ui/login", data={"token": value, "csrf": csrf, "next": "/ui/runs"}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    # the tab key (in the redirect's fragment), sent with actions as the page's script does
    client.headers["X-Perdure-Tab"] = response.headers["location"].partition("#tab=")[2]
    fresh = form_csrf(client.get("/ui/runs").text)
    assert fresh != csrf  # a new CSRF token for the new session
    return fresh


def text_of(html: str) -> str:
    """The visible text of a page, tags removed and whitespace collapsed."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


@pytest.fixture
def server(app: perdure.App, clock: TestClock) -> Iterator[TestClient]:
    """The server for `app` with a run at a gate, a question, a failed run, a completed run,
    a schedule with missed ticks, an agent's usage and budget."""
    register(app)
    app.start("gated", "g", run_id="gate-1")
    app.start("asking", "q", run_id="ask-1")
    app.start("leaky", "l", run_id="leak-1")
    app.start("quick", 21, run_id="quick-1")
    worker = TestWorker(app)
    worker.run_until_idle()  # also stores the schedule
    clock.advance(timedelta(hours=3, minutes=30))
    worker.run_until_idle()  # the schedule's ticks are late: skipped, with the reason
    now = clock.now()
    app.runtime.sync(
        Budgets(app.runtime.store).put_budget(Budget("helper", tokens_per_day=1000), now), "budget"
    )
    for i, tokens in enumerate((300, 450)):
        usage = UsageRow("quick-1", i, "helper", "m", tokens, 0, 0.01, now - 129600 * i)
        app.runtime.sync(Budgets(app.runtime.store).record_usage(usage), "usage")
    app.on_message(perdure.sources.RabbitMQ("amqp://guest:pw@127.0.0.1:5672/", "orders"),
                   "quick", name="orders")  # fmt: skip
    dead = DeadMessage("orders", "m-9", "rabbitmq", "payload is not JSON", "{oops", 5, now)
    app.runtime.sync(DeadMessages(app.runtime.store).add_dead_message(dead), "dead")
    with TestClient(create_app(app)) as client:
        yield client


def test_every_page_renders_what_it_is_for_with_a_read_token(
    app: perdure.App, server: TestClient
) -> None:
    """A read token sees each page, each showing its own content."""
    sign_in(server, token(app, "read"))
    expected = {
        "/ui/runs": ["gate-1", "leak-1", "quick-1", "waiting", "failed", "completed"],
        "/ui/runs/gate-1": ["Timeline", "fetch", "step.outcome", "event:approve:c1", "read"],
        "/ui/approvals": ["gate-1", "c1", "ask-1", "q1", "no approve scope"],
        "/ui/schedules": ["hourly", "every 3600s", "2026-01-01 04:00:00Z", "skipped"],
        "/ui/triggers": ["schedule hourly", "active", "Last error"],
        "/ui/messages": [
            "orders",
            "rabbitmq",
            "amqp://guest@127.0.0.1:5672/ queue 'orders'",
            "refused",
            "credentials refused",
            "m-9",
            "payload is not JSON",
            "{oops",
        ],
        "/ui/agents": ["helper", "tokens this day", "300 of 1,000 (30%)", "no limit"],
        "/ui/workers": ["No worker has reported in the last hour", "Paused"],
        "/ui/audit": ["token.create", local_operator().name, "token:", "ok"],
    }
    for path, words in expected.items():
        response = server.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        shown = text_of(response.text)
        for word in words:
            assert word in shown, (path, word)
        assert "Sign out" in shown and "ana (read)" in shown
    chart = server.get("/ui/agents").text
    assert len(re.findall(r'<rect class="bar"', chart)) == 14  # one bar per day
    heights = sorted(int(h) for h in re.findall(r'class="bar"[^>]*height="(\d+)"', chart))
    assert heights[-2:] == [60, 90]  # 300 and 450 tokens, scaled to the highest day


def test_pages_send_a_visitor_without_a_valid_session_to_the_login_page(
    app: perdure.App, server: TestClient
) -> None:
    """No cookie, or a cookie with an unknown token: every page redirects to the login page,
    which comes back to the page asked for; actions and the event stream answer 401."""
    for path in PAGES:
        response = server.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/ui/login?next=%2Fui%2F"), path
    server.cookies.set(dashboard.SESSION_COOKIE, "pdr_unknown_token_value", path="/ui")
    assert server.get("/ui/runs", follow_redirects=False).status_code == 303
    csrf = form_csrf(server.get("/ui/login").text)
    form = {"csrf": csrf, "run_id": "gate-1", "call_id": "c1", "decision": "approve"}
    assert server.post("/ui/approvals/decide", data=form).status_code == 401
    assert server.get("/ui/stream").status_code == 401
    assert app.get_run("gate-1").status == "waiting"
    home = server.get("/", follow_redirects=False)
    assert (home.status_code, home.headers["location"]) == (303, "/ui/runs")


def test_login_refuses_a_wrong_token_and_keeps_a_right_one_in_a_strict_httponly_cookie(
    app: perdure.App, server: TestClient
) -> None:
    """A wrong token answers 401 and sets no session; a right one starts a session whose
    random id (never the token) is set HttpOnly, SameSite=Strict, for /ui only, and the
    page asked for opens."""
    csrf = form_csrf(server.get("/ui/login").text)
    wrong = server.post("/ui/login", data={"token": "pdr_wrong", "csrf": csrf})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    assert dashboard.SESSION_COOKIE not in server.cookies
    value = token(app, "read")
    right = server.post(
        "/ui/login",
        data={"token": value, "csrf": csrf, "next": "/ui/approvals"},
        follow_redirects=False,
    )
    assert right.status_code == 303
    assert right.headers["location"].startswith("/ui/approvals#tab=pdt_")
    [session] = [c for c in right.headers.get_list("set-cookie") if "perdure_session=pds_" in c]
    assert value not in session and session.startswith("perdure_session=pds_")
    assert {"httponly", "samesite=strict", "path=/ui"} <= {
        part.strip().lower() for part in session.split(";")
    }
    csrf = form_csrf(server.get("/ui/login").text)
    elsewhere = server.post(
        "/ui/login", data={"token": value, "csrf": csrf, "next": "https://evil.example/"}
    )
    assert elsewhere.url.path == "/ui/runs"  # never sent to another site after sign-in
    server.headers["X-Perdure-Tab"] = elsewhere.history[0].headers["location"].partition("#tab=")[2]
    runs_page = server.get("/ui/runs").text
    assert value not in runs_page
    csrf = form_csrf(runs_page)
    out = server.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert (out.status_code, out.headers["location"]) == (303, "/ui/login")
    assert server.get("/ui/runs", follow_redirects=False).status_code == 303  # signed out


def test_a_read_only_token_cannot_approve_a_gate(app: perdure.App, server: TestClient) -> None:
    """An approve POST with a valid CSRF token but a read token answers 403; the run still
    waits and nothing is recorded as decided."""
    csrf = sign_in(server, token(app, "read"))
    form = {"csrf": csrf, "run_id": "gate-1", "call_id": "c1", "decision": "approve"}
    refused = server.post("/ui/approvals/decide", data=form)
    assert refused.status_code == 403
    assert "needs the 'approve' scope" in text_of(refused.text)
    assert app.get_run("gate-1").status == "waiting"
    log = app.runtime.sync(Access(app.runtime.store).audit_log(), "log")
    assert [(r.action, r.outcome) for r in log] == [
        ("gate.approve", "refused"), ("session.start", "ok"), ("token.create", "ok"),
    ]  # fmt: skip
    assert log[0].actor == "ana" and "needs the 'approve' scope" in log[0].reason
    assert 'value="approve"' not in server.get("/ui/approvals").text  # no buttons shown either


def test_a_form_without_the_csrf_token_is_refused(app: perdure.App, server: TestClient) -> None:
    """An approve token's POST with no or a wrong CSRF token answers 403 and changes nothing;
    the same form with the token approves and the run continues."""
    csrf = sign_in(server, token(app, "approve"))
    form = {"run_id": "gate-1", "call_id": "c1", "decision": "approve", "comment": "fine"}
    assert server.post("/ui/approvals/decide", data=form).status_code == 403
    wrong = server.post("/ui/approvals/decide", data={**form, "csrf": "0" * 48})
    assert wrong.status_code == 403 and "CSRF" in wrong.text
    assert app.get_run("gate-1").status == "waiting"
    done = server.post("/ui/approvals/decide", data={**form, "csrf": csrf})
    assert done.status_code == 200 and done.url.path == "/ui/approvals"
    assert "Call c1 of run gate-1 approved." in text_of(done.text)
    TestWorker(app).run_until_idle()
    assert app.handle("gate-1").result(timeout=5) == (
        "went on with {'approve': True, 'comment': 'fine'}"
    )
    [decision, _, _] = app.runtime.sync(Access(app.runtime.store).audit_log(), "log")
    assert (decision.actor, decision.action) == ("ana", "gate.approve")
    assert decision.target == "run:gate-1"
    run_page = text_of(server.get("/ui/runs/gate-1").text)
    assert "completed" in run_page and "gate.approve" in run_page and "fine" in run_page


def test_a_question_is_answered_from_the_approvals_page(
    app: perdure.App, server: TestClient
) -> None:
    """The answer reaches the waiting run as the event's payload."""
    csrf = sign_in(server, token(app, "approve"))
    form = {"csrf": csrf, "run_id": "ask-1", "call_id": "q1", "answer": "blue"}
    assert server.post("/ui/approvals/answer", data=form).status_code == 200
    TestWorker(app).run_until_idle()
    assert app.handle("ask-1").result(timeout=5) == "blue"
    again = server.post("/ui/approvals/answer", data=form)
    assert again.status_code == 409 and "not waiting at that gate" in again.text


def test_csrf_tokens_are_bound_to_the_session_and_the_request_must_be_same_origin(
    app: perdure.App, server: TestClient
) -> None:
    """Each defence alone refuses: a planted `perdure_csrf` cookie with the same value in the
    form (what a page on another port can do), a right token from another origin, or a
    browser saying the request is only same-site. A form from this dashboard is accepted."""
    csrf = sign_in(server, token(app, "operate"))
    form = {"run_id": "gate-1", "action": "pause"}

    server.cookies.set(dashboard.CSRF_COOKIE, "evil", path="/ui")
    planted = server.post("/ui/runs/act", data={**form, "csrf": "evil"})
    assert planted.status_code == 403 and "CSRF check failed" in planted.text
    csrf = form_csrf(server.get("/ui/runs").text)  # the page re-signs for the new nonce

    for headers in (
        {"origin": "http://127.0.0.1:18099"},
        {"sec-fetch-site": "same-site"},
        {"sec-fetch-site": "cross-site"},
    ):
        refused = server.post("/ui/runs/act", data={**form, "csrf": csrf}, headers=headers)
        assert refused.status_code == 403, headers
    assert app.get_run("gate-1").status == "waiting"
    own = {"origin": "http://testserver", "sec-fetch-site": "same-origin"}
    done = server.post("/ui/runs/act", data={**form, "csrf": csrf}, headers=own)
    assert done.status_code == 200 and app.get_run("gate-1").status == "paused"


def test_a_live_refresh_leaves_the_flash_to_the_page_it_was_meant_for(
    app: perdure.App, server: TestClient
) -> None:
    """The approve form redirects to a page that shows "approved" once. A live refresh
    (perdure.js marks it) fired by the page being left may reach the server between the
    POST and the redirect's GET: it must neither show nor spend the message (that race made
    the browser test miss the flash one run in N)."""
    csrf = sign_in(server, token(app, "approve"))
    form = {"csrf": csrf, "run_id": "gate-1", "call_id": "c1", "decision": "approve"}
    posted = server.post("/ui/approvals/decide", data=form, follow_redirects=False)
    assert posted.status_code == 303
    assert server.cookies.get(dashboard.FLASH_COOKIE)
    refreshed = server.get("/ui/approvals", headers={dashboard.REFRESH_HEADER: "1"})
    assert refreshed.status_code == 200 and 'class="flash"' not in refreshed.text
    assert server.cookies.get(dashboard.FLASH_COOKIE)  # still there for the page load
    landed = server.get(posted.headers["location"])
    assert "Call c1 of run gate-1 approved." in text_of(landed.text)
    assert not server.cookies.get(dashboard.FLASH_COOKIE)  # shown once
    assert 'class="flash"' not in server.get("/ui/approvals").text


def test_run_buttons_need_the_operate_scope(app: perdure.App, server: TestClient) -> None:
    """Cancel from an approve token answers 403; from an operate token it cancels the run
    and the run page shows who did it."""
    csrf = sign_in(server, token(app, "approve"))
    form = {"csrf": csrf, "run_id": "ask-1", "action": "cancel"}
    assert 'value="cancel"' not in server.get("/ui/runs/ask-1").text
    assert server.post("/ui/runs/act", data=form).status_code == 403
    assert app.get_run("ask-1").status == "waiting"
    csrf = sign_in(server, token(app, "operate", name="olga"))
    assert 'value="cancel"' in server.get("/ui/runs/ask-1").text
    done = server.post("/ui/runs/act", data={**form, "csrf": csrf})
    assert done.status_code == 200 and done.url.path == "/ui/runs/ask-1"
    assert app.get_run("ask-1").status == "cancelled"
    shown = text_of(done.text)
    assert "Cancel: the run is now cancelled." in shown and "olga run.cancel" in shown
    missing = server.get("/ui/runs/no-such-run")
    assert missing.status_code == 404 and "no-such-run" in missing.text


def test_schedules_are_paused_and_resumed_by_admins_only(
    app: perdure.App, server: TestClient
) -> None:
    """An operate token cannot pause a schedule (403); an admin's pause stops it and is
    audited."""
    csrf = sign_in(server, token(app, "operate"))
    form = {"csrf": csrf, "name": "hourly", "action": "pause"}
    assert server.post("/ui/schedules/act", data=form).status_code == 403
    assert not app.schedules()[0].paused
    csrf = sign_in(server, token(app, "admin", name="root"))
    done = server.post("/ui/schedules/act", data={**form, "csrf": csrf})
    assert done.status_code == 200 and "none while paused" in text_of(done.text)
    assert app.schedules()[0].paused
    assert (
        app.runtime.sync(Access(app.runtime.store).audit_log(limit=1), "log")[0].action
        == "schedule.pause"
    )


def test_runs_list_filters_by_status_and_workflow_searches_ids_and_pages(
    app: perdure.App, server: TestClient
) -> None:
    """Status chips, the workflow filter and the id search narrow the list; 50 runs a page."""
    sign_in(server, token(app, "read"))
    for i in range(dashboard.PAGE):
        app.start("quick", i, run_id=f"bulk-{i:03d}")

    def ids(url: str) -> set[str]:
        return set(re.findall(r'href="/ui/runs/([^"?]+)"', server.get(url).text))

    assert ids("/ui/runs?status=failed") == {"leak-1"}
    assert ids("/ui/runs?status=failed&status=waiting") == {"leak-1", "gate-1", "ask-1"}
    assert ids("/ui/runs?workflow=asking") == {"ask-1"}
    assert ids("/ui/runs?q=GATE") == {"gate-1"}
    first, second = ids("/ui/runs"), ids("/ui/runs?page=2")
    assert len(first) == dashboard.PAGE and not first & second
    assert len(first | second) == dashboard.PAGE + 4
    assert "older →" in server.get("/ui/runs").text
    assert "older →" not in server.get("/ui/runs?page=2").text


def test_secrets_are_redacted_on_the_run_page(
    app: perdure.App, server: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens, provider keys, Authorization values and secret env values in a run's journal
    and error never reach the page; the rest of the data does."""
    monkeypatch.setenv("BILLING_DB_PASSWORD", ENV_SECRET)
    sign_in(server, token(app, "read"))
    page = server.get("/ui/runs/leak-1").text
    for secret in (PROVIDER_KEY, ENV_SECRET, LEAKED_TOKEN, "dXNlcjpwYXNzd29yZA=="):
        assert secret not in page, secret
    shown = text_of(page)
    assert "RuntimeError" in shown and "Traceback (most recent call last)" in shown
    assert "Authorization: ***" in shown and "pdr_***" in shown and "sk-***" in shown
    assert '"got": "l"' in shown  # the data itself is shown
    raw = "".join(e.data or "" for e in app.journal("leak-1"))
    assert all(s in raw for s in (PROVIDER_KEY, LEAKED_TOKEN, ENV_SECRET))  # they were there


def test_the_redactor_masks_secret_fields_and_leaves_markup_alone() -> None:
    """JSON fields named like secrets are masked whole; the page pass keeps HTML entities."""
    redactor = Redactor(env={"X_API_KEY": "abc&def<ghi"})
    value = redactor.value({"api_key": "k", "password": "p", "idempotency_key": "run:3"})
    assert value == {"api_key": "***", "password": "***", "idempotency_key": "run:3"}
    assert redactor.text("Authorization: Token abc123") == "Authorization: ***"
    page = "<p>Bearer &#34;x&#34; abc&amp;def&lt;ghi sk-abcdefgh1234</p>"
    assert redactor.page(page) == "<p>Bearer &#34;x&#34; *** sk-***</p>"


def test_the_event_stream_announces_changes(
    app: perdure.App, server: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/ui/stream sends a `change` event with the current fingerprint, which moves when a
    run's status does."""
    monkeypatch.setattr(dashboard, "STREAM_SECONDS", 0.2)
    monkeypatch.setattr(dashboard, "STREAM_POLL", 0.05)
    sign_in(server, token(app, "read"))
    tab = server.headers["X-Perdure-Tab"]
    first = server.get(f"/ui/stream?run=gate-1&tab={tab}")
    assert first.status_code == 200
    assert first.headers["content-type"].startswith("text/event-stream")
    [before] = re.findall(r"event: change\ndata: (\w+)", first.text)
    app.send_event("gate-1", "approve:c1", {"approve": True})
    TestWorker(app).run_until_idle()
    again = server.get(f"/ui/stream?run=gate-1&tab={tab}").text
    [after] = re.findall(r"event: change\ndata: (\w+)", again)
    assert before != after


def test_pages_forbid_framing_and_scripts_from_elsewhere(
    app: perdure.App, server: TestClient
) -> None:
    """Every page is sent with headers that stop clickjacking and foreign scripts."""
    sign_in(server, token(app, "read"))
    response = server.get("/ui/approvals")
    assert response.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert "script-src 'self'" in response.headers["content-security-policy"]
    css = server.get("/ui/static/perdure.css")
    assert css.status_code == 200 and ".status" in css.text


def test_a_crashed_once_step_shows_its_recovery_and_can_be_retried(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """After a crash between a `once` step's intent and its outcome the run page says the
    run needs attention and what recovery does; an operator's retry sends it back to work."""

    sent: list[str] = []

    @app.step(name="send_mail")
    def send_mail(to: str) -> str:
        sent.append(to)
        return f"mailed {to}"

    @app.workflow(name="mailer")
    def mailer(to: str) -> str:
        return send_mail(to)

    app.start("mailer", "ana@example.org", run_id="mail-1")
    crash_and_recover(app, clock, "send_mail")
    assert app.get_run("mail-1").status == "needs_attention" and sent == []
    csrf = sign_in(server, token(app, "operate"))
    shown = text_of(server.get("/ui/runs/mail-1").text)
    assert "needs_attention : none until an operator resolves" in shown
    assert "Retry step" in shown and "Fail step" in shown
    form = {"csrf": csrf, "run_id": "mail-1", "action": "retry", "step": "0"}
    done = server.post("/ui/runs/act", data=form)
    assert done.status_code == 200 and "Step 0: retry requested" in text_of(done.text)
    TestWorker(app).run_until_idle()
    assert app.handle("mail-1").result(timeout=5) == "mailed ana@example.org"
    assert sent == ["ana@example.org"]
    assert (
        app.runtime.sync(Access(app.runtime.store).audit_log(limit=1), "log")[0].action
        == "run.resolve"
    )


def test_the_workers_page_shows_leases_and_pauses(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """A run claimed by a worker appears under that worker with its lease expiry (a lease
    owner the registry does not know is said to be not registered); once the lease ran out
    the run is listed as claimable; a paused workflow is listed."""
    app.start("quick", 5, run_id="held-1")
    claims = app.runtime.sync(
        app.runtime.store.claim("host-a:4242", clock.now(), 30.0, 10, ["quick"]), "claim"
    )
    assert [c.run.id for c in claims] == ["held-1"]
    app.pause_workflow("asking")
    sign_in(server, token(app, "read"))
    shown = text_of(server.get("/ui/workers").text)
    assert "host-a:4242 - not registered 1 - 2026-01-01 03:30:30Z (in 30s) held-1" in shown
    assert "workflow asking" in shown
    clock.advance(60)
    later = text_of(server.get("/ui/workers").text)
    assert "Claimable" in later and "held-1 quick , last held by host-a:4242" in later
    assert "No worker has reported in the last hour" in later


def test_a_run_that_takes_steering_is_steered_from_its_page(
    app: perdure.App, server: TestClient
) -> None:
    """A run whose workflow takes steering has a Steer form (a plain one has none); the
    message sent from it reaches the run, shows in its timeline and its audit (by the
    token's name); a steer to a plain workflow's run is refused with the reason."""

    @app.workflow(name="steered")
    async def steered() -> str:
        await perdure.steering()  # it takes steering from here on
        await perdure.wait_event("go")
        return " ".join(s.text for s in await perdure.steering())

    app.start("steered", run_id="steer-1")
    TestWorker(app).run_until_idle()
    csrf = sign_in(server, token(app, "operate", name="olga"))
    assert 'id="run-steer"' not in server.get("/ui/runs/ask-1").text
    assert 'id="run-steer"' in server.get("/ui/runs/steer-1").text
    form = {"csrf": csrf, "run_id": "steer-1", "action": "steer", "text": "go left"}
    done = server.post("/ui/runs/act", data=form)
    assert done.status_code == 200 and "Steered: the run takes" in text_of(done.text)
    app.send_event("steer-1", "go")
    TestWorker(app).run_until_idle()
    assert app.handle("steer-1").result(timeout=5) == "go left"
    shown = text_of(server.get("/ui/runs/steer-1").text)
    assert "steer.received" in shown and "go left" in shown and "olga run.steer" in shown
    assert 'id="run-steer"' not in server.get("/ui/runs/steer-1").text  # finished
    refused = server.post("/ui/runs/act", data={**form, "run_id": "ask-1"})
    assert refused.status_code == 409 and "does not take steering" in text_of(refused.text)


def test_dashboard_actions_and_refusals_are_audited(app: perdure.App, server: TestClient) -> None:
    """Answering a question, pausing, resuming and cancelling a run and pausing and resuming a
    schedule each leave an `ok` record naming the token; a cancel of an unknown run and a
    schedule pause without the admin scope are recorded as refused, with the reason."""
    csrf = sign_in(server, token(app, "approve", name="ana"))
    answered = {"csrf": csrf, "run_id": "ask-1", "call_id": "q1", "answer": "blue"}
    assert server.post("/ui/approvals/answer", data=answered).status_code == 200
    csrf = sign_in(server, token(app, "operate", name="olga"))
    for verb in ("pause", "resume", "cancel"):
        form = {"csrf": csrf, "run_id": "gate-1", "action": verb}
        assert server.post("/ui/runs/act", data=form).status_code == 200, verb
    unknown = {"csrf": csrf, "run_id": "no-such-run", "action": "cancel"}
    assert server.post("/ui/runs/act", data=unknown).status_code == 404
    schedule = {"csrf": csrf, "name": "hourly", "action": "pause"}
    assert server.post("/ui/schedules/act", data=schedule).status_code == 403
    csrf = sign_in(server, token(app, "admin", name="root"))
    for verb in ("pause", "resume"):
        form = {"csrf": csrf, "name": "hourly", "action": verb}
        assert server.post("/ui/schedules/act", data=form).status_code == 200, verb
    rows = [(r.actor, r.action, r.target, r.outcome)
            for r in reversed(app.runtime.sync(Access(app.runtime.store).audit_log(), "log"))
            if r.action not in ("token.create", "session.start")]  # fmt: skip
    assert rows == [
        ("ana", "gate.answer", "run:ask-1", "ok"), ("olga", "run.pause", "run:gate-1", "ok"),
        ("olga", "run.resume", "run:gate-1", "ok"), ("olga", "run.cancel", "run:gate-1", "ok"),
        ("olga", "run.cancel", "run:no-such-run", "refused"),
        ("olga", "schedule.pause", "schedule:hourly", "refused"),
        ("root", "schedule.pause", "schedule:hourly", "ok"),
        ("root", "schedule.resume", "schedule:hourly", "ok"),
    ]  # fmt: skip
    page = text_of(server.get("/ui/audit?actor=olga").text)
    assert "refused: schedule.pause needs the 'admin' scope" in page
    assert "no run with id 'no-such-run'" in page and "root" not in page.split("Filter", 1)[1]


def test_the_audit_page_filters_by_target_actor_and_since(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """/ui/audit?target=&actor=&since= shows only the records all three allow (since as
    `perdure audit --since` takes it), and its filter form keeps them."""
    from perdure.server.access import record

    def note(actor: str, target: str, mark: str) -> None:
        app.runtime.sync(record(app, actor, "run.pause", target, {"mark": mark}), "record")

    note("ana", "run:x", "old")
    clock.advance(7200)
    note("bob", "run:x", "other-actor")
    note("ana", "run:y", "other-run")
    note("ana", "run:x", "wanted")
    sign_in(server, token(app, "read"))
    page = server.get("/ui/audit?target=run:x&actor=ana&since=1h")
    assert page.status_code == 200
    shown = text_of(page.text)
    assert "mark: wanted" in shown
    assert not {"mark: old", "mark: other-actor", "mark: other-run"} & set(
        re.findall(r"mark: [\w-]+", shown)
    )
    assert 'value="1h"' in page.text and 'value="ana"' in page.text
    by_run = text_of(server.get("/ui/audit?run=x").text)
    assert "mark: old" in by_run and "mark: other-run" not in by_run
    assert server.get("/ui/audit?since=yesterday").status_code == 400


def test_page_numbers_and_cursors_past_any_row_are_pages_not_500s(
    app: perdure.App, server: TestClient
) -> None:
    """`?page=` and `?before=` of 10**23 overflow SQL integers: an empty page, never a 500."""
    sign_in(server, token(app, "read"))
    huge = str(10**23)
    assert server.get(f"/ui/runs?page={huge}").status_code == 200
    assert server.get(f"/ui/audit?before={huge}").status_code == 200


def session_of(client: TestClient) -> str:
    value = client.cookies.get(dashboard.SESSION_COOKIE)
    assert value, "not signed in"
    return value


def signed_in(client: TestClient) -> bool:
    return client.get("/ui/runs", follow_redirects=False).status_code == 200


def test_a_copied_session_cookie_dies_with_sign_out(app: perdure.App, server: TestClient) -> None:
    """A copy of the session cookie works while the session lives, in a browser of its own
    and against a new server process on the same store; after sign-out it is worthless."""
    csrf = sign_in(server, token(app, "read"))
    session = session_of(server)
    with TestClient(create_app(app)) as other:  # a restarted (or second) server
        other.cookies.set(dashboard.SESSION_COOKIE, session, path="/ui")
        assert signed_in(other)
        assert server.post("/ui/logout", data={"csrf": csrf}).url.path == "/ui/login"
        refused = other.get("/ui/runs", follow_redirects=False)
        assert refused.status_code == 303 and refused.headers["location"].startswith("/ui/login")
        gone = [c for c in refused.headers.get_list("set-cookie") if "perdure_session=" in c]
        # the dead cookie is cleared, not sent again (at /ui, and at / in case another port
        # of the host set one there)
        assert gone and all("max-age=0" in c.lower() for c in gone), gone
    actions = [a.action for a in app.runtime.sync(Access(app.runtime.store).audit_log(), "audit")]
    assert actions[:2] == ["session.end", "session.start"]


def test_sessions_end_when_idle_too_long_or_too_old(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """A session left alone past the idle limit ends; one in use ends at the absolute
    limit however busy it is (a TestClock drives the time)."""
    sign_in(server, token(app, "read"))
    clock.advance(timedelta(hours=3, minutes=59))
    assert signed_in(server)  # used just in time: the idle limit starts again
    clock.advance(timedelta(hours=4, seconds=1))
    assert not signed_in(server)
    sign_in(server, token(app, "read", name="bob"))
    for _ in range(8):  # a request every 3 hours never reaches the idle limit
        clock.advance(timedelta(hours=3))
        assert signed_in(server)
    clock.advance(timedelta(hours=3))  # 27 h after sign-in: past the absolute 24 h
    assert not signed_in(server)


def test_revoking_a_token_ends_its_sessions(app: perdure.App, server: TestClient) -> None:
    """`perdure token revoke` ends every dashboard session signed in with that token."""
    made = operations.create_token(app, local_operator(), "carl", ["read"])
    token_id, value = app.runtime.sync(made, "token")
    sign_in(server, value)
    assert signed_in(server)
    app.runtime.sync(operations.revoke_token(app, local_operator(), token_id), "revoke")
    assert not signed_in(server)
    assert server.get("/ui/stream").status_code == 401


def test_a_session_cookie_is_secure_over_https(app: perdure.App) -> None:
    """Served over https (TLS in front), the session and CSRF cookies are marked Secure."""
    with TestClient(create_app(app), base_url="https://dash.example") as client:
        csrf = form_csrf(client.get("/ui/login").text)
        answer = client.post(
            "/ui/login",
            data={"token": token(app, "read"), "csrf": csrf},
            headers={"Origin": "https://dash.example"},
            follow_redirects=False,
        )
        assert answer.status_code == 303, answer.text
        cookies = answer.headers.get_list("set-cookie")
        assert cookies and all("; secure" in c.lower() for c in cookies), cookies


def test_a_run_page_draws_the_run_over_time_and_its_live_output(
    app: perdure.App, server: TestClient
) -> None:
    """The run page draws each step as a bar over time and shows what the steps wrote to
    the run's stream, by attempt: a retried step's first attempt is marked replaced."""
    tries: list[int] = []

    @app.step(effect="idempotent", name="speak", retry=perdure.Retry(max_attempts=2, initial=0))
    def speak() -> str:
        tries.append(1)
        perdure.stream.write(f"draft {len(tries)} ")
        perdure.stream.write({"done": len(tries)}, topic="progress")
        if len(tries) == 1:
            raise RuntimeError("cut off")
        perdure.stream.write("final words")
        return "ok"

    @app.workflow(name="speaker")
    async def speaker() -> str:
        return await speak()

    app.start(speaker, run_id="speaks-1")
    TestWorker(app).run_until_idle()
    sign_in(server, token(app, "read"))
    page = server.get("/ui/runs/speaks-1").text
    shown = text_of(page)
    assert "Live output" in shown and "began again" in shown
    assert "draft 1" in shown and "draft 2 final words" in shown
    assert "(replaced by a later attempt)" in shown and 'progress : {"done": 2}' in shown
    assert page.count('class="bar bar-') == 1 and "Over time" in shown


def test_pause_now_on_a_running_run_tells_its_worker_to_abort_its_calls(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """A running run's page offers "Pause now"; pressing it records the pause with `now`
    (audited), so the heartbeat of the worker holding the run says to abort its calls."""
    app.start("quick", 2, run_id="busy-1")
    [claim] = app.runtime.sync(
        app.runtime.store.claim("w1", clock.now(), 30.0, 1, ["quick"]), "claim"
    )
    assert claim.run.id == "busy-1"
    csrf = sign_in(server, token(app, "operate"))
    page = server.get("/ui/runs/busy-1").text
    assert 'value="pause_now"' in page and "Pause now" in page
    form = {"csrf": csrf, "run_id": "busy-1", "action": "pause_now"}
    done = server.post("/ui/runs/act", data=form)
    assert done.status_code == 200 and "calls in flight aborted" in text_of(done.text)
    [state] = app.runtime.sync(
        app.runtime.store.heartbeat("w1", ["busy-1"], clock.now() + 30), "beat"
    )
    assert state.pause_requested and state.abort
    [audit] = app.runtime.sync(
        Access(app.runtime.store).audit_log(target="run:busy-1", limit=1), "audit"
    )
    assert audit.action == "run.pause" and json.loads(audit.detail)["now"] is True


def test_the_agents_page_shows_each_shared_budget_with_its_agents(
    app: perdure.App, server: TestClient, clock: TestClock
) -> None:
    """A budget agents share shows beside the agents: spent this hour and day against its
    limits, and which agents share it."""
    now = clock.now()
    app.runtime.sync(
        Budgets(app.runtime.store).declare_agent("helper", '{"shared": "team-a"}', now), "declare"
    )
    app.runtime.sync(
        Budgets(app.runtime.store).put_shared_budget(
            SharedBudget("team-a", tokens_per_day=2000), now
        ),
        "s",
    )
    row = UsageRow("quick-1", 9, "helper", "m", 500, 0, 0.0, now, pool="team-a")
    app.runtime.sync(Budgets(app.runtime.store).record_usage(row), "usage")
    sign_in(server, token(app, "read"))
    page = text_of(server.get("/ui/agents").text)
    assert "Shared budgets team-a shared by helper" in page
    assert "500 of 2,000 (25%)" in page
