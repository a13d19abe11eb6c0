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
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from io import TextIOWrapper
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp.types as types
from anyio.abc import TaskGroup
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
    authorization_context,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import MCP_PROTOCOL_VERSION_HEADER, MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import McpError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationError, BaseUser
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from ...engine.worker import Worker, WorkerOptions
from ..access import address_of, authenticate
from ..hosts import AllowedHosts, HostCheck, hosts_for
from ..operations import Forbidden
from ..throttle import Throttle, TooManyFailures
from .server import Requestor, translated
from .stateless import MODERN, Rpc, Stateless, unsupported, version_of

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
    API limits them (`Throttle`): a wrong one gets 429 while an address is held back; a
    valid token always goes through."""

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
                address_of(conn), lambda: verify(conn)
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


MAX_BODY = 4 * 1024 * 1024  # bytes of one POSTed JSON-RPC message (the SDK's own limit)


class Revisions:
    """One endpoint, two revisions, chosen per request: a POST naming 2026-07-28 (in its
    `_meta` or MCP-Protocol-Version header, or a `server/discover`) is answered statelessly
    here by `Stateless`, by whichever process receives it; one naming another version
    outside `initialize` gets -32022 naming those served; everything else goes to the SDK's
    session manager as 2025-11-25, except a `tasks/get` of a live session, answered here as
    plain JSON (the spec: a poll SHOULD NOT be upgraded to an SSE stream) and followed for
    that session as the SDK's handler would (status notifications, gates put to it)."""

    def __init__(self, mcp: PerdureMcp, manager: StreamableHTTPSessionManager) -> None:
        self.mcp = mcp
        self.manager = manager
        self.stateless = Stateless(mcp)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await self.manager.handle_request(scope, receive, send)
            return
        body = await _body(receive)
        if body is None:
            await JSONResponse({"error": f"request body over {MAX_BODY} bytes"}, 413)(
                scope, receive, send
            )
            return
        message = _message(body)
        method = message.get("method") if message is not None else None
        if message is None or not isinstance(method, str) or "id" not in message:
            await self.manager.handle_request(scope, _replay(body, receive), send)
            return
        headers = Headers(scope=scope)
        version = version_of(message, headers.get(MCP_PROTOCOL_VERSION_HEADER))
        if version is not None and method != "initialize":
            await self._stateless(scope, receive, send, message, version)
            return
        session = headers.get(MCP_SESSION_ID_HEADER)
        if method == "tasks/get" and session is not None and self._live(session, scope):
            await self._get_task(scope, receive, send, message, session)
            return
        await self.manager.handle_request(scope, _replay(body, receive), send)

    def _live(self, session: str, scope: Scope) -> bool:
        """`session` is open and the request's credential opened it (else the SDK answers
        404, as for a session that does not exist)."""
        if session not in getattr(self.manager, "_server_instances", {}):
            return False
        user = scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            return False
        owners: dict[str, Any] = getattr(self.manager, "_session_owners", {})
        return owners.get(session) == authorization_context(user)

    async def _get_task(
        self, scope: Scope, receive: Receive, send: Send, message: dict[str, Any], session: str
    ) -> None:
        params = message.get("params")
        task_id = params.get("taskId") if isinstance(params, dict) else None
        try:
            if not isinstance(task_id, str):
                raise McpError(types.ErrorData(code=types.INVALID_PARAMS,
                                               message="tasks/get needs a taskId"))  # fmt: skip
            requestor = self.mcp.requestor(scope.get("user"))
            got = await translated(self.mcp.get_task(requestor, task_id))
            state = self.mcp.session_state(session)  # known once it asked through the SDK
            if state is not None:  # status notifications, and its gates put, for this session
                state.watch(types.Task(**got.model_dump()))
            reply: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "result": got.model_dump(by_alias=True, mode="json", exclude_none=True),
            }
        except McpError as exc:
            error = exc.error.model_dump(mode="json", exclude_none=True)
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
        await JSONResponse(reply)(scope, receive, send)

    async def _stateless(
        self, scope: Scope, receive: Receive, send: Send, message: dict[str, Any], version: str
    ) -> None:
        if version != MODERN:
            await JSONResponse(unsupported(message["id"], version), 400)(scope, receive, send)
            return
        params = message.get("params")
        rpc = Rpc(message["id"], str(message["method"]), params if isinstance(params, dict) else {})
        try:
            requestor = self.mcp.requestor(scope.get("user"))
        except McpError as exc:
            refused = {"jsonrpc": "2.0", "id": rpc.id, "error": {"code": exc.error.code,
                       "message": exc.error.message}}  # fmt: skip
            await JSONResponse(refused, 401)(scope, receive, send)
            return
        if rpc.method == "subscriptions/listen":
            await self._listen(scope, receive, send, rpc, requestor)
            return
        await JSONResponse(await self.stateless.handle(rpc, requestor))(scope, receive, send)

    async def _listen(
        self, scope: Scope, receive: Receive, send: Send, rpc: Rpc, requestor: Requestor
    ) -> None:
        stream = self.stateless.listen(rpc, requestor)
        try:
            first = await anext(stream)
        except McpError as exc:  # the tasks extension was not declared, or no read scope
            error = exc.error.model_dump(mode="json", exclude_none=True)
            await JSONResponse({"jsonrpc": "2.0", "id": rpc.id, "error": error})(
                scope, receive, send
            )
            return
        except Forbidden as exc:
            refused = {"code": types.INVALID_REQUEST, "message": str(exc)}
            await JSONResponse({"jsonrpc": "2.0", "id": rpc.id, "error": refused})(
                scope, receive, send
            )
            return

        async def events() -> AsyncIterator[dict[str, str]]:
            yield {"event": "message", "data": json.dumps(first)}
            async for note in stream:
                yield {"event": "message", "data": json.dumps(note)}

        await EventSourceResponse(events(), headers={"Cache-Control": "no-cache"})(
            scope, receive, send
        )


async def _body(receive: Receive) -> bytes | None:
    """The request's body (None when it is over MAX_BODY)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] != "http.request":
            break
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not event.get("more_body", False):
            break
    return b"".join(chunks)


def _message(body: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(body)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body read here given again first (the SDK reads it once more)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def http_app(mcp: PerdureMcp, path: str = "/mcp", allowed: AllowedHosts | None = None) -> Starlette:
    """The ASGI application: the MCP endpoint at `path`, behind bearer-token authentication and,
    with `allowed`, the Host/Origin check (None: any Host, as for an in-process test client)."""
    manager = StreamableHTTPSessionManager(
        app=mcp.server, stateless=False, security_settings=_security(allowed)
    )

    revisions = Revisions(mcp, manager)

    async def end_session(session_id: str) -> None:
        transport = getattr(manager, "_server_instances", {}).get(session_id)
        if transport is not None:
            await transport.terminate()

    mcp.end_session = end_session

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await revisions.handle(scope, receive, send)

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

    def __init__(
        self, reader: asyncio.StreamReader, taken: Callable[[str], bool] | None = None
    ) -> None:
        self.reader = reader
        self.taken = taken  # answers a line itself (2026-07-28) instead of the SDK

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self.reader.readline()
            if not line:
                raise StopAsyncIteration
            text = line.decode("utf-8", errors="replace")
            if self.taken is None or not self.taken(text):
                return text


class StdioStateless:
    """The 2026-07-28 revision over stdio: a line whose request names it (or names a version not
    served) is answered here, on its own task, and never reaches the SDK's session."""

    def __init__(self, mcp: PerdureMcp, stdout: anyio.AsyncFile[str], group: TaskGroup) -> None:
        self.mcp = mcp
        self.stateless = Stateless(mcp)
        self.stdout = stdout
        self.group = group

    def take(self, line: str) -> bool:
        message = _message(line.encode())
        method = message.get("method") if message is not None else None
        if message is None or not isinstance(method, str) or "id" not in message:
            return False
        version = version_of(message, None)
        if version is None or method == "initialize":
            return False
        self.group.start_soon(self._answer, message, version)
        return True

    async def _write(self, message: dict[str, Any]) -> None:
        await self.stdout.write(json.dumps(message) + "\n")

    async def _answer(self, message: dict[str, Any], version: str) -> None:
        if version != MODERN:
            await self._write(unsupported(message["id"], version))
            return
        params = message.get("params")
        rpc = Rpc(message["id"], str(message["method"]), params if isinstance(params, dict) else {})
        info = rpc.meta.get("io.modelcontextprotocol/clientInfo")
        name = str(info.get("name") or "client") if isinstance(info, dict) else "client"
        requestor = self.mcp.requestor(None, name)
        if rpc.method != "subscriptions/listen":
            await self._write(await self.stateless.handle(rpc, requestor))
            return
        try:
            async for note in self.stateless.listen(rpc, requestor):
                await self._write(note)
        except (McpError, Forbidden) as exc:
            error = (exc.error.model_dump(mode="json", exclude_none=True)
                     if isinstance(exc, McpError)
                     else {"code": types.INVALID_REQUEST, "message": str(exc)})  # fmt: skip
            await self._write({"jsonrpc": "2.0", "id": rpc.id, "error": error})


async def _stdin(taken: Callable[[str], bool] | None = None) -> anyio.AsyncFile[str] | None:
    """Stdin as `_StdinLines` when it is a pipe (as MCP clients start servers), else None
    (the SDK's own reader, which serves 2025-11-25 only)."""
    reader = asyncio.StreamReader(limit=STDIN_LINE_LIMIT)
    loop = asyncio.get_running_loop()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):  # a regular file or a closed stdin
        return None
    return cast("anyio.AsyncFile[str]", _StdinLines(reader, taken))


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
            async with anyio.create_task_group() as group:
                modern = StdioStateless(mcp, stdout, group)
                stdin = await _stdin(modern.take)
                async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
                    await mcp.server.run(read, write, mcp.server.create_initialization_options())
                group.cancel_scope.cancel()  # stdin ended: answers still pending are dropped
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
