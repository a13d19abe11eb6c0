"""The refund agents of both frameworks, both refund variants, on one perdure App.

`build(app, shop, model)` registers them; `model` is `function` (pydantic-ai's FunctionModel,
pydantic-ai only), `local` (the small llama.cpp model perdure ships) or the base URL of the
scripted OpenAI-compatible server (refund_model.py), e.g. `http://127.0.0.1:8100/v1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from refund_model import ScriptedModelServer, function_model
from refund_tools import Shop

import perdure

# pydantic-ai-capability: the pydantic-ai agent made durable by PerdureDurability
FRAMEWORKS = ("pydantic-ai", "pydantic-ai-capability", "agents-sdk")
VARIANTS = ("keyed", "once")  # the effect issue_refund is declared with
LOCAL_MAX_TOKENS = 160


def prompt(order: str) -> str:
    """The customer's request: the whole input of one conversation."""
    return f"Please refund order {order} in full and let the customer know."


def model_for(framework: str, choice: str) -> Any:
    """`framework`'s model for `choice` (see the module docstring); None: it has none."""
    if choice == "function":
        return function_model() if framework.startswith("pydantic-ai") else None
    if choice == "local":
        from perdure.agent.local_model import ensure_local_model

        lm = ensure_local_model()  # a small model on 2 cores: short answers, or minutes each
        return framework_module(framework).openai_model(lm.base_url, lm.model, LOCAL_MAX_TOKENS)
    if choice.startswith("http"):
        return framework_module(framework).openai_model(choice, ScriptedModelServer.model)
    raise SystemExit(f"model {choice!r}: use function, local or a scripted server URL")


def framework_module(framework: str) -> Any:
    """The agent module of `framework`, imported when first needed (each import is slow)."""
    if framework.startswith("pydantic-ai"):
        import refund_pydantic_ai

        return refund_pydantic_ai
    if framework == "agents-sdk":
        import refund_agents_sdk

        return refund_agents_sdk
    raise SystemExit(f"unknown framework {framework!r}: use {' or '.join(FRAMEWORKS)}")


@dataclass
class RefundApp:
    """The App and its durable refund agents, by (framework, variant)."""

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


def build(app: perdure.App, shop: Shop, model: str, frameworks: tuple[str, ...] = FRAMEWORKS,
          probes: bool = True) -> RefundApp:  # fmt: skip
    """Register the refund agents of `frameworks` on `app`, answering with `model`; with
    `probes`, their `once` tools are probed by recovery (refund_tools.py)."""
    built = RefundApp(app, shop)
    for framework in frameworks:
        found = model_for(framework, model)
        if found is None:
            continue
        module = framework_module(framework)
        if framework == "pydantic-ai":
            make = module.durable_agent
        elif framework == "pydantic-ai-capability":
            make = module.capability_workflow
        else:
            make = module.durable_workflow
        for variant in VARIANTS:
            built.workflows[(framework, variant)] = make(app, shop, found, refund=variant,
                                                         probes=probes)  # fmt: skip
    return built
