"""The refund agent written with the OpenAI Agents SDK, and made durable with perdure's
drop-in `Runner`.

`refund_agent` is an ordinary `agents.Agent`; the only perdure lines are the effect marks on
its tools and the `Runner(app, ...)` in `durable_workflow`.
"""

from __future__ import annotations

import os
from typing import Any

import agents
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from refund_model import PID_HEADER
from refund_tools import Shop, agent_name, probes_of

import perdure
from perdure.integrations.openai_agents import Runner, tool_effect

agents.set_tracing_disabled(True)  # no trace export: nothing leaves 127.0.0.1

INSTRUCTIONS = (
    "You handle refunds. Look the order up, refund its full amount with issue_refund, "
    "e-mail the customer with send_email, then answer in one sentence."
)


def refund_agent(shop: Shop, model: Any, *, name: str = "refunds") -> Agent[Any]:
    """The plain Agents SDK agent: three tools on `shop`, answering with `model`."""

    @tool_effect("read")
    @function_tool
    async def lookup_order(order: str) -> str:
        """Look an order up: its amount and the customer's e-mail address."""
        return await shop.lookup_order(order)

    @function_tool  # its effect is the variant's: keyed or once (see durable_workflow)
    async def issue_refund(order: str, amount: float) -> str:
        """Refund `amount` EUR of `order` to the customer."""
        return await shop.issue_refund(order, amount)

    @tool_effect("once")
    @function_tool
    async def send_email(to: str, order: str, body: str) -> str:
        """Send the customer an e-mail about their order."""
        return await shop.send_email(to, order, body)

    return Agent(
        name=name,
        instructions=INSTRUCTIONS,
        tools=[lookup_order, issue_refund, send_email],
        model=model,
    )


def durable_workflow(
    app: perdure.App, shop: Shop, model: Any, *, refund: str, probes: bool = True
) -> Any:
    """The same agent as the perdure workflow `agents.refunds` (refund `keyed`) or
    `agents.refunds_once` (refund `once`); start it with `app.start(workflow, prompt)`.
    With `probes`, recovery asks the payment ledger and the mail provider about an
    interrupted `once` call (`Shop.find_refund`, `Shop.find_email`) before it parks a run."""
    name, asked = agent_name(refund), probes_of(shop, refund) if probes else None
    effect: Any = refund
    runner = Runner(app, tool_effects={"issue_refund": effect},
                    tool_probes=asked)  # fmt: skip
    return runner.workflow(refund_agent(shop, model, name=name))


class _CappedModel(OpenAIChatCompletionsModel):
    """Chat completions with at most `max_tokens` per answer (unless the agent sets one)."""

    def __init__(self, max_tokens: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_tokens = max_tokens

    async def get_response(
        self, system_instructions: Any, input: Any, model_settings: ModelSettings, *args: Any,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        capped = ModelSettings(max_tokens=self.max_tokens).resolve(model_settings)
        return await super().get_response(system_instructions, input, capped, *args, **kwargs)


def openai_model(
    base_url: str, model: str, max_tokens: int | None = None
) -> OpenAIChatCompletionsModel:
    """A chat-completions model on an OpenAI-compatible server that needs no key."""
    client = AsyncOpenAI(
        base_url=base_url, api_key="not-needed", default_headers={PID_HEADER: str(os.getpid())}
    )
    if max_tokens:
        return _CappedModel(max_tokens, model=model, openai_client=client)
    return OpenAIChatCompletionsModel(model=model, openai_client=client)
