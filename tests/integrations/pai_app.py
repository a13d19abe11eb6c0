"""The pydantic-ai kill test's app: an agent whose model (a FunctionModel) and refund tool
log each call to the ledger file in PAI_LEDGER; the tool holds so a kill lands inside it.

Store from PERDURE_DB; workers run it with `perdure --app pai_app:app worker`."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import perdure
from perdure.integrations.pydantic_ai import PerdureAgent

HOLD = 1.5  # seconds the refund tool holds after it started


def log(line: str) -> None:
    with Path(os.environ["PAI_LEDGER"]).open("a") as out:
        out.write(line + "\n")


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    done = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if not done:
        return ModelResponse(parts=[ToolCallPart("issue_refund", {"order": "42"}, "c1")])
    return ModelResponse(parts=[TextPart(f"done: {done[0].content}")])


def register(app: perdure.App) -> PerdureAgent:
    agent = Agent(FunctionModel(answer), name="refunds")

    @agent.tool_plain
    def issue_refund(order: str) -> str:  # undeclared: once
        log("refund-started")
        time.sleep(HOLD)
        log("refund-done")
        return f"refunded {order}"

    return PerdureAgent(agent, app)


app = perdure.App()
durable = register(app)
