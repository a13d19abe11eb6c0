"""Prometheus metrics at /metrics after real runs: runs by state, step latency, retries, a
takeover with its recovery, schedule ticks, and an agent's tokens and cost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("prometheus_client", reason=needs("observe"))
pytest.importorskip("starlette", reason=needs("server"))

import httpx
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import perdure
from perdure.agent.budget_sql import Budgets
from perdure.agent.loop import Agent
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.observe import metrics as metrics_module
from perdure.observe.metrics import Metrics, serve_metrics
from perdure.server import create_app
from perdure.server.access import create_token
from perdure.testing import SimulatedCrash, TestClock, TestWorker

LEASE = 30.0
SPEC = """
name = "helper"
goal = "Answer"
instructions = "Be brief."

[models.fast]
provider = "scripted"
price = { input_per_mtok = 1000, output_per_mtok = 2000 }

[tools]
grant = ["finish"]
"""


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, by name and sorted labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def test_metrics_after_runs_retries_takeover_ticks_and_an_agent(
    app: perdure.App, clock: TestClock, tmp_path: Path, metrics: Metrics
) -> None:
    """GET /metrics reports what the worker did, each figure matching what happened."""
    flaky_calls: list[int] = []

    @app.step(name="fetch", effect="read")
    def fetch() -> int:
        return 1

    @app.step(name="flaky", effect="idempotent", retry=perdure.Retry(initial=0, jitter=0))
    def flaky() -> int:
        flaky_calls.append(1)
        if len(flaky_calls) == 1:
            raise ConnectionError("reset")
        return 2

    @app.step(name="charge", effect="keyed")
    def charge() -> str:
        return "charged"

    @app.workflow(name="job")
    def job(n: int) -> int:
        return fetch() + flaky() + n

    @app.workflow(name="broken")
    def broken() -> None:
        raise ValueError("bad input")

    @app.workflow(name="pay")
    def pay() -> str:
        fetch()
        return charge()

    @app.schedule(every=60, name="tick")
    @app.workflow(name="ticked")
    def ticked() -> str:
        return fetch() and "ticked"

    (tmp_path / "agent.toml").write_text(SPEC)
    model = ScriptedModel([{"content": "all done", "usage": {"input_tokens": 120,
                                                              "output_tokens": 30}}])  # fmt: skip
    agent = Agent(app.runtime, load_spec(tmp_path / "agent.toml"), providers={"fast": model})

    handles = [app.start(job, n) for n in range(3)]
    app.start(broken)
    TestWorker(app, lease=LEASE).run_until_idle()
    assert [h.result(timeout=5) for h in handles] == [3, 4, 5]

    paid = app.start(pay)  # its worker dies between the intent of `charge` and its outcome
    dying = TestWorker(app, lease=LEASE)
    dying.crash_after_intent("charge")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    clock.advance(LEASE + 1)  # the lease expires; the next worker takes the run over
    TestWorker(app, lease=LEASE).run_until_idle()
    assert paid.result(timeout=5) == "charged"

    clock.advance(60 - clock.now() % 60)  # the next minute: one tick fires
    TestWorker(app, lease=LEASE).run_until_idle()
    clock.advance(300)  # 5 ticks due: 3 too late (missed), 1 fires, 1 skipped behind it
    TestWorker(app, lease=LEASE).run_until_idle()
    ticks = [t.status for t in app.schedule_ticks("tick", limit=100)]
    assert sorted(ticks) == ["fired", "fired", "missed", "missed", "missed", "skipped"]

    answer = app.start(agent.workflow, {"prompt": "say done"})
    TestWorker(app, lease=LEASE).run_until_idle()
    assert answer.result(timeout=5)["status"] == "done"

    token = app.runtime.sync(create_token(app, "scraper", ["read"]), "token")[1]
    with TestClient(create_app(app)) as client:
        response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)

    counts = app.runtime.sync(app.runtime.store.count_runs(), "count")
    assert value(found, "perdure_runs", status="completed") == counts["completed"] == 7
    assert value(found, "perdure_runs", status="failed") == 1
    assert value(found, "perdure_runs", status="running") == 0
    assert value(found, "perdure_store_up") == 1

    hist = "perdure_step_seconds_count"
    assert value(found, hist, step="flaky", effect="idempotent", outcome="error") == 1
    assert value(found, hist, step="flaky", effect="idempotent", outcome="ok") == 3
    assert value(found, hist, step="fetch", effect="read", outcome="ok") == 3 + 1 + 2  # pay: once
    assert value(found, hist, step="charge", effect="keyed", outcome="ok") == 1  # after takeover
    assert value(found, "perdure_step_retries_total", step="flaky") == 1
    assert value(found, "perdure_lease_takeovers_total") == 1
    assert value(found, "perdure_recoveries_total", effect="keyed", action="rerun") == 1
    assert value(found, "perdure_run_executions_total", outcome="failed") == 1
    assert value(found, "perdure_runs_executing") == 0

    assert value(found, "perdure_schedule_ticks_total", status="fired") == 2
    assert value(found, "perdure_schedule_ticks_total", status="missed") == 3
    assert value(found, "perdure_schedule_ticks_total", status="skipped") == 1

    usage = app.runtime.sync(Budgets(app.runtime.store).usage("helper", 0.0), "usage")
    assert [(u.input_tokens, u.output_tokens) for u in usage] == [(120, 30)]
    assert value(found, "perdure_model_tokens_total", agent="helper", direction="input") == 120
    assert value(found, "perdure_model_tokens_total", agent="helper", direction="output") == 30
    assert value(found, "perdure_model_cost_total", agent="helper") == pytest.approx(usage[0].cost)
    assert usage[0].cost == pytest.approx(0.18)


def test_a_worker_serves_its_metrics_on_its_own_port(app: perdure.App, metrics: Metrics) -> None:
    """`--metrics-port` serves the same families, runs by state included, over plain HTTP."""

    @app.workflow(name="noop")
    def noop() -> None:
        return None

    app.start(noop)
    server = serve_metrics(app.runtime, 0)  # port 0: any free port
    try:
        port = server.server_address[1]
        found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    finally:
        server.shutdown()
        server.server_close()
    assert value(found, "perdure_runs", status="pending") == 1
    assert value(found, "perdure_lease_takeovers_total") == 0


def test_without_prometheus_client_metrics_say_what_to_install(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the observe extra /metrics answers 503 with the one line to fix it, and the
    rest of the server still works."""
    monkeypatch.setattr(metrics_module, "_default", None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with TestClient(create_app(app, metrics_public=True)) as client:
        response = client.get("/metrics")
        health = client.get("/healthz")
    assert response.status_code == 503
    assert response.text.strip() == (
        "/metrics needs the observe extra (prometheus_client is missing): "
        "pip install 'perdure[observe]'"
    )
    assert health.status_code == 200
