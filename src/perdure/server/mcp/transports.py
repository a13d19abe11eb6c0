"""Running the MCP server: over stdio or Streamable HTTP (bearer tokens), with an optional worker.

Over stdio the protocol owns the process's standard output: it is written to a
private copy of it, and file descriptor 1 then points at standard error, so a
workflow that prints (or a subprocess it starts) cannot corrupt the stream.
Over HTTP every request needs `Authorization: Bearer <token>` from `perdure
token create` (401 without one); a session can only be used with the token that
opened it. Before that, its Host and Origin must be ones the server answers to
(`server.hosts`: 421/403 otherwise, against DNS rebinding), and a slow client is cut
off (`server.timeouts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from io import TextIOWrapper
from types import FrameType
from typing import TYPE_CHECKING, cast

import anyio
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationError, BaseUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...engine.worker import Worker, WorkerOptions
from ..access import address_of, authenticate, digest
from ..hosts import AllowedHosts, HostCheck, hosts_for
from ..throttle import Throttle, TooManyFailures

if TYPE_CHECKING:
    from ...app import App
    from ..timeouts import ConnectionLimits
    from .server import PerdureMcp

STDIN_LINE_LIMIT = 64 * 1024 * 1024  # one JSON-RPC message a line


class StoreTokens:
    """The SDK's TokenVerifier over perdure's tokens (hashed in the store, with scopes)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def verify_token(self, token: str) -> AccessToken | None:
        who = await authenticate(self.app, f"Bearer {token}")
        if who is None:
            return None
        return AccessToken(
            token=token,
            client_id=who.name,
            scopes=sorted(who.scopes),
            subject=hashlib.sha256(token.encode()).hexdigest()[:16],  # tells same-name tokens apart
        )


class ThrottledBearer(BearerAuthBackend):
    """The SDK's bearer check, with wrong tokens limited per client address as the HTTP
    API limits them (`Throttle`): 429 while an address is held back; a token that worked
    before still goes through."""

    def __init__(self, verifier: StoreTokens, throttle: Throttle) -> None:
        super().__init__(verifier)
        self.throttle = throttle

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        header = conn.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return None
        verify = super().authenticate
        try:
            found: tuple[AuthCredentials, BaseUser] | None = await self.throttle.check(
                address_of(conn), digest(header[7:].strip()), lambda: verify(conn)
            )
        except TooManyFailures as exc:
            raise HeldBack(exc) from None
        return found


class HeldBack(AuthenticationError):
    """An address held back for wrong tokens (the middleware's error path answers it)."""

    def __init__(self, why: TooManyFailures) -> None:
        super().__init__(str(why))
        self.retry_after = why.retry_after


def held_back(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """429 for an address held back for wrong tokens (400 for any other sign-in error)."""
    if not isinstance(exc, HeldBack):
        return JSONResponse({"error": str(exc)}, status_code=400)
    headers = {"Retry-After": str(exc.retry_after)}
    return JSONResponse({"error": str(exc)}, status_code=429, headers=headers)


def _security(allowed: AllowedHosts | None) -> TransportSecuritySettings:
    """The SDK's own Host/Origin check, the same rule as `HostCheck` where its lists can say it
    (`HostCheck`, in front of authentication, decides in every case)."""
    patterns = allowed.patterns() if allowed is not None else None
    if patterns is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts, origins = patterns
    return TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins)


def http_app(mcp: PerdureMcp, path: str = "/mcp", allowed: AllowedHosts | None = None) -> Starlette:
    """The ASGI application: the MCP endpoint at `path`, behind bearer-token authentication and,
    with `allowed`, the Host/Origin check (None: any Host, as for an in-process test client)."""
    manager = StreamableHTTPSessionManager(
        app=mcp.server, stateless=False, security_settings=_security(allowed)
    )

    async def endpoint(scope: dict[str, object], receive: object, send: object) -> None:
        await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    hosts = [Middleware(HostCheck, allowed=allowed)] if allowed is not None else []
    return Starlette(
        routes=[Route(path, endpoint=RequireAuthMiddleware(endpoint, required_scopes=[]))],
        middleware=[  # outermost first: a request for another Host never meets a token check
            *hosts,
            Middleware(
                AuthenticationMiddleware,
                backend=ThrottledBearer(StoreTokens(mcp.app), Throttle()),
                on_error=held_back,
            ),
        ],
        lifespan=lifespan,
    )


async def _with_worker(
    app: App, options: WorkerOptions | None
) -> tuple[Worker | None, asyncio.Task[None] | None]:
    if options is None:
        return None, None
    worker = app.worker(options)
    return worker, asyncio.create_task(worker.run(), name="perdure-mcp-worker")


async def _stop(worker: Worker | None, runner: asyncio.Task[None] | None) -> None:
    if worker is not None and runner is not None:
        worker.stop()
        await runner


class _StdinLines:
    """Standard input as async lines read by the event loop, so SIGTERM can cancel the read
    (the SDK reads stdin on a thread, which nothing interrupts until a line arrives)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self.reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


async def _stdin() -> anyio.AsyncFile[str] | None:
    """Stdin as `_StdinLines` when it is a pipe (as MCP clients start servers), else None
    (the SDK's own reader)."""
    reader = asyncio.StreamReader(limit=STDIN_LINE_LIMIT)
    loop = asyncio.get_running_loop()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):  # a regular file or a closed stdin
        return None
    return cast("anyio.AsyncFile[str]", _StdinLines(reader))


async def serve_stdio(mcp: PerdureMcp, worker: WorkerOptions | None = None) -> None:
    """Serve one client over stdin/stdout until it disconnects or SIGTERM/SIGINT; with
    `worker`, also run workflows in this process (drained and released on the way out)."""
    protocol = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # from now on anything written to fd 1 goes to stderr
    stdout = anyio.wrap_file(TextIOWrapper(protocol, encoding="utf-8", write_through=True))
    loop = asyncio.get_running_loop()
    running, runner = await _with_worker(mcp.app, worker)
    try:
        with anyio.CancelScope() as scope:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, scope.cancel)
            async with stdio_server(stdin=await _stdin(), stdout=stdout) as (read, write):
                await mcp.server.run(read, write, mcp.server.create_initialization_options())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await _stop(running, runner)


async def serve_http(
    mcp: PerdureMcp,
    host: str,
    port: int,
    *,
    path: str = "/mcp",
    worker: WorkerOptions | None = None,
    names: tuple[str, ...] = (),
    limits: ConnectionLimits | None = None,
) -> None:
    """Serve Streamable HTTP at http://host:port/path until SIGTERM/SIGINT; with `worker`,
    also run workflows in this process. `names`: Host names (besides the bound
    address) a proxy or a DNS name reaches it by; `limits`: the slow-client deadlines."""
    import uvicorn

    from ..timeouts import uvicorn_config

    asgi = http_app(mcp, path, hosts_for(host, port, names))
    server = uvicorn.Server(uvicorn_config(asgi, host, port, limits))
    running, runner = await _with_worker(mcp.app, worker)

    def stop(signum: int, frame: FrameType | None) -> None:
        # uvicorn captures signals while it serves and raises them again here when done
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        await server.serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        await _stop(running, runner)
