"""The refund agents of both frameworks, both refund variants, on one perdure App.

`build()` is what the demo and the bench use; the module-level `app` is what a worker process
runs (`perdure --app refund_app:app worker`), configured from the environment:

- `PERDURE_DB`: the store (SQLite file or PostgreSQL URL);
- `REFUND_PAYMENTS_URL`, `REFUND_MAIL_URL`: the stubs (refund_outside.py);
- `REFUND_MODEL`: `function` (pydantic-ai's FunctionModel; pydantic-ai only), `local` (the
  small llama.cpp model perdure ships), or the base URL of the scripted OpenAI-compatible
  server (refund_model.py), e.g. `http://127.0.0.1:8100/v1`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import refund_agents_sdk
import refund_pydantic_ai
from refund_model import ScriptedModelServer, function_model
from refund_tools import Shop

import perdure

FRAMEWORKS = ("pydantic-ai", "agents-sdk")
VARIANTS = ("keyed", "once")  # the effect issue_refund is declared with


def prompt(order: str) -> str:
    """The customer's request: the whole input of one conversation."""
    return f"Please refund order {order} in full and let the customer know."


def models(choice: str) -> tuple[Any, Any]:
    """(pydantic-ai model, Agents SDK model) for `choice` (see the module docstring)."""
    if choice == "function":
        return function_model(), None
    if choice == "local":
        from perdure.agent.local_model import ensure_local_model

        lm = ensure_local_model()
        base_url, name = lm.base_url, lm.model
    elif choice.startswith("http"):
        base_url, name = choice, ScriptedModelServer.model
    else:
        raise SystemExit(f"REFUND_MODEL={choice!r}: use function, local or a scripted server URL")
    return (
        refund_pydantic_ai.openai_model(base_url, name),
        refund_agents_sdk.openai_model(base_url, name),
    )


@dataclass
class RefundApp:
    """The App and its four durable refund agents, by (framework, variant)."""

    app: perdure.App
    shop: Shop
    workflows: dict[tuple[str, str], Any] = field(default_factory=dict)

    def start(self, framework: str, variant: str, order: str) -> perdure.RunHandle:
        """Start the conversation about `order` (run id `refund-ORDER`; idempotent)."""
        durable = self.workflows.get((framework, variant))
        if durable is None:
            raise SystemExit(
                f"no {framework} agent for this model: the FunctionModel is pydantic-ai's own"
            )
        run_id = f"refund-{order}"
        if framework == "pydantic-ai":
            handle: perdure.RunHandle = durable.start(prompt(order), run_id=run_id)
            return handle
        return self.app.start(durable, prompt(order), run_id=run_id)


def build(app: perdure.App, shop: Shop, model: str) -> RefundApp:
    """Register every refund agent on `app`, answering with the model `model`."""
    pai_model, sdk_model = models(model)
    built = RefundApp(app, shop)
    for variant in VARIANTS:
        built.workflows[("pydantic-ai", variant)] = refund_pydantic_ai.durable_agent(
            app, shop, pai_model, refund=variant
        )
        if sdk_model is not None:
            built.workflows[("agents-sdk", variant)] = refund_agents_sdk.durable_workflow(
                app, shop, sdk_model, refund=variant
            )
    return built


def _from_env() -> RefundApp:
    shop = Shop(os.environ.get("REFUND_PAYMENTS_URL", ""), os.environ.get("REFUND_MAIL_URL", ""))
    return build(perdure.App(), shop, os.environ.get("REFUND_MODEL", "function"))


refunds = _from_env()
app = refunds.app
