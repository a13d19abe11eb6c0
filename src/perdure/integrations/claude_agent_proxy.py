"""The local Messages API endpoint a durable Claude conversation's CLI talks to.

The Claude Agent SDK's CLI calls the model itself, over HTTP, at `ANTHROPIC_BASE_URL`.
A durable conversation points that at this endpoint (127.0.0.1, a free port, for the
conversation's lifetime) and answers each request with a function of the conversation's
(integrations/claude_agent.py: a journaled model step, or the request passed on). It is
a small HTTP/1.1 server: one request per connection, answered whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Reply", "Request", "serving"]

MAX_HEAD = 64 * 1024  # bytes of request line and headers


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request from the CLI: method, path (with its query), headers (lower-case
    names) and body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """The whole answer to a request."""

    status: int
    content_type: str
    body: bytes


Answer = Callable[[Request], Awaitable[Reply]]
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


async def _read(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
    else:
        body = await reader.readexactly(int(headers.get("content-length") or 0))
    return Request(parts[0].upper(), parts[1], headers, body)


def _reply_bytes(reply: Reply) -> bytes:
    reason = REASONS.get(reply.status, "Status")
    head = (
        f"HTTP/1.1 {reply.status} {reason}\r\n"
        f"Content-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + reply.body


@contextlib.asynccontextmanager
async def serving(answer: Answer) -> AsyncIterator[str]:
    """Serve `answer` on 127.0.0.1 until the block ends; yields the base URL. Requests are
    answered in the context (the run's) this was entered in."""

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            handlers.add(me)
            me.add_done_callback(handlers.discard)
        try:
            request = await _read(reader)
            if request is None:
                return
            reply = await answer(request)
            writer.write(_reply_bytes(reply))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=MAX_HEAD)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for task in list(handlers):  # a request still being answered: the CLI is gone
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5)
