"""Running an agent from its spec: pick the model, register it, attach its trigger.

`perdure run SPEC` starts one run; `perdure agent SPEC` attaches the spec's
trigger (inbox, schedule, event or webhook) and works its runs until stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError
from .loop import Agent
from .providers.base import Provider
from .providers.registry import PROVIDERS, provider_class
from .spec import AgentSpec

if TYPE_CHECKING:
    from ..app import App


def model_choices() -> tuple[str, ...]:
    """`spec` and every registered provider's `--model` choices, in the registry's order."""
    return ("spec", *(choice for name in PROVIDERS for choice in provider_class(name).choices))


MODEL_CHOICES = model_choices()  # for the CLI's options


def with_model(spec: AgentSpec, choice: str) -> AgentSpec:
    """The spec with its default tier served by `choice` instead (`spec`: unchanged).

    `scripted` is the deterministic extractive summariser; `local` (or its old name
    `local-large`) and `local-small` are Qwen2.5-Coder-1.5B and SmolLM2-135M on llama.cpp
    (docs/local-models.md); `openai`
    and `anthropic` take the model from OPENAI_MODEL / ANTHROPIC_MODEL (and keys and
    base URLs from their SDKs' usual variables). Each provider's `for_choice` says how.
    """
    if choice == "spec":
        return spec
    chooser = _chooser(choice)
    if chooser is None:
        raise ConfigError(f"--model {choice!r}: use one of {', '.join(model_choices())}")
    tier = spec.routing.default
    model = chooser.for_choice(choice, spec.models[tier])
    changed = spec.model_copy(update={"models": {**spec.models, tier: model}})
    changed.folder = spec.folder
    return changed


def _chooser(choice: str) -> type[Provider] | None:
    """The provider offering `--model CHOICE`, if one does."""
    found = (provider_class(name) for name in PROVIDERS)
    return next((provider for provider in found if choice in provider.choices), None)


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
