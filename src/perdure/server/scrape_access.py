"""Who may read a process's metrics: a `read` token, checked the same way for the /metrics of
`perdure serve` and a worker's `--metrics-port` (both unless started with --metrics-public).

Runs by state, step names and model spending say a lot about what a deployment does. The
answer is framework-free (status, message, headers) so the worker's plain WSGI server and
serve's Starlette route give the same one-line errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import PerdureError
from .access import authenticate_counted
from .operations import Forbidden, require
from .throttle import Throttle, TooManyFailures

if TYPE_CHECKING:
    from ..app import App

Refusal = tuple[int, str, dict[str, str]]  # HTTP status, the one-line error, extra headers


async def scrape_refusal(
    app: App, throttle: Throttle, address: str, authorization: str | None, public_flag: str
) -> Refusal | None:
    """Why a scrape from `address` is refused, or None when its token allows `read`;
    `public_flag` names how to serve the metrics without a token instead."""
    try:
        who = await authenticate_counted(app, throttle, address, authorization)
    except TooManyFailures as exc:  # wrong tokens count here as on the API
        return 429, str(exc), {"Retry-After": str(exc.retry_after)}
    except PerdureError:
        return 503, "the store cannot be reached; try again later", {}
    if who is None:
        return (
            401,
            "a valid `Authorization: Bearer <token>` header is required "
            f"(perdure token create --scope read; or {public_flag})",
            {"WWW-Authenticate": "Bearer"},
        )
    try:
        require(who, "read", "GET /metrics")
    except Forbidden as exc:
        return 403, str(exc), {}
    return None


def worker_guard(app: App) -> Callable[[str | None, str], Refusal | None]:
    """The check of a worker's `--metrics-port` (observe.serve_metrics' `guard`): the same
    refusals, answered on the metrics server's request threads one at a time."""
    throttle = Throttle()
    lock = threading.Lock()  # the throttle's counts are not shared between threads

    def guard(authorization: str | None, address: str) -> Refusal | None:
        with lock:
            return app.runtime.sync(
                scrape_refusal(
                    app, throttle, address, authorization, "start the worker with --metrics-public"
                ),
                "metrics check",
            )

    return guard
