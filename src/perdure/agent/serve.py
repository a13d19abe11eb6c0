"""Running an agent from its spec: pick the model, register it, attach its trigger.

`perdure run SPEC` starts one run; `perdure agent SPEC` attaches the spec's
trigger (inbox, schedule, event or webhook) and works its runs until stopped.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .loop import Agent
from .spec import AgentSpec, ModelSpec

if TYPE_CHECKING:
    from ..app import App

MODEL_CHOICES = ("spec", "local", "local-large", "scripted", "openai", "anthropic")
# --model choice -> the known local model serving it (local_model.KNOWN_MODELS)
LOCAL_MODELS = {"local": "SmolLM2-135M-Instruct", "local-large": "Qwen2.5-Coder-1.5B-Instruct"}


def with_model(spec: AgentSpec, choice: str) -> AgentSpec:
    """The spec with its default tier served by `choice` instead (`spec`: unchanged).

    `scripted` is the deterministic extractive summariser; `local` and `local-large` are
    SmolLM2-135M and Qwen2.5-Coder-1.5B on llama.cpp (docs/local-models.md); `openai`
    and `anthropic` take the model from OPENAI_MODEL / ANTHROPIC_MODEL (and keys and
    base URLs from their SDKs' usual variables).
    """
    if choice == "spec":
        return spec
    if choice not in MODEL_CHOICES:
        raise ConfigError(f"--model {choice!r}: use one of {', '.join(MODEL_CHOICES)}")
    tier = spec.routing.default
    current = spec.models[tier]
    if choice == "scripted":
        model = ModelSpec(provider="scripted", script="builtin:extractive",
                          context_tokens=current.context_tokens)  # fmt: skip
    elif choice in LOCAL_MODELS:  # a local tier keeps its sampling settings (temperature, stop)
        base = current if current.provider == "local" else ModelSpec(provider="local")
        model = base.model_copy(update={
            "model": LOCAL_MODELS[choice], "context_tokens": min(current.context_tokens, 2048),
            "max_tokens": current.max_tokens or 120,
        })  # fmt: skip
    elif choice == "openai":
        model = ModelSpec(provider="openai", model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                          base_url=os.environ.get("OPENAI_BASE_URL"),
                          context_tokens=current.context_tokens, max_tokens=current.max_tokens,
                          price=current.price)  # fmt: skip
    else:
        model = ModelSpec(provider="anthropic",
                          model=os.environ.get("ANTHROPIC_MODEL", "claude-3-5-haiku-latest"),
                          base_url=os.environ.get("ANTHROPIC_BASE_URL"),
                          context_tokens=current.context_tokens, max_tokens=current.max_tokens,
                          price=current.price)  # fmt: skip
    changed = spec.model_copy(update={"models": {**spec.models, tier: model}})
    changed.folder = spec.folder
    return changed


def attach_trigger(app: App, agent: Agent) -> str:
    """Register the spec's trigger on the app (every worker then serves it); says which."""
    trigger = agent.spec.trigger
    if trigger is None:
        return "no trigger (start runs with perdure run)"
    if trigger.inbox:
        folder = agent.spec.path(trigger.inbox)
        app.inbox(str(folder), agent.workflow, name=agent.spec.name, pattern=trigger.pattern,
                  stable=trigger.stable)  # fmt: skip
        return f"inbox {folder} ({trigger.pattern})"
    if trigger.cron or trigger.every:
        app.schedule(cron=trigger.cron, every=trigger.every, tz=trigger.tz,
                     name=agent.spec.name, args=[{"prompt": agent.spec.goal}],
                     workflow=agent.workflow)  # fmt: skip
        return f"schedule {trigger.cron or f'every {trigger.every:g}s'}"
    if trigger.event:
        app.on_event(trigger.event, name=agent.spec.name)(agent.workflow)
        return f"event {trigger.event}"
    if trigger.webhook:
        app.webhook(trigger.webhook, agent.workflow, secret_env=trigger.secret_env)
        return f"webhook /hooks/{trigger.webhook}"
    return "no trigger"
