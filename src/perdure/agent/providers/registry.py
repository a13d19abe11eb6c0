"""Model providers by name, one line each: the spec, the CLI and the loop read a provider's
facts (`provider_class(name).default_timeout`, `.api_key_env`, ...) and build it from here.

    make_provider("scripted", responses=["hello"])
    make_provider("openai", model="qwen3", base_url="http://127.0.0.1:8080/v1")
    make_provider("anthropic", model="claude-sonnet-4-5", stream=True)

A provider's module is imported when it is first asked for, and imports its SDK only when
built, so `scripted` works without the `models` extra; a missing SDK is a one-line
ConfigError with the install hint.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ...errors import ConfigError
from .base import Provider

# name -> "module:Class" (imported on first use) or the class itself (a plug-in's)
PROVIDERS: dict[str, str | type[Provider]] = {
    "scripted": "perdure.agent.providers.scripted:ScriptedModel",
    "local": "perdure.agent.providers.local:LlamaCppModel",
    "openai": "perdure.agent.providers.openai:OpenAIModel",
    "anthropic": "perdure.agent.providers.anthropic:AnthropicModel",
}


def register(name: str, where: str | type[Provider]) -> None:
    """Add a provider (or replace one): a spec may then say `provider = "NAME"`.

    Args:
        name: the provider's name, as its class's `name` says.
        where: "module:Class", imported when first asked for, or the class.
    """
    PROVIDERS[name] = where


def unregister(name: str) -> None:
    """Forget a provider `register` added (a spec naming it is refused again)."""
    PROVIDERS.pop(name, None)


def provider_class(name: str) -> type[Provider]:
    """The class of the provider `name`, carrying its facts (imported now if it was not).

    Raises:
        ConfigError: no provider has that name.
    """
    where = PROVIDERS.get(name)
    if where is None:
        raise ConfigError(f"unknown model provider {name!r}: use one of {', '.join(PROVIDERS)}")
    if isinstance(where, str):
        module, _, attr = where.partition(":")
        found: type[Provider] = getattr(importlib.import_module(module), attr)
        return found
    return where


def make_provider(name: str, **options: Any) -> Provider:
    """A provider of the given name, built with `options` (its constructor's arguments).

    Args:
        name: a name of `PROVIDERS`: "scripted" (deterministic, for tests and demos),
            "local" (llama.cpp, started here), "openai" (OpenAI or any compatible server)
            or "anthropic".
        **options: e.g. `model`, `base_url`, `api_key`, `stream`, `timeout`
            (`max_tokens` for anthropic; `responses`, `responder` for scripted).

    Raises:
        ConfigError: an unknown name, an option the provider does not take, a missing
            SDK or a missing key.
    """
    factory = provider_class(name)
    accepted = [
        option
        for option, param in inspect.signature(factory).parameters.items()
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"model provider {name!r}: unknown option(s) {', '.join(unknown)} "
            f"(it takes {', '.join(accepted)})"
        )
    return factory(**options)
