"""The local provider: a small model served on 127.0.0.1 by llama.cpp, reached as an
OpenAI-compatible server.

    model = LlamaCppModel()                          # Qwen2.5-Coder-1.5B-Instruct
    model = LlamaCppModel("SmolLM2-135M-Instruct")   # scripts/setup.sh local-small

Building one starts the model's server once per process (`local_model.ensure_local_model`);
no key, no network. The models and where their weights come from are in `local_model`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...extras import require_extra
from .base import CONNECT_TIMEOUT
from .openai import OpenAIModel

if TYPE_CHECKING:
    from typing import Self

    from ..spec import AgentSpec, ModelSpec

# --model choice -> the known local model serving it (local_model.KNOWN_MODELS)
CHOICES = {
    "local": "Qwen2.5-Coder-1.5B-Instruct",
    "local-large": "Qwen2.5-Coder-1.5B-Instruct",  # its name before it became the default
    "local-small": "SmolLM2-135M-Instruct",
}


class LlamaCppModel(OpenAIModel):
    """A known local model (`local_model.KNOWN_MODELS`) on llama.cpp, through the openai
    provider."""

    name = "local"
    api_key_env = None  # it needs no key
    # on CPU a local model reads the whole prompt before its first byte
    default_timeout = 300.0
    extra = "local"
    needs_model = False
    choices = tuple(CHOICES)

    def __init__(
        self,
        model: str = "",
        *,
        timeout: float | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        stream: bool = True,
    ) -> None:
        """Args:
            model: a known local model (default: Qwen2.5-Coder-1.5B-Instruct).
            stream: stream the reply, its text going to the run's stream as it comes
                (a CPU model writes a few words a second: worth watching).
            timeout: seconds the server may stay silent (default: 300).
            connect_timeout: seconds to open the connection.

        Raises:
            MissingExtra: the local extra (or the model's packages) is not installed.
            LocalModelError: no such model, or its server did not start.
        """
        from ..local_model import ensure_local_model

        self.require(f"the {self.name} model provider", model)
        local = ensure_local_model(model)
        super().__init__(
            model or local.model, base_url=local.base_url, api_key="local", timeout=timeout,
            connect_timeout=connect_timeout, stream=stream,
        )  # fmt: skip

    @classmethod
    def require(cls, what: str, model: str = "") -> None:
        """llama.cpp and the openai SDK, and the packages holding the model's weights (their
        extra: `local`)."""
        # the model file may come from PERDURE_LOCAL_MODEL_PATH instead of its packages
        import importlib.util

        from ..local_model import DEFAULT_MODEL, KNOWN_MODELS, PATH_ENV, LocalModelError

        known = KNOWN_MODELS.get(model or DEFAULT_MODEL)
        extra = known.extra if known is not None else cls.extra
        require_extra(extra, what, "xllamacpp", cls.sdk)
        if os.environ.get(PATH_ENV) or known is None or known.parts:
            return  # parts are found and joined by the local model, which names what is missing
        missing = [p for p in known.packages if importlib.util.find_spec(p) is None]
        if missing:  # a model whose wheel is not in the extra (SmolLM2): its own command
            raise LocalModelError(
                f"{what}: the model {known.name} is not installed "
                f"({', '.join(missing)} is missing): {known.install}"
            )

    @classmethod
    def from_tier(cls, spec: AgentSpec, tier: str) -> Self:
        """The tier's local model (started on first use), with the tier's timeouts; streamed
        unless the tier says `stream = false`."""
        model = spec.tier(tier)
        stream = model.stream if "stream" in model.model_fields_set else True
        return cls(model.model, timeout=model.timeout, stream=stream,
                   connect_timeout=model.connect_timeout or CONNECT_TIMEOUT)  # fmt: skip

    @classmethod
    def for_choice(cls, choice: str, current: ModelSpec) -> ModelSpec:
        """`--model local` / `local-small`: that model, in a context llama.cpp serves on a
        laptop; a local tier keeps its sampling settings (temperature, stop)."""
        from ..spec import ModelSpec

        base = current if current.provider == cls.name else ModelSpec(provider=cls.name)
        return base.model_copy(update={
            "model": CHOICES[choice], "context_tokens": min(current.context_tokens, 2048),
            "max_tokens": current.max_tokens or 120,
        })  # fmt: skip
