"""From a spec's model tier to a provider: scripted, local (SmolLM2 on llama.cpp), openai,
anthropic. Keys come from the environment variable the spec names, never from the spec."""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import ConfigError
from ..extras import require_extra
from .grounding import claims
from .messages import Message, ModelRequest, ModelResponse
from .providers.base import MissingKey, ModelProvider
from .spec import AgentSpec, ModelSpec

# Seconds a tier's server may stay silent when the spec sets no `timeout`: a hosted model
# sends a whole (non-streamed) reply of the usual size well within a minute, Anthropic's
# larger replies within two; a local model on CPU reads the whole prompt before its first
# byte. Beyond that a call is taken as hung: it fails and is retried like a 5xx.
TIMEOUTS = {"openai": 60.0, "anthropic": 120.0, "local": 300.0}


def require_extras(spec: AgentSpec, *tiers: str) -> None:
    """Fail now, in one line, if a model tier (default: every tier) needs an extra that is
    not installed, rather than in the run, at its first model call.

    Raises:
        MissingExtra: the tier's provider needs the `models` or `local` extra.
    """
    for tier in tiers or tuple(spec.models):
        provider = spec.tier(tier).provider
        what = f"model tier {tier!r} ({provider})"
        if provider in ("openai", "anthropic"):
            require_extra("models", what, provider)
        elif provider == "local":
            # the model file may come from PERDURE_LOCAL_MODEL_PATH instead of its packages
            from .local_model import DEFAULT_MODEL, KNOWN_MODELS, PATH_ENV

            known = KNOWN_MODELS.get(spec.tier(tier).model or DEFAULT_MODEL)
            extra = known.extra if known is not None else "local"
            files = (
                []
                if os.environ.get(PATH_ENV) or known is None or known.parts
                else [*known.packages]
            )  # parts are found and joined by the local model itself, which names what is missing
            require_extra(extra, what, "xllamacpp", "openai", *files)


def provider_for(spec: AgentSpec, tier: str) -> ModelProvider:
    """The provider serving `tier` of `spec` (a local model is started on first use)."""
    model = spec.tier(tier)
    require_extras(spec, tier)
    from .providers.registry import make_provider

    if model.provider == "scripted":
        if model.script == "builtin:extractive":
            from .providers.scripted import ScriptedModel

            return ScriptedModel(responder=extractive_summary, latency=model.latency)
        if model.script is None:
            raise ConfigError(f'model tier {tier!r}: a scripted model needs script = "file"')
        return make_provider(
            "scripted", responses=str(spec.path(model.script)), follow_transcript=True,
            latency=model.latency,
        )  # fmt: skip
    if model.provider == "local":
        from .local_model import ensure_local_model

        local = ensure_local_model(model.model)
        return make_provider(
            "openai", model=model.model or local.model, base_url=local.base_url, api_key="local",
            **timeouts(model),
        )  # fmt: skip
    options: dict[str, Any] = {"model": model.model, "stream": model.stream, **timeouts(model)}
    if model.base_url:
        options["base_url"] = model.base_url
    if model.api_key_env is not None:
        if not os.environ.get(model.api_key_env):
            raise MissingKey(
                f"model tier {tier!r}: the environment variable {model.api_key_env} is not set",
                setting=model.api_key_env,
            )
        options["api_key_env"] = model.api_key_env
    return make_provider(model.provider, **options)


def timeouts(model: ModelSpec) -> dict[str, float]:
    """The SDK timeouts of a tier: the spec's, else the provider's defaults (TIMEOUTS)."""
    from .providers.openai import CONNECT_TIMEOUT

    return {
        "timeout": model.timeout or TIMEOUTS[model.provider],
        "connect_timeout": model.connect_timeout or CONNECT_TIMEOUT,
    }


def extractive_summary(request: ModelRequest) -> ModelResponse:
    """The deterministic scripted summariser (`script = "builtin:extractive"`): the first
    sentences of the task's text, so demos and tests run without any model."""
    users = [m.content for m in request.messages if m.role == "user"]
    text = next((u for u in users if u.count("---") >= 2), users[0] if users else "")
    body = text.split("---", 2)[1] if text.count("---") >= 2 else text
    words = " ".join(body.split())
    sentences = re.split(r"(?<=[.!?])\s+", words)
    # from the first sentence that says something checkable: a number, or a name that is
    # not merely the sentence's first word
    start = next((i for i, s in enumerate(sentences)
                  if any(c[0].isdigit() or not s.startswith(c) for c in claims(s))), 0)  # fmt: skip
    sentences = sentences[start:]
    summary = sentences[0][:400].rsplit(" ", 1)[0] if len(sentences[0]) > 400 else sentences[0]
    for more in sentences[1:2]:  # a second sentence if it fits: whole words and numbers only
        if len(summary) + len(more) < 400:
            summary = f"{summary} {more}"
    summary = summary or "(empty file)"
    return ModelResponse(message=Message("assistant", f"Summary: {summary}"))
