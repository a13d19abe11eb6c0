"""The PerdureDurability kill test's app: an agent built with the capability, whose model (a
FunctionModel) looks an order up (read), then refunds it (once); each model call and tool
logs to the ledger file in PAI_LEDGER, and the refund holds so a kill lands inside it.

Store from PERDURE_DB; workers run it with `perdure --app pydantic_durability_app:app worker`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import perdure
from perdure.integrations.pydantic_durability import PerdureDurability

HOLD = 1.5  # seconds the refund tool holds after it started


def log(line: str) -> None:
    with Path(os.environ["PAI_LEDGER"]).open("a") as out:
        out.write(line + "\n")


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    done = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if not done:
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": "42"}, "c1")])
    if len(done) == 1:
        return ModelResponse(parts=[ToolCallPart("issue_refund", {"order": "42"}, "c2")])
    return ModelResponse(parts=[TextPart(f"done: {done[-1].content}")])


def register(app: perdure.App) -> Any:
    durability = PerdureDurability(app, tool_effects={"lookup": "read"})
    agent = Agent(FunctionModel(answer), name="refunds", capabilities=[durability])

    @agent.tool_plain
    def lookup(order: str) -> str:
        log("lookup")
        return f"order {order}: paid"

    @agent.tool_plain
    def issue_refund(order: str) -> str:  # undeclared: once
        log("refund-started")
        time.sleep(HOLD)
        log("refund-done")
        return f"refunded {order}"

    @app.workflow(name="refunds")
    async def refunds(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    return refunds


app = perdure.App()
workflow = register(app)
