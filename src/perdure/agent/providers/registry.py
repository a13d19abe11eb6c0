"""Model providers by name: `make_provider("openai", model=...)` for specs and the CLI.

    make_provider("scripted", responses=["hello"])
    make_provider("openai", model="qwen3", base_url="http://127.0.0.1:8080/v1")
    make_provider("anthropic", model="claude-sonnet-4-5", stream=True)

The SDK providers are imported only when asked for, so `scripted` works without
the `models` extra; a missing SDK is a one-line ConfigError with the install hint.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from .base import ModelProvider

KINDS = ("scripted", "openai", "anthropic")


def make_provider(kind: str, **options: Any) -> ModelProvider:
    """A provider of the given kind, built with `options` (its constructor's arguments).

    Args:
        kind: "scripted" (deterministic, for tests and demos), "openai" (OpenAI or any
            compatible server) or "anthropic".
        **options: e.g. `model`, `base_url`, `api_key`, `stream`, `timeout`
            (`max_tokens` for anthropic; `responses`, `responder` for scripted).

    Raises:
        ConfigError: an unknown kind, an option the provider does not take, a missing
            SDK or a missing key.
    """
    factory = _factory(kind)
    accepted = [
        name
        for name, param in inspect.signature(factory).parameters.items()
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"model provider {kind!r}: unknown option(s) {', '.join(unknown)} "
            f"(it takes {', '.join(accepted)})"
        )
    provider: ModelProvider = factory(**options)
    return provider


def _factory(kind: str) -> Callable[..., ModelProvider]:
    if kind == "scripted":
        from .scripted import ScriptedModel

        return ScriptedModel
    if kind == "openai":
        from .openai import OpenAIModel

        return OpenAIModel
    if kind == "anthropic":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise ConfigError(f"unknown model provider {kind!r}: use one of {', '.join(KINDS)}")
