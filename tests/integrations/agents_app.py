"""The Agents SDK kill tests' app: a refund agent on the scripted OpenAI-compatible server at
AGENTS_BASE_URL whose e-mail tool (`once`) logs to the ledger file in AGENTS_LEDGER and holds,
so a kill lands inside it; a helpdesk agent (run with a PerdureSession) whose stock check
(`read`) holds the same way. Store from PERDURE_DB; `perdure --app agents_app:app worker`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import agents
from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI

import perdure
from perdure.integrations.openai_agents import Runner

HOLD = 1.5  # seconds the e-mail tool holds after it started
agents.set_tracing_disabled(True)


def log(line: str) -> None:
    with Path(os.environ["AGENTS_LEDGER"]).open("a") as out:
        out.write(line + "\n")


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    log("lookup")
    return f"{order}: paid 30 EUR"


@function_tool
def send_email(order: str) -> str:
    """Tell the customer (undeclared: once)."""
    log("email-started")
    time.sleep(HOLD)
    log("email-done")
    return "sent"


@function_tool
def check_stock(item: str) -> str:
    """Check the stock of an item (read: re-run after a crash)."""
    log("stock-started")
    time.sleep(HOLD)
    log("stock-done")
    return f"{item}: 3 left"


def _model() -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=os.environ["AGENTS_BASE_URL"], api_key="dummy", max_retries=0)
    return OpenAIChatCompletionsModel(model="scripted", openai_client=client)


def register(app: perdure.App) -> perdure.Workflow[..., object]:
    agent = Agent(name="refunds", instructions="Refund orders.", model=_model(),
                  tools=[lookup_order, send_email])  # fmt: skip
    return Runner(app, tool_effects={"lookup_order": "read"}).workflow(agent)


def register_helpdesk(app: perdure.App) -> perdure.Workflow[..., object]:
    """`app.start(workflow, text, session="conv-1")`: one turn of conversation conv-1."""
    agent = Agent(name="helpdesk", instructions="Help.", model=_model(), tools=[check_stock])
    return Runner(app, tool_effects={"check_stock": "read"}).workflow(agent)


app = perdure.App()
refunds = register(app)
helpdesk = register_helpdesk(app)
