"""`create_app`: the Starlette application `perdure serve` runs, and the list of its routes."""

from __future__ import annotations

import secrets

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from ..app import App
from ..triggers.webhooks import Webhook
from .api import api_routes
from .dashboard import dashboard_routes
from .limits import BodyLimit, body_limit
from .scrape import scrape_metrics
from .sessions import SessionPolicy
from .sse import MAX_STREAMS, Slots
from .throttle import Throttle
from .webhooks import receive_hook


async def healthz(request: Request) -> JSONResponse:
    """Liveness: the process answers (it does not touch the store)."""
    return JSONResponse({"ok": True})


def routes() -> list[BaseRoute]:
    """Every route the server answers; a new endpoint is one more entry here."""
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/hooks/{name}", receive_hook, methods=["POST"]),
        Route("/metrics", scrape_metrics, methods=["GET"]),  # a read token unless metrics_public
        *api_routes(),
        *dashboard_routes(),
    ]


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")  # the order `Allow` lists


def allowed(request: Request) -> set[str]:
    """Every method some route answers at the request's path.

    Starlette answers a wrong method from the first route whose path matches, so
    a path served by several routes (one per method) would list only that one's.
    """
    found: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(request.scope)
            if match is not Match.NONE:
                found |= route.methods
    return found


async def http_error(request: Request, exc: Exception) -> Response:
    """Errors as JSON too: 404 for an unknown path, 405 for a wrong method (its `Allow`
    lists the methods of every route at the path)."""
    if not isinstance(exc, HTTPException):  # registered for HTTPException only
        raise exc
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        given = {m.strip() for m in headers.get("Allow", "").split(",") if m.strip()}
        every = given | allowed(request)  # given: what a mounted app (static files) says
        headers["Allow"] = ", ".join(sorted(every, key=lambda m: (*METHODS, m).index(m)))
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=headers)


def create_app(
    app: App,
    *,
    sessions: SessionPolicy | None = None,
    throttle: Throttle | None = None,
    metrics_public: bool = False,
    max_streams: int = MAX_STREAMS,
) -> Starlette:
    """The ASGI application for `app`: endpoints find it as `request.app.state.perdure`.

    It starts runs and answers questions; it executes no workflow (that is `perdure worker`).
    `sessions` says how long dashboard sign-ins last (default: 4 h idle, 24 h at most),
    `throttle` how many wrong credentials an address may send (default: 20 a minute),
    `metrics_public` whether GET /metrics needs no token (default: the `read` scope),
    `max_streams` how many event streams may be open at once (the rest get 503).
    """

    server = Starlette(
        routes=routes(),
        exception_handlers={HTTPException: http_error},
        middleware=[  # before anything reads a body
            Middleware(
                BodyLimit, limit_for=lambda path: body_limit(path, app.runtime.triggers.of(Webhook))
            )
        ],
    )
    server.state.perdure = app
    server.state.csrf_key = secrets.token_bytes(32)  # signs the sign-in form's CSRF token
    server.state.sessions = sessions or SessionPolicy()
    server.state.throttle = throttle or Throttle()  # wrong tokens and sessions, per address
    server.state.metrics_public = metrics_public
    server.state.sse_slots = Slots(max_streams)  # the API's and the dashboard's streams
    return server
