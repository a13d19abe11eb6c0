"""From a spec's model tier to a provider, by the provider's own class (providers.registry).
Keys come from the environment variable the spec names, never from the spec."""

from __future__ import annotations

from .providers.base import ModelProvider
from .providers.registry import provider_class
from .spec import AgentSpec


def require_extras(spec: AgentSpec, *tiers: str) -> None:
    """Fail now, in one line, if a model tier (default: every tier) needs an extra that is
    not installed, rather than in the run, at its first model call.

    Raises:
        MissingExtra: the tier's provider needs the `models` or `local` extra.
    """
    for tier in tiers or tuple(spec.models):
        model = spec.tier(tier)
        provider_class(model.provider).require(
            f"model tier {tier!r} ({model.provider})", model.model
        )


def provider_for(spec: AgentSpec, tier: str) -> ModelProvider:
    """The provider serving `tier` of `spec` (a local model is started on first use).

    Raises:
        ConfigError: a missing extra, script or key (MissingExtra, MissingKey).
    """
    require_extras(spec, tier)
    return provider_class(spec.tier(tier).provider).from_tier(spec, tier)
