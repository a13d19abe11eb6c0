"""What waits for a person, everywhere: `GET /api/v1/stuck` (the object `perdure stuck
--json` prints), `/stuckz` for a monitor, `/readyz` unaffected, the dashboard's runs page,
and resolve with the step's probe asked again from the API and the dashboard (audited)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from test_dashboard import sign_in, text_of

import perdure
from perdure import ProbeAnswer
from perdure.cli.main import cli
from perdure.server import create_app, operations
from perdure.server.access import local_operator
from perdure.server.access_sql import Access
from perdure.testing import SimulatedCrash, TestClock, TestWorker

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient


class Ledger:
    """The payment system: refunds made by order, and whether it answers a probe."""

    def __init__(self) -> None:
        self.refunds: dict[str, str] = {}
        self.up = False

    def find(self, order: str) -> ProbeAnswer:
        if not self.up:
            return ProbeAnswer.cannot_tell("the payment provider is down")
        found = self.refunds.get(order)
        return ProbeAnswer.done(found) if found else ProbeAnswer.not_done()


@pytest.fixture
def ledger(app: perdure.App) -> Ledger:
    """`app` with a `return_order` workflow whose once `refund` step has a probe."""
    world = Ledger()

    @app.step(effect="once", name="refund", probe=world.find)
    def refund(order: str) -> str:
        world.refunds[order] = f"refund-{order}"
        return world.refunds[order]

    @app.workflow(name="return_order")
    async def return_order(order: str) -> str:
        return str(await refund(order))

    return world


@pytest.fixture
def client(app: perdure.App, ledger: Ledger) -> Iterator[TestClient]:
    with TestClient(create_app(app)) as test_client:
        yield test_client


def bearer(app: perdure.App, scope: str) -> dict[str, str]:
    made = operations.create_token(app, local_operator(), f"{scope}-er", [scope])
    _, value = app.runtime.sync(made, "token")
    return {"Authorization": f"Bearer {value}"}


def park(app: perdure.App, ledger: Ledger, clock: TestClock, run_id: str) -> None:
    """A refund made, then its worker killed before the outcome, while the provider is
    down: the probe cannot tell and the run waits for a person."""
    app.start("return_order", run_id, run_id=run_id)
    dying = TestWorker(app)
    dying.crash_after_intent("refund")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    ledger.refunds[run_id] = f"refund-{run_id} (before the crash)"
    clock.advance(dying.lease + 1)
    TestWorker(app).run_until_idle()
    assert app.get_run(run_id).status == "needs_attention"


def test_the_api_cli_and_monitor_tell_the_same_truth(
    app: perdure.App, ledger: Ledger, client: TestClient, clock: TestClock,
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With nothing waiting, /stuckz is 200 and the API lists nothing. A run parked for 2h:
    the API's object is the CLI's `stuck --json` (same reason and fix, the CLI without the
    app's code; its age by the real clock, not the test's), /stuckz is 503 with its count by
    cause and no id, and /readyz stays 200."""
    read = bearer(app, "read")
    assert client.get("/stuckz").json() == {"stuck": False, "runs": 0, "causes": {},
                                            "schedules": 0, "dead_messages": 0,
                                            "triggers": 0, "store": False}  # fmt: skip
    assert client.get("/api/v1/stuck", headers=read).json()["runs"] == []
    park(app, ledger, clock, "o1")
    clock.advance(2 * 3600)
    answer = client.get("/api/v1/stuck", headers=read)
    assert answer.status_code == 200
    [run] = answer.json()["runs"]
    assert run["run_id"] == "o1" and run["cause"] == "probe" and run["age"] == 7200
    assert "needs attention for 2h at step 0 (refund)" in run["reason"]
    assert "the payment provider is down" in run["reason"]
    assert run["fix"] == "perdure resolve o1 0 --value JSON | --retry | --fail | --probe"
    monkeypatch.setenv("PERDURE_DB", db_url)
    monkeypatch.delenv("PERDURE_APP", raising=False)
    printed = CliRunner().invoke(cli, ["stuck", "--json"])
    assert printed.exit_code == 1
    [cli_run] = json.loads(printed.output)["runs"]
    assert cli_run["age"] > run["age"]  # the real clock is past the test's
    same = {k: v for k, v in run.items() if k not in ("age", "reason")}
    assert {k: v for k, v in cli_run.items() if k not in ("age", "reason")} == same
    _, _, tail = run["reason"].partition(" at step ")
    assert cli_run["reason"].endswith(tail)
    monitor = client.get("/stuckz")
    assert monitor.status_code == 503 and monitor.json()["causes"] == {"probe": 1}
    assert "o1" not in monitor.text
    assert client.get("/readyz").status_code == 200
    assert client.get("/api/v1/stuck").status_code == 401


def test_the_api_asks_the_probe_again(
    app: perdure.App, ledger: Ledger, client: TestClient, clock: TestClock
) -> None:
    """POST resolve with `probe`: the next worker asks, the probe finds the refund, the run
    completes with the ledger's value; probe with another way is 422; audited as `probe`."""
    park(app, ledger, clock, "o2")
    op = bearer(app, "operate")
    both = client.post("/api/v1/runs/o2/resolve", json={"step": 0, "probe": True,
                                                        "retry": True}, headers=op)  # fmt: skip
    assert both.status_code == 422
    ledger.up = True
    asked = client.post(
        "/api/v1/runs/o2/resolve", json={"step": "refund", "probe": True}, headers=op
    )
    assert asked.json() == {"run_id": "o2", "status": "pending"}
    TestWorker(app).run_until_idle()
    assert app.handle("o2").result(timeout=5) == "refund-o2 (before the crash)"
    [entry] = app.runtime.sync(Access(app.runtime.store).audit_log(target="run:o2", limit=1), "a")
    assert entry.action == "run.resolve" and json.loads(entry.detail)["how"] == "probe"


def test_the_dashboard_shows_who_waits_and_asks_the_probe_again(
    app: perdure.App, ledger: Ledger, client: TestClient, clock: TestClock
) -> None:
    """The runs page says how many runs wait for a person, with the reason and the fix; the
    run page offers "Ask the probe again" for a step with a probe, which settles the run."""
    park(app, ledger, clock, "o3")
    clock.advance(600)
    csrf = sign_in(client, bearer(app, "operate")["Authorization"].split()[1])
    runs = text_of(client.get("/ui/runs").text)
    assert "1 run waits for a person" in runs
    assert "needs attention for 10m at step 0 (refund)" in runs
    assert "perdure resolve o3 0 --value JSON | --retry | --fail | --probe" in runs
    page = text_of(client.get("/ui/runs/o3").text)
    assert "Ask the probe again" in page and "Retry step" in page
    ledger.up = True
    form = {"csrf": csrf, "run_id": "o3", "action": "probe", "step": "0"}
    done = client.post("/ui/runs/act", data=form)
    assert "Step 0: its probe asked again; the run is pending." in text_of(done.text)
    TestWorker(app).run_until_idle()
    assert app.handle("o3").result(timeout=5) == "refund-o3 (before the crash)"
    assert "wait for a person" not in text_of(client.get("/ui/runs").text)
