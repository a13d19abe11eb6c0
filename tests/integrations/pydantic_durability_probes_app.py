"""The PerdureDurability probe kill test's app: an agent built with the capability whose
model (a FunctionModel) refunds order 42 with a `once` tool that pays (a line in the ledger
file in PAI_LEDGER), then holds so a kill lands after the payment, before its outcome is
journaled; its probe `find_refund` reads the ledger for the order's payment.

Store from PERDURE_DB; workers run it with
`perdure --app pydantic_durability_probes_app:app worker`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import perdure
from perdure import ProbeAnswer
from perdure.integrations.pydantic_ai import perdure_tool
from perdure.integrations.pydantic_durability import PerdureDurability

HOLD = 30.0  # seconds the refund holds after paying: the kill lands inside it


def ledger() -> Path:
    return Path(os.environ["PAI_LEDGER"])


def log(line: str) -> None:
    with ledger().open("a") as out:
        out.write(line + "\n")


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    log("model")
    done = [p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"]
    if not done:
        return ModelResponse(parts=[ToolCallPart("issue_refund", {"order": "42"}, "c1")])
    return ModelResponse(parts=[TextPart(f"done: {done[-1].content}")])


def find_refund(order: str) -> ProbeAnswer:
    """The payment ledger, read: was order `order` refunded?"""
    log("probe")
    if f"paid-{order}" in ledger().read_text().split():
        return ProbeAnswer.done(f"refunded {order} (found by the probe)")
    return ProbeAnswer.not_done()


def register(app: perdure.App) -> Any:
    durability = PerdureDurability(app)
    agent = Agent(FunctionModel(answer), name="refunds", capabilities=[durability])

    @agent.tool_plain
    @perdure_tool(effect="once", probe=find_refund)
    def issue_refund(order: str) -> str:
        log(f"paid-{order}")
        time.sleep(HOLD)
        return f"refunded {order}"

    @app.workflow(name="refunds")
    async def refunds(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    return refunds


app = perdure.App()
workflow = register(app)
