"""A run parked by the budget check of perdure before reservations (its journal checked in:
golden_budget_parked.json) replays on today's code along its old path, is woken by a budget
raise like before, and finishes; its model call is reserved like any other."""

from __future__ import annotations

import json
from pathlib import Path

import perdure
from golden_journals import seed_journal
from perdure.agent.budget_sql import Budget, Budgets
from perdure.agent.loop import Agent, raise_budget
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.testing import TestClock, TestWorker

HERE = Path(__file__).parent
SPEC = """
name = "helper"
goal = "Do the task"

[models.fast]
provider = "scripted"
context_tokens = 100000

[budget]
tokens_per_day = 1
"""


def test_a_run_parked_before_reservations_replays_and_finishes(tmp_path: Path) -> None:
    """Seeded with its old journal (context, a refused budget check, a wait for the budget
    event): it waits again without calling the model, a raise wakes it, it answers."""
    record = json.loads((HERE / "golden_budget_parked.json").read_text())
    clock = TestClock()
    app = perdure.App(f"sqlite:///{tmp_path}/u.db", clock=clock)
    try:
        (tmp_path / "a.toml").write_text(SPEC)
        model = ScriptedModel(["second"])
        Agent(
            app.runtime, load_spec(tmp_path / "a.toml"), providers={"fast": model}
        )  # registers it
        seed_journal(app, record)
        worker = TestWorker(app)
        worker.run_until_idle()
        assert app.get_run("two").status == "waiting" and model.calls == 0
        woken = app.runtime.sync(
            raise_budget(app.runtime, "helper", Budget("helper", tokens_per_day=10**6)), "r"
        )
        assert woken == 1
        worker.run_until_idle()
        assert app.handle("two").result(timeout=5)["answer"] == "second" and model.calls == 1
        assert len(app.runtime.sync(Budgets(app.runtime.store).usage("helper", 0.0), "usage")) == 1
    finally:
        app.close()
