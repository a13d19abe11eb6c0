"""Budgets hold under concurrency: 10 runs at once on a worker of concurrency 10, against a
real OpenAI-compatible server that bills every request it answers, on SQLite and PostgreSQL.
What the server billed never exceeds the budget, and a raise wakes only the runs that fit."""

from __future__ import annotations

from pathlib import Path

import pytest
from wire_servers import COUNTING_SPEC, CountingServer

import perdure
from perdure.agent.budget_sql import Budget, Budgets
from perdure.agent.loop import Agent, raise_budget
from perdure.agent.spec import load_spec
from perdure.testing import TestClock, TestWorker


def _agent(app: perdure.App, tmp_path: Path, server: CountingServer, budget: str) -> Agent:
    path = tmp_path / "spender.toml"
    spec = COUNTING_SPEC.format(
        name="spender", base=server.origin, key_env="PERDURE_TEST_COUNTING_KEY", budget=budget
    )
    path.write_text(spec)
    return Agent(app.runtime, load_spec(path))


@pytest.mark.slow
def test_ten_concurrent_runs_never_spend_past_the_token_budget(
    store_url: str, tmp_path: Path, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget 5,000 tokens a day, 10 runs whose calls may each take ~1,100: only the calls
    whose worst case fits are sent (the rest park); raising it to 8,000 wakes as many
    parked runs as now fit, and the server's bill stays within each budget exactly."""
    monkeypatch.setenv("PERDURE_TEST_COUNTING_KEY", "k")
    app = perdure.App(store_url, clock=TestClock())
    try:
        agent = _agent(app, tmp_path, server, "tokens_per_day = 5000")
        start = agent.workflow
        handles = [app.start(start, {"prompt": f"q{i}"}, run_id=f"r{i}") for i in range(10)]
        TestWorker(app, concurrency=10).run_until_idle()
        billed = sum(s.total for s in server.served)
        assert 0 < billed <= 5000
        done = [h for h in handles if h.status() == "completed"]
        parked = [h for h in handles if h.status() == "waiting"]
        assert len(done) == len(server.served) and len(done) + len(parked) == 10
        assert len(done) >= 3  # the budget was used, not refused wholesale
        recorded = app.runtime.sync(Budgets(app.runtime.store).usage("spender", 0.0), "usage")
        assert sum(u.input_tokens + u.output_tokens for u in recorded) == billed
        per_call = max(s.total for s in server.served)

        raised = Budget("spender", tokens_per_day=8000)
        woken = app.runtime.sync(raise_budget(app.runtime, "spender", raised), "raise")
        assert 1 <= woken <= (8000 - billed) // (per_call - 50)  # only those that fit
        TestWorker(app, concurrency=10).run_until_idle()
        billed = sum(s.total for s in server.served)
        assert billed <= 8000
        assert len(server.served) == len(done) + woken
    finally:
        app.close()


@pytest.mark.slow
def test_ten_concurrent_runs_never_spend_past_the_cost_budget(
    tmp_path: Path, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cost limit holds the same way: 0.01 a day at the tier's prices."""
    monkeypatch.setenv("PERDURE_TEST_COUNTING_KEY", "k")
    app = perdure.App(f"sqlite:///{tmp_path}/c.db", clock=TestClock())
    try:
        agent = _agent(app, tmp_path, server, "cost_per_day = 0.01")
        for i in range(10):
            app.start(agent.workflow, {"prompt": f"q{i}"}, run_id=f"r{i}")
        TestWorker(app, concurrency=10).run_until_idle()
        cost = sum((s.prompt_tokens * 1.0 + s.completion_tokens * 2.0) / 1e6 for s in server.served)
        assert 0 < cost <= 0.01
        assert len(server.served) < 10
    finally:
        app.close()
