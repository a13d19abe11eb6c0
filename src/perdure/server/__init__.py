"""The HTTP interface `perdure serve` runs: a Starlette app over the public API (webhooks now).

Needs the `server` extra: `pip install 'perdure[server]'`.
"""

from __future__ import annotations

from .app import create_app, routes

__all__ = ["create_app", "routes"]
