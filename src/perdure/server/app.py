"""`create_app`: the Starlette application `perdure serve` runs, and the list of its routes."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..app import App
from ..observe.metrics import metrics_endpoint
from .api import api_routes
from .dashboard import dashboard_routes
from .webhooks import receive_hook


async def healthz(request: Request) -> JSONResponse:
    """Liveness: the process answers (it does not touch the store)."""
    return JSONResponse({"ok": True})


def routes() -> list[BaseRoute]:
    """Every route the server answers; a new endpoint is one more entry here."""
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/hooks/{name}", receive_hook, methods=["POST"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *api_routes(),
        *dashboard_routes(),
    ]


async def http_error(request: Request, exc: Exception) -> Response:
    """Errors as JSON too (404 for an unknown path, 405 for a wrong method)."""
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        raise exc
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(app: App) -> Starlette:
    """The ASGI application for `app`: endpoints find it as `request.app.state.perdure`.

    It starts runs and answers questions; it executes no workflow (that is `perdure worker`).
    """
    server = Starlette(routes=routes(), exception_handlers={HTTPException: http_error})
    server.state.perdure = app
    return server
