"""The refund agent written with pydantic-ai, and made durable with `PerdureAgent` or with
the `PerdureDurability` capability (pydantic-ai's own durable_exec surface).

`refund_agent` is an ordinary pydantic-ai Agent; the only perdure lines are the effect marks
on its tools and the `PerdureAgent(...)` wrap in `durable_agent`, or the capability given to
the agent in `capability_workflow`.
"""

from __future__ import annotations

import os
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from refund_model import PID_HEADER
from refund_tools import Shop, agent_name, probes_of

import perdure
from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool

INSTRUCTIONS = (
    "You handle refunds. Look the order up, refund its full amount with issue_refund, "
    "e-mail the customer with send_email, then answer in one sentence."
)


def refund_agent(
    shop: Shop, model: Any, *, name: str = "refunds", capabilities: list[Any] | None = None
) -> Agent[None, str]:
    """The plain pydantic-ai agent: three tools on `shop`, answering with `model`."""
    agent: Agent[None, str] = Agent(
        model, name=name, instructions=INSTRUCTIONS, capabilities=capabilities
    )

    @agent.tool_plain
    @perdure_tool(effect="read")
    async def lookup_order(order: str) -> str:
        """Look an order up: its amount and the customer's e-mail address."""
        return await shop.lookup_order(order)

    @agent.tool_plain  # its effect is the variant's: keyed or once (see durable_agent)
    async def issue_refund(order: str, amount: float) -> str:
        """Refund `amount` EUR of `order` to the customer."""
        return await shop.issue_refund(order, amount)

    @agent.tool_plain
    @perdure_tool(effect="once")
    async def send_email(to: str, order: str, body: str) -> str:
        """Send the customer an e-mail about their order."""
        return await shop.send_email(to, order, body)

    return agent


def durable_agent(
    app: perdure.App, shop: Shop, model: Any, *, refund: str, probes: bool = True
) -> PerdureAgent:
    """The same agent as the perdure workflow `pydantic_ai:refunds` (refund `keyed`) or
    `pydantic_ai:refunds_once` (refund `once`). With `probes`, recovery asks the payment
    ledger and the mail provider about an interrupted `once` call (`Shop.find_refund`,
    `Shop.find_email`) before it parks a run."""
    name, asked = agent_name(refund), probes_of(shop, refund) if probes else None
    effect: Any = refund
    return PerdureAgent(
        refund_agent(shop, model, name=name), app, tool_effects={"issue_refund": effect},
        tool_probes=asked,
    )  # fmt: skip


def capability_workflow(
    app: perdure.App, shop: Shop, model: Any, *, refund: str, probes: bool = True
) -> Any:
    """The same agent made durable by the `PerdureDurability` capability, run by the perdure
    workflow `pai.refunds` (refund `keyed`) or `pai.refunds_once` (refund `once`); start it
    with `app.start(workflow, prompt)`. Probes as in `durable_agent`."""
    from perdure.integrations.pydantic_durability import PerdureDurability

    name, asked = agent_name(refund), probes_of(shop, refund) if probes else None
    effect: Any = refund
    durability = PerdureDurability(app, tool_effects={"issue_refund": effect},
                                   tool_probes=asked)  # fmt: skip
    agent = refund_agent(shop, model, name=name, capabilities=[durability])

    @app.workflow(name=f"pai.{name}")
    async def refunds(prompt: str) -> str:
        return (await agent.run(prompt)).output

    return refunds


def openai_model(base_url: str, model: str, max_tokens: int | None = None) -> OpenAIChatModel:
    """A chat-completions model on an OpenAI-compatible server that needs no key."""
    client = AsyncOpenAI(
        base_url=base_url, api_key="not-needed", default_headers={PID_HEADER: str(os.getpid())}
    )
    settings = ModelSettings(max_tokens=max_tokens) if max_tokens else None
    return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client), settings=settings)
