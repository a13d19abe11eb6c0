"""`POST /hooks/{name}`: check a webhook delivery (size, signature, timestamp, id, JSON) and
start its run.

    202 {"run_id": ..., "duplicate": false}   started (true: this delivery id was seen before)
    400 missing/invalid delivery id or timestamp, body not JSON or not fitting the workflow
    401 missing or wrong signature, or (standard scheme) a timestamp outside the tolerance
    404 no such hook
    413 body over the hook's max_body
    500 the hook is misconfigured (e.g. secret unset)
    503 the store cannot be reached

Nothing is started unless the answer is 202.
"""

from __future__ import annotations

import json
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..app import App
from ..errors import ConfigError, PayloadError, StoreUnavailable
from ..nesting import nested_message, too_deep
from ..triggers.webhooks import DeliveryRefused, Webhook, deliver

log = logging.getLogger("perdure.server")


class Refused(Exception):
    """A request answered with an error status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it is known or seen to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise Refused(400, f"Content-Length {declared!r} is not a number")
        if int(declared) > limit:
            raise Refused(413, f"body of {declared} bytes is over this hook's {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a lying or absent Content-Length: stop reading here
            raise Refused(413, f"body is over this hook's {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_hook(request: Request) -> JSONResponse:
    """Start (or find) the run for one webhook delivery; see the module docstring."""
    app: App = request.app.state.perdure
    name = request.path_params["name"]
    hook = app.runtime.triggers.find(Webhook, name)
    try:
        if hook is None:
            raise Refused(404, f"no webhook named {name!r}")
        return await _receive(app, hook, request)
    except Refused as refused:
        return JSONResponse({"error": refused.message}, status_code=refused.status)


async def _receive(app: App, hook: Webhook, request: Request) -> JSONResponse:
    body = await read_body(request, hook.max_body)
    try:
        delivery_id = hook.verify(request.headers, body, now=app.clock.now())
    except ConfigError as exc:
        log.error("%s", exc)
        raise Refused(500, f"webhook {hook.name!r} is misconfigured (see the server log)") from None
    except DeliveryRefused as exc:
        if exc.status == 401:  # an operator watching for replays or clock drift sees these
            log.warning("webhook %r refused: %s", hook.name, exc.message)
        raise Refused(exc.status, exc.message) from None
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Refused(400, f"body is not JSON ({exc})") from None
    except RecursionError:  # nested thousands deep: the sender's fault, never a 500
        raise Refused(400, nested_message("body")) from None
    if too_deep(payload):  # else a run nobody could inspect
        raise Refused(400, nested_message("body"))
    try:
        delivery = await deliver(app.runtime, hook, delivery_id, payload)
    except RecursionError:
        raise Refused(400, nested_message("body")) from None
    except PayloadError as exc:
        raise Refused(400, str(exc)) from None
    except ConfigError as exc:
        log.error("%s", exc)
        raise Refused(500, f"webhook {hook.name!r} is misconfigured (see the server log)") from None
    except StoreUnavailable as exc:
        log.warning("webhook %r: %s", hook.name, exc)
        raise Refused(503, "the store cannot be reached; deliver again later") from None
    log.info(
        "webhook %r delivery %s: run %s%s",
        hook.name,
        delivery_id,
        delivery.run_id,
        " (duplicate)" if delivery.duplicate else "",
    )
    return JSONResponse(
        {"run_id": delivery.run_id, "duplicate": delivery.duplicate}, status_code=202
    )
