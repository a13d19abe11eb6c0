"""A budget shared across agents: two agents whose specs say `[budget] shared = "team-a"`
spend from one pool. Their runs, all at once against a real OpenAI-compatible server that
bills every request, never spend past the pool's limit (nor past an agent's own tighter
one), on SQLite and PostgreSQL; a raise of the pool wakes runs of both agents; the budget
command shows and changes it, and refuses bad input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_servers import COUNTING_SPEC, CountingServer

import perdure
from perdure.agent import budgets
from perdure.agent.budget_sql import Budgets, SharedBudget
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli
from perdure.server.access_sql import Access
from perdure.testing import TestClock, TestWorker


def _agent(app: perdure.App, tmp_path: Path, server: CountingServer, name: str,
           budget: str) -> Agent:  # fmt: skip
    path = tmp_path / f"{name}.toml"
    key_env = "PERDURE_TEST_COUNTING_KEY"
    path.write_text(
        COUNTING_SPEC.format(name=name, base=server.origin, key_env=key_env, budget=budget)
    )
    agent = Agent(app.runtime, load_spec(path))
    app.runtime.sync(
        budgets.declare(app.runtime, agent.spec), "declare"
    )  # as a worker serving it does
    return agent


@pytest.mark.slow
def test_two_agents_never_spend_past_their_shared_budget_or_their_own(
    store_url: str, tmp_path: Path, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pool 5,000 tokens a day for two agents (beta also 1,200 of its own) whose calls may
    each take ~1,100: beta's six runs spend within its own limit; alpha's six, all at once,
    get only what beta left of the pool; what the server billed stays within the pool.
    Raising the pool to 8,000 wakes parked runs and the bill stays within it; beta within
    its own; every call is recorded against the pool."""
    monkeypatch.setenv("PERDURE_TEST_COUNTING_KEY", "k")
    app = perdure.App(store_url, clock=TestClock())
    try:
        alpha = _agent(app, tmp_path, server, "alpha", 'shared = "team-a"')
        beta = _agent(app, tmp_path, server, "beta", 'shared = "team-a"\ntokens_per_day = 1200')
        woken = app.runtime.sync(budgets.set_shared(app.runtime, "team-a", SharedBudget("team-a",
                                            tokens_per_day=5000)), "set")  # fmt: skip
        assert woken == 0
        handles = [app.start(beta.workflow, {"prompt": f"q{i}"}, run_id=f"beta{i}")
                   for i in range(6)]  # fmt: skip
        TestWorker(app, concurrency=12).run_until_idle()
        beta_billed = sum(s.total for s in server.served)
        assert 0 < beta_billed <= 1200
        handles += [app.start(alpha.workflow, {"prompt": f"q{i}"}, run_id=f"alpha{i}")
                    for i in range(6)]  # fmt: skip
        TestWorker(app, concurrency=12).run_until_idle()
        billed = sum(s.total for s in server.served)
        assert beta_billed < billed <= 5000
        alone = 5000 // min(s.total for s in server.served)  # alpha's calls alone would fit
        assert len(server.served) - 1 < alone  # beta's call took its room in the pool
        recorded = app.runtime.sync(Budgets(app.runtime.store).usage(None, 0.0), "usage")
        assert sum(u.input_tokens + u.output_tokens for u in recorded) == billed
        assert {u.pool for u in recorded} == {"team-a"}
        assert {u.agent for u in recorded} == {"alpha", "beta"}
        done = [h for h in handles if h.status() == "completed"]
        parked = [h for h in handles if h.status() == "waiting"]
        assert len(done) == len(server.served) and len(done) + len(parked) == 12

        raised = budgets.set_shared(
            app.runtime, "team-a", SharedBudget("team-a", tokens_per_day=8000)
        )
        assert app.runtime.sync(raised, "raise") >= 1
        TestWorker(app, concurrency=12).run_until_idle()
        billed = sum(s.total for s in server.served)
        assert 5000 < billed <= 8000
        recorded = app.runtime.sync(Budgets(app.runtime.store).usage(None, 0.0), "usage")
        assert sum(u.input_tokens + u.output_tokens for u in recorded if u.agent == "beta") <= 1200
        shown = app.runtime.sync(budgets.describe_shared(app.runtime, "team-a"), "describe")
        assert shown["spent"]["day"]["tokens"] == billed
        assert shown["agents"] == ["alpha", "beta"]
        assert shown["limits"]["tokens_per_day"] == 8000
        print(f"shared budget: spent/B {billed / 8000:.3f}")
    finally:
        app.close()


def test_the_budget_command_shows_and_changes_a_shared_budget_and_refuses_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`perdure budget --shared NAME` shows its limits, spend and agents; flags change only
    the limits given (audited); negative or non-numeric limits, an unknown shared budget, or
    an agent and --shared at once are refused in one line, changing nothing."""
    db = f"sqlite:///{tmp_path}/c.db"
    app = perdure.App(db)
    server = CountingServer()
    try:
        _agent(app, tmp_path, server, "alpha", 'shared = "team-a"')
        runner = CliRunner()

        def budget(*args: str) -> tuple[int, str]:
            done = runner.invoke(cli, ["--db", db, "budget", *args])
            return done.exit_code, done.output

        code, out = budget("--shared", "team-a")
        assert code == 0 and "shared by: alpha" in out
        assert [x.split()[1] for x in out.splitlines() if x.startswith("tokens_per_day")] == [
            "none"
        ]
        code, out = budget("--shared", "team-a", "--tokens-per-day", "5000")
        assert code == 0 and "changed; 0 parked run(s) woken" in out
        code, out = budget("--shared", "team-a", "--cost-per-day", "2.5")
        assert code == 0
        stored = app.runtime.sync(Budgets(app.runtime.store).get_shared_budget("team-a"), "get")
        assert stored == SharedBudget("team-a", tokens_per_day=5000, cost_per_day=2.5)
        code, out = budget("alpha")
        assert code == 0 and "also held to the shared budget team-a" in out

        for args, message in (
            (("--shared", "team-a", "--tokens-per-day", "-5"), "must be 0 or more"),
            (("--shared", "team-a", "--cost-per-hour", "lots"), "is not a cost"),
            (("--shared", "team-b", "--tokens-per-day", "10"), "no shared budget named 'team-b'"),
            (("--shared", "team-b"), "no shared budget named 'team-b'"),
            (("alpha", "--shared", "team-a"), "name one AGENT, or --shared NAME"),
            (("--shared", "team-a"), None),
        ):
            code, out = budget(*args)
            if message is None:
                assert code == 0
                continue
            assert code != 0 and message in out, out
            assert len(out.strip().splitlines()) == 1, out
        assert (
            app.runtime.sync(Budgets(app.runtime.store).get_shared_budget("team-a"), "get")
            == stored
        )
        assert (
            app.runtime.sync(Budgets(app.runtime.store).get_shared_budget("team-b"), "get") is None
        )
        code, out = budget("--shared", "team-a", "--reset")
        assert code == 0 and "limits forgotten" in out
        assert (
            app.runtime.sync(Budgets(app.runtime.store).get_shared_budget("team-a"), "get") is None
        )
        audit = app.runtime.sync(
            Access(app.runtime.store).audit_log(target="shared:team-a", limit=10), "audit"
        )
        assert [a.action for a in audit if a.outcome == "ok"] == ["budget.set"] * 3
    finally:
        app.close()
