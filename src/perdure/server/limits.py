"""Request body limits for every endpoint, enforced while the body streams in.

One table says how many bytes a request to each part of the server may carry; the
`BodyLimit` middleware refuses a larger `Content-Length` at once and stops reading a
chunked (or lying) body the moment it passes the limit, before any handler or
authentication has buffered it. Handlers may refuse smaller bodies themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .validation import MAX_BODY

if TYPE_CHECKING:
    from ..triggers.webhooks import Webhook

MAX_FORM = 64 * 1024  # dashboard forms (sign-in, approve, act)
MAX_OTHER = 64 * 1024  # any other path (health, metrics, the dashboard's GETs)


def body_limit(path: str, hooks: Mapping[str, Webhook]) -> int:
    """The most bytes a request body to `path` may have (`hooks`: the app's webhooks)."""
    if path.startswith("/hooks/"):
        hook = hooks.get(path.removeprefix("/hooks/"))
        return MAX_OTHER if hook is None else hook.max_body  # unknown: 404 from the route
    if path.startswith("/api/"):
        return MAX_BODY
    if path.startswith("/ui/"):
        return MAX_FORM
    return MAX_OTHER


class BodyLimit:
    """ASGI middleware: a body over `limit_for(path)` bytes is answered 413 as soon as that
    is known; the application then sees the client as gone and its answer is dropped."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = _content_length(scope)
        if declared is not None and (declared < 0 or declared > limit):
            await _refuse(send, limit, 400 if declared < 0 else 413)
            return
        seen = 0
        state = {"started": False, "refused": False}

        async def bounded() -> Message:
            nonlocal seen
            if state["refused"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    state["refused"] = True
                    if not state["started"]:
                        state["started"] = True
                        await _refuse(send, limit, 413)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            if state["refused"]:
                return  # the 413 went out already
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, bounded, guarded)
        except Exception:
            if not state["refused"]:
                raise  # the application's own failure
            # it stopped because the body was cut off: the 413 is the answer


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else -1
    return None


async def _refuse(send: Send, limit: int, status: int) -> None:
    message = (
        f"request body is over {limit} bytes" if status == 413 else "Content-Length is not a number"
    )
    body = json.dumps({"error": message, "field": "body"}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
