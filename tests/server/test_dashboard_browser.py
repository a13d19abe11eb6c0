"""The dashboard in a real headless Chromium (Playwright): sign in, open the runs list, a run
parked in needs_attention (its resolve forms) and a run at a gate, approve the gate from the
approvals page, and watch the run page turn `completed` by itself while a real worker, in its
own App on the same SQLite file, runs the rest.

On the way it remakes the dashboard screenshots the docs show (docs/images/dashboard/, see
tests/dashboard_screenshots.py). To refresh them, run this module and commit the PNGs:

    PYTHONPATH=$PWD/src .venv/bin/pytest tests/server/test_dashboard_browser.py -q
    git add docs/images/dashboard
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from dashboard_screenshots import VIEWPORT, shoot, shown_in_docs
from extras_needed import needs
from live_workers import worker_thread
from local_servers import live_server
from parked_runs import crash_and_recover

pytest.importorskip("starlette", reason=needs("server"))
pytest.importorskip("playwright", reason=needs("dev"))

import perdure
from perdure.agent.budget_sql import Budget, Budgets, UsageRow
from perdure.server import operations
from perdure.server.access import local_operator
from perdure.testing import TestClock

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
RUN_ID = "deploy-42"
PARKED_ID = "charge-7"


def register(app: perdure.App) -> None:
    """`deploy`: a read step, a wait at the gate approve:c1, then a `once` step that writes
    to the run's stream."""

    @app.step(effect="read", name="plan")
    def plan(target: str) -> dict[str, str]:
        return {"target": target, "change": "roll out v2"}

    @app.step(name="apply")
    def apply(target: str, verdict: dict[str, object]) -> str:
        perdure.stream.write(f"applying to {target}")  # the run page shows it live
        return f"applied to {target} ({verdict.get('comment')})"

    @app.workflow(name="deploy")
    async def deploy(target: str) -> str:
        await plan(target)
        verdict = await perdure.wait_event("approve:c1")
        return await apply(target, verdict)

    @app.workflow(name="nightly")
    def nightly() -> None:
        return None

    app.schedule(cron="0 3 * * *", tz="Europe/Paris", workflow="nightly", name="nightly")


def park_a_charge(db: str) -> None:
    """Run PARKED_ID, of a workflow only this App knows (the stack's worker leaves it
    alone), into needs_attention: its worker dies inside the `once` step `charge_card`.
    The driven clock starts two minutes ago, so the run's times read as recent."""
    clock = TestClock(time.time() - 120)
    app = perdure.App(db, clock=clock)

    @app.step(name="charge_card")
    def charge_card(order: str) -> str:
        return f"charged {order}"

    @app.workflow(name="charge")
    async def charge(order: str) -> str:
        return await charge_card(order)

    try:
        app.start("charge", "order-7", run_id=PARKED_ID)
        crash_and_recover(app, clock, "charge_card")
        assert app.get_run(PARKED_ID).status == "needs_attention"
    finally:
        app.close()


def next_3am_paris() -> str:
    """The next 03:00 in Paris, as the dashboard writes UTC times."""
    now = datetime.now(ZoneInfo("Europe/Paris"))
    day = now.date() + timedelta(days=1 if now.hour >= 3 else 0)
    local = datetime.combine(day, dtime(3), ZoneInfo("Europe/Paris"))
    return local.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


@dataclass
class Stack:
    url: str
    token: str
    app: perdure.App
    db: str


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """uvicorn serving the dashboard on a free port, and a worker, each in its own thread and
    with its own App on one SQLite file (as `perdure serve` and `perdure worker` would)."""
    db = f"sqlite:///{tmp_path}/dash.db"
    served, working = perdure.App(db), perdure.App(db)
    register(served)
    register(working)
    made = operations.create_token(served, local_operator(), "ana", ["approve", "operate"])
    _, token = served.runtime.sync(made, "token")  # as `perdure token create` does: audited
    now = served.clock.now()
    served.runtime.sync(
        Budgets(served.runtime.store).put_budget(Budget("triage", tokens_per_hour=5000), now),
        "budget",
    )
    usage = UsageRow("deploy-1", 0, "triage", "small", 1200, 300, 0.02, now - 60)
    served.runtime.sync(Budgets(served.runtime.store).record_usage(usage), "usage")
    try:
        with (
            live_server(served) as url,
            worker_thread(working, poll=0.2, gc_every=None, lease=10.0, stop_within=30),
        ):
            yield Stack(url, token, served, db)
    finally:
        working.close()
        served.close()


def status_of(app: perdure.App, run_id: str, wanted: str, within: float = 20.0) -> str:
    """Wait until the run has status `wanted` (or time runs out); return its status."""
    deadline = time.monotonic() + within
    status = app.get_run(run_id).status
    while status != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
        status = app.get_run(run_id).status
    return status


def test_sign_in_open_a_run_approve_its_gate_and_see_it_complete(stack: Stack) -> None:
    """The whole path a person takes, in a real browser, asserted on the DOM."""
    assert Path(CHROMIUM).exists(), (
        f"Debian's chromium is needed at {CHROMIUM}: apt-get install -y chromium (.ci/run does)"
    )
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    park_a_charge(stack.db)
    stack.app.start("deploy", "prod", run_id=RUN_ID)
    assert status_of(stack.app, RUN_ID, "waiting") == "waiting"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            page = context.new_page()
            errors: list[str] = []
            made: set[str] = set()  # the docs' screenshots this run remade
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # Not signed in: the runs list sends us to the login page.
            page.goto(f"{stack.url}/ui/runs")
            expect(page).to_have_url(re.compile(r"/ui/login\?next="))
            page.screenshot(path=ARTIFACTS / "01-login.png")
            page.fill("#token", "pdr_not_a_token_at_all")
            page.click("button[type=submit]")
            expect(page.locator("p.error")).to_contain_text("not valid")
            page.fill("#token", stack.token)
            page.click("button[type=submit]")

            # The runs list, with our run waiting.
            expect(page).to_have_url(f"{stack.url}/ui/runs")
            row = page.locator("#runs tbody tr", has_text=RUN_ID)
            expect(row).to_contain_text("deploy")
            expect(row.locator(".status")).to_have_text("waiting")
            expect(page.locator(".top nav .badge")).to_have_text("1")
            expect(page.locator("#live-state")).to_have_class(re.compile(r"\bon\b"))
            page.screenshot(path=ARTIFACTS / "02-runs.png", full_page=True)
            expect(page.locator("#waiting")).to_contain_text("1 run waits for a person")
            made.add(shoot(page, "runs"))

            # The parked run: its step in doubt, with the forms that resolve it.
            page.locator("#runs a", has_text=PARKED_ID).click()
            expect(page.locator("#run-status")).to_have_text("needs_attention")
            doubt = page.locator("#timeline tbody tr", has_text="charge_card").last
            expect(doubt.locator("b.state")).to_have_text("needs_attention")
            expect(doubt.locator("button")).to_have_text(["Retry step", "Fail step"])
            made.add(shoot(page, "run-needs-attention", top="#run-error"))
            page.go_back()

            # The run: waiting at the gate, its timeline so far.
            row.locator("a", has_text=RUN_ID).click()
            expect(page).to_have_url(f"{stack.url}/ui/runs/{RUN_ID}")
            expect(page.locator("#run-status")).to_have_text("waiting")
            timeline = page.locator("#timeline tbody")
            expect(timeline).to_contain_text("plan")
            expect(timeline).to_contain_text("event.wait")
            expect(timeline).not_to_contain_text("apply")
            plan_row = timeline.locator("tr", has_text="step.outcome")
            expect(plan_row).to_contain_text("read")
            expect(plan_row).to_contain_text("none: the recorded outcome is replayed")
            expect(page.locator(".notice")).to_contain_text("event:approve:c1")
            page.screenshot(path=ARTIFACTS / "03-run-waiting.png", full_page=True)
            made.add(shoot(page, "run-waiting"))

            # Approve from the approvals page, in a second tab; the first stays open.
            approvals = context.new_page()
            approvals.goto(f"{stack.url}/ui/runs")
            approvals.click(".top nav a:has-text('Approvals')")
            gate = approvals.locator("article.gate", has_text=RUN_ID)
            expect(gate).to_contain_text("c1")
            gate.locator("textarea[name=comment]").fill("looks right")
            approvals.screenshot(path=ARTIFACTS / "04-approvals.png", full_page=True)
            made.add(shoot(approvals, "approvals"))
            gate.locator("button[value=approve]").click()
            expect(approvals.locator(".flash")).to_have_text(f"Call c1 of run {RUN_ID} approved.")
            expect(approvals.locator("#decisions")).to_contain_text("looks right")
            approvals.screenshot(path=ARTIFACTS / "05-approved.png", full_page=True)

            # The run page, never reloaded, turns completed through the live updates.
            expect(page.locator("#run-status")).to_have_text("completed", timeout=30_000)
            expect(timeline).to_contain_text("apply")
            expect(timeline).to_contain_text("run.completed")
            expect(page.locator("#run-result")).to_contain_text("applied to prod (looks right)")
            expect(page.locator("#run-output")).to_contain_text("applying to prod")
            assert page.locator("#run-picture rect").count() >= 2  # plan, the wait, apply
            expect(page.locator("#run-audit")).to_contain_text("gate.approve")
            expect(page.locator("#run-audit")).to_contain_text("looks right")
            expect(page.locator(".notice")).to_have_count(0)  # no longer waits for anyone
            assert page.locator("body").get_attribute("data-refreshed")  # swapped, not reloaded
            page.screenshot(path=ARTIFACTS / "06-run-completed.png", full_page=True)
            made.add(shoot(page, "run-completed"))
            expect(approvals.locator("#no-gates")).to_be_visible(timeout=30_000)

            # The other pages, through the navigation.
            for label, words in (
                ("Schedules", ["nightly", "cron 0 3 * * * (Europe/Paris)", next_3am_paris()]),
                ("Agents", ["triage", "1,500 of 5,000 (30%)", "Tokens per day"]),
                ("Workers", ["alive (idle)"]),
                ("Triggers", ["schedule", "nightly"]),
                ("Audit log", ["gate.approve", "token.create", "looks right"]),
            ):
                page.click(f".top nav a:has-text('{label}')")
                expect(page.locator("h1")).to_have_text(label)
                for word in words:
                    expect(page.locator("main")).to_contain_text(word)
                if label == "Agents":
                    expect(page.locator("svg.chart rect.bar")).to_have_count(14)  # 14 days
                page.screenshot(path=ARTIFACTS / f"07-{label.split()[0].lower()}.png")
                if label in ("Agents", "Workers", "Triggers"):
                    made.add(shoot(page, label.lower()))
            assert errors == []
            missing = shown_in_docs() - made
            assert missing == set(), f"docs show screenshots this test does not make: {missing}"
        finally:
            browser.close()
    assert stack.app.get_run(RUN_ID).status == "completed"
    assert stack.app.handle(RUN_ID).result(timeout=5) == "applied to prod (looks right)"
