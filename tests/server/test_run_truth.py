"""A run's page and `perdure show` tell what is true: the step a held run executes while
its intent is still buffered, and since when; a `once` step's wait for an operator drawn as
a wait, not as execution; perdure's own markers hidden from timelines (kept by --all)."""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from live_workers import worker_thread
from perdure.cli.main import cli
from perdure.server.access import create_token
from perdure.server.run_picture import picture
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from waits import wait_for

pytest.importorskip("starlette")

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient


@pytest.fixture
def client(app: perdure.App) -> Iterator[TestClient]:
    """The dashboard of `app`, signed in with a read token."""
    from perdure.server import create_app

    _, token = app.runtime.sync(create_token(app, "ana", ["read"]), "token")
    with TestClient(create_app(app)) as served:
        csrf = re.search(r'name="csrf" value="([^"]+)"', served.get("/ui/login").text)
        assert csrf is not None
        signed = served.post("/ui/login", data={"token": token, "csrf": csrf[1], "next": "/ui"},
                             follow_redirects=False)  # fmt: skip
        assert signed.status_code == 303
        yield served


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_a_held_run_shows_the_step_it_executes_before_its_intent_is_written(
    tmp_path: Path,
) -> None:
    """An idempotent step's intent is buffered by its worker, but the run page and `show`
    name the step it executes, for how long and on which worker (from its stream's attempt
    marker), instead of 'no worker has claimed this run'."""
    from perdure.server import create_app

    db = f"sqlite:///{tmp_path}/held.db"
    app = perdure.App(db)
    release = threading.Event()

    @app.step(name="slow_write", effect="idempotent")
    def slow_write() -> str:
        perdure.stream.write("writing...")
        release.wait(30)
        return "written"

    @app.workflow(name="holder")
    def holder() -> str:
        return slow_write()

    _, token = app.runtime.sync(create_token(app, "ana", ["read"]), "token")
    try:
        with worker_thread(app, poll=0.05, lease=30.0) as worker, TestClient(create_app(app)) as c:
            run_id = app.start("holder").id
            try:
                wait_for("the stream's marker", lambda: app.runtime.sync(
                    app.runtime.store.stream_last(run_id), "last") >= 1)  # fmt: skip
                time.sleep(1.1)  # so "for Ns" is at least 1
                csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
                assert csrf is not None
                c.post("/ui/login", data={"token": token, "csrf": csrf[1], "next": "/ui"},
                       follow_redirects=False)  # fmt: skip
                page = text_of(c.get(f"/ui/runs/{run_id}").text)
                journaled = [e.kind for e in app.journal(run_id) if e.position == 0]
                shown = CliRunner().invoke(cli, ["--db", db, "show", run_id]).output
            finally:
                release.set()
            assert app.handle(run_id).result(timeout=10) == "written"
    finally:
        app.close()
    said = re.compile(rf"executing slow_write #0 for [1-9]\d*s on worker {re.escape(worker.id)}")
    assert said.search(page), page
    assert "no worker has claimed this run" not in page
    line = next(x for x in shown.splitlines() if x.startswith("now "))
    assert said.search(line), shown
    if "step.intent" not in journaled:  # still buffered: the stream is what told
        assert "from its stream: the intent is still buffered" in line


def test_an_intent_still_buffered_is_read_from_the_stream(
    app: perdure.App, clock: TestClock, client: TestClient
) -> None:
    """A claimed run whose journal holds nothing yet but whose stream holds the attempt
    marker of step #0 (its worker buffers the intent, e.g. through a store outage): the run
    page names the step, since when and the worker, and says the intent is buffered."""
    import json

    from perdure.engine.streams import KEEP

    @app.workflow(name="quick")
    def quick() -> None:
        return None

    run_id = app.start("quick").id
    claims = app.runtime.sync(
        app.runtime.store.claim("host-a:4242", clock.now(), 30.0, 10, ["quick"]), "claim"
    )
    assert [c.run.id for c in claims] == [run_id]
    marker = json.dumps({"step": "fetch", "position": 0, "attempt": 2})
    rows = [("attempt", "step:0", marker, clock.now()), ("chunk", "out", '"half"', clock.now())]
    app.runtime.sync(app.runtime.store.append_stream(run_id, rows, KEEP), "stream")
    clock.advance(12)
    page = text_of(client.get(f"/ui/runs/{run_id}").text)
    assert (
        "executing fetch #0, attempt 2 for 12s on worker host-a:4242 (from its stream: the "
        "intent is still buffered)"
    ) in page
    assert "no worker has claimed this run" not in page


def test_an_operators_wait_is_drawn_as_a_wait(
    app: perdure.App, clock: TestClock, client: TestClient
) -> None:
    """A once step cut off by a crash, resolved by an operator 30 s later: its row in the
    picture is a short cut-off bar, then a 30 s wait for an operator, not 30 s of work."""

    @app.step(name="pay", effect="once")
    def pay() -> str:
        return "paid"

    @app.workflow(name="payer")
    def payer() -> str:
        return pay()

    run_id = app.start("payer").id
    dying = TestWorker(app)
    dying.crash_after_intent("pay")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    clock.advance(60)  # past the dead worker's lease
    TestWorker(app).run_until_idle()
    assert app.get_run(run_id).status == "needs_attention"
    clock.advance(30)
    app.resolve(run_id, "pay", value="paid by hand")
    TestWorker(app).run_until_idle()
    assert app.get_run(run_id).status == "completed"
    drawn = picture(app.get_run(run_id), app.journal(run_id), clock.now())
    assert drawn is not None
    row = [(b.kind, b.title) for b in drawn.bars if b.label.startswith("0 ")]
    assert [kind for kind, _ in row] == ["failed", "wait"]
    assert row[1][1] == "0 pay: waited for an operator, 30000 ms"
    page = client.get(f"/ui/runs/{run_id}").text
    assert "waited for an operator, 30000 ms" in page and 'class="bar bar-wait"' in page


def test_perdures_own_markers_are_hidden_from_timelines_but_kept_by_show_all(
    app: perdure.App, db_url: str, client: TestClient
) -> None:
    """A `perdure.`-named patch marker (an agent run's budget marker) is not a step of the
    timeline in `show` or on the run page; `show --all` lists it."""

    @app.step(name="work", effect="read")
    def work() -> str:
        return "done"

    @app.workflow(name="marked")
    def marked() -> str:
        assert perdure.patched("perdure.budget.reservations")
        return work()

    run_id = app.start("marked").id
    TestWorker(app).run_until_idle()
    assert [e.kind for e in app.journal(run_id) if e.position == 0] == ["patch.marker"]
    shown = CliRunner().invoke(cli, ["--db", db_url, "show", run_id]).output
    everything = CliRunner().invoke(cli, ["--db", db_url, "show", run_id, "--all"]).output
    assert "perdure.budget.reservations" not in shown and "work" in shown
    assert "patch.marker" in everything and "perdure.budget.reservations" in everything
    page = client.get(f"/ui/runs/{run_id}").text
    assert "perdure.budget.reservations" not in page and "work" in page
