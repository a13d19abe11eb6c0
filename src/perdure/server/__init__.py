"""The HTTP interface `perdure serve` runs: a Starlette app over the public API.

Needs the `server` extra (`pip install 'perdure[server]'`) for `create_app` and the
modules that serve HTTP; `access` and `operations` are plain Python, so the
core CLI (`perdure token`) imports them from a bare install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app, routes

__all__ = ["create_app", "routes"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that importing perdure.server.access needs no starlette.
    if name in __all__:
        from ..extras import require_extra

        require_extra("server", "the perdure HTTP server")
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
