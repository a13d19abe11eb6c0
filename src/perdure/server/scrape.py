"""GET /metrics of `perdure serve`: the Prometheus text behind a `read` token, unless public.

A scrape needs `Authorization: Bearer <token>` like the API (401 without a valid one, 403
without the `read` scope, 429 after too many wrong ones from an address; see
scrape_access). `create_app(app, metrics_public=True)` (`perdure serve --metrics-public`)
serves it to anyone, for a scraper on a trusted network.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..observe.metrics import metrics_endpoint
from .access import address_of
from .scrape_access import scrape_refusal


async def scrape_metrics(request: Request) -> Response:
    """GET /metrics: `observe.metrics_endpoint` once the token allows `read` (or it is public)."""
    if not getattr(request.app.state, "metrics_public", False):
        state = request.app.state
        refused = await scrape_refusal(
            state.perdure, state.throttle, address_of(request),
            request.headers.get("authorization"), "serve with --metrics-public",
        )  # fmt: skip
        if refused is not None:
            status, message, headers = refused
            return JSONResponse({"error": message}, status_code=status, headers=headers)
    return await metrics_endpoint(request.app.state.perdure.runtime)
