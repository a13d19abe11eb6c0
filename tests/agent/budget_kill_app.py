"""The app a worker killed with -9 serves in test_usage_reconciles: one agent whose model is
the counting server (its spec's path in BUDGET_KILL_SPEC)."""

from __future__ import annotations

import os

import perdure
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec

app = perdure.App(os.environ["PERDURE_DB"])
agent = Agent(app.runtime, load_spec(os.environ["BUDGET_KILL_SPEC"]))
