"""GET /metrics of `perdure serve`: the Prometheus text behind a `read` token, unless public.

Runs by state, step names and model spending say a lot about what a deployment does,
so a scrape needs `Authorization: Bearer <token>` like the API (401 without a valid
one, 403 without the `read` scope, 429 after too many wrong ones from an address).
`create_app(app, metrics_public=True)` (`perdure serve --metrics-public`) serves it to
anyone, for a scraper on a trusted network.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import PerdureError
from ..observe.metrics import metrics_endpoint
from .access import authenticate_request
from .operations import Forbidden, require
from .throttle import TooManyFailures


async def scrape_metrics(request: Request) -> Response:
    """GET /metrics: `observe.metrics_endpoint` once the token allows `read` (or it is public)."""
    if not getattr(request.app.state, "metrics_public", False):
        try:
            who = await authenticate_request(request, request.headers.get("authorization"))
        except TooManyFailures as exc:  # wrong tokens count here as on the API
            return JSONResponse({"error": str(exc)}, 429, {"Retry-After": str(exc.retry_after)})
        except PerdureError:
            return JSONResponse({"error": "the store cannot be reached; try again later"}, 503)
        if who is None:
            return JSONResponse(
                {"error": "a valid `Authorization: Bearer <token>` header is required "
                 "(perdure token create --scope read; or serve with --metrics-public)"},
                status_code=401, headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        try:
            require(who, "read", "GET /metrics")
        except Forbidden as exc:
            return JSONResponse({"error": str(exc)}, status_code=403)
    return await metrics_endpoint(request)
