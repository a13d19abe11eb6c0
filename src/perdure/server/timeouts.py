"""Deadlines on slow clients for `perdure serve` and `perdure mcp --http` (both on uvicorn).

uvicorn (0.54) times out only an idle kept-alive connection: a client that opens a
connection and sends nothing, or sends its headers a byte at a time, or stops in the
middle of a body, holds a socket (and, for a body, a handler) for ever. This module's
HTTP protocol is uvicorn's h11 one plus three bounds, in the spirit of nginx's
`client_header_timeout` and `client_body_timeout`:

- a request's headers must be complete within `header_timeout` seconds of its first
  byte (of the connection, for the first request): else 408 (closed silently if not
  one byte came) and the connection is closed;
- a body may pause at most `body_timeout` seconds between two reads of bytes, and must be
  complete within `body_deadline` seconds of its headers however steadily it trickles:
  else 408 if no answer was started, and the connection is closed (the handler sees the
  client gone); a body still coming once the answer is sent is read (so that the client
  sees the answer) for `body_timeout` seconds at most, however fast it comes;
- at most `max_connections` connections are open at once, at most `max_per_address` of
  them from one client address (a named proxy excepted), and at most a quarter of
  `max_connections` may be sending a body without an `Authorization` header (sign-in
  forms, webhooks): one more is answered 503 and closed at once;
- `X-Forwarded-For`/`Forwarded` are believed only from `trusted_proxies` (uvicorn's own
  default believes 127.0.0.1, which lets any local process pick its address).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("perdure.server")


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many may connect at once."""

    header_timeout: float = 10.0  # seconds from a request's first byte to its last header
    body_timeout: float = 30.0  # seconds a request body may send no byte
    body_deadline: float = 60.0  # seconds a whole request body may take after its headers
    keep_alive: int = 5  # seconds an idle kept-alive connection stays open (uvicorn's)
    max_connections: int = 1000  # open connections at once; one more gets 503
    max_per_address: int = 100  # open connections from one client address (not a proxy's)
    trusted_proxies: tuple[str, ...] = ()  # addresses whose X-Forwarded-For is believed

    def __post_init__(self) -> None:
        names = ("header_timeout", "body_timeout", "body_deadline", "keep_alive",
                 "max_connections", "max_per_address")  # fmt: skip
        for name in names:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)!r}")


def _answer(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection: JSON `{"error": ...}`."""
    body = json.dumps({"error": message}).encode() + b"\n"
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode("ascii") + body


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines of `limits` (set by `protocol_for`).

    Where a request stands is read from h11's view of the client (`their_state`) after
    every read: IDLE means headers are still coming, SEND_BODY a body, anything else that
    the client has nothing more to send for now (the application's time is not bounded).
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    # per server (`protocol_for` gives each its own): open connections per client address,
    # and the connections now sending a body without credentials
    by_address: ClassVar[Counter[str]] = Counter()
    anonymous_bodies: ClassVar[set[DeadlineProtocol]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase = ""  # "headers", "body" or "linger" while a deadline runs
        self._address = ""  # the client address counted in `by_address`
        self._body_ends = 0.0  # loop time the body being read must be complete by (0: none)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else ""
        if len(self.connections) > self.limits.max_connections:
            self.logger.warning("refused a connection: %d open", len(self.connections) - 1)
            self._refuse("too many connections; retry")
            return
        if address not in self.limits.trusted_proxies:
            if self.by_address[address] >= self.limits.max_per_address:
                self.logger.warning("refused a connection: %d open from one address",
                                    self.by_address[address])  # fmt: skip
                self._refuse("too many connections from this address; retry")
                return
            self._address = address
            self.by_address[address] += 1
        self._arm("headers", self.limits.header_timeout)

    def _refuse(self, message: str) -> None:
        self.transport.write(_answer(503, "Service Unavailable", message))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm()
            self._body_done()
        elif self.conn.their_state is h11.IDLE:  # a request's headers are coming
            self._body_done()
            if self._phase != "headers":  # the first bytes of the next request
                self._arm("headers", self.limits.header_timeout)
        elif self.conn.their_state is h11.SEND_BODY:
            if self.cycle is not None and self.cycle.response_complete:
                self._body_done()
                if self._phase != "linger":  # answered: the rest of the body is not wanted
                    self._arm("linger", self.limits.body_timeout)
            else:
                self._body_coming()
        else:
            self._disarm()
            self._body_done()

    def _body_coming(self) -> None:
        """Bytes of a body came (or its headers ended): the pause restarts, within the
        whole body's deadline; a body without credentials takes one of the few slots
        such bodies share."""
        now = self.loop.time()
        if not self._body_ends:  # the headers just ended
            self._body_ends = now + self.limits.body_deadline
            headers = dict(self.scope.get("headers", ())) if self.cycle is not None else {}
            if b"authorization" not in headers:
                if len(self.anonymous_bodies) >= max(1, self.limits.max_connections // 4):
                    self.logger.warning("refused a request: %d bodies without credentials "
                                        "coming", len(self.anonymous_bodies))  # fmt: skip
                    self._refuse("too many requests sending a body; retry")
                    if self.cycle is not None:
                        self.cycle.disconnected = True
                        self.cycle.message_event.set()
                    return
                self.anonymous_bodies.add(self)
        self._arm("body", min(self.limits.body_timeout, self._body_ends - now))

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._body_done()
        if self._address:
            self.by_address[self._address] -= 1
            if self.by_address[self._address] <= 0:
                del self.by_address[self._address]
            self._address = ""
        super().connection_lost(exc)

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, ""

    def _body_done(self) -> None:
        """The body being read is complete, answered or cut off: its deadline and slot go."""
        self.anonymous_bodies.discard(self)
        self._body_ends = 0.0

    def _expired(self) -> None:
        phase, self._deadline, self._phase = self._phase, None, ""
        if self.transport.is_closing():
            return
        if phase == "body" and self.flow.read_paused:  # the handler is behind, not the client
            self._phase = "body"
            self._deadline = self.loop.call_later(self.limits.body_timeout, self._expired)
            return
        if phase == "headers" and self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:  # part of a request came: say why it ends
                seconds = self.limits.header_timeout
                self.transport.write(_answer(
                    408, "Request Timeout", f"request headers not complete within {seconds:g} s"
                ))  # fmt: skip
        elif phase in ("body", "linger") and self.conn.their_state is h11.SEND_BODY:
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                if self._body_ends and self.loop.time() >= self._body_ends - 0.001:
                    why = f"request body not complete within {self.limits.body_deadline:g} s"
                else:
                    why = f"request body stalled for {self.limits.body_timeout:g} s"
                self.transport.write(_answer(408, "Request Timeout", why))
            if cycle is not None:  # the handler's answer, if any, goes nowhere
                cycle.disconnected = True
                cycle.message_event.set()
        else:
            return
        self.transport.close()


class QuietDisconnects:
    """ASGI middleware: a handler stopped because its client went away mid-body (cut off by a
    deadline, or gone by itself) ends with one log line, not a traceback: nobody is left to
    answer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import ClientDisconnect

        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            log.info("%s %s: the client went away before its body was read",
                     scope.get("method"), scope.get("path"))  # fmt: skip


def protocol_for(limits: ConnectionLimits) -> type[DeadlineProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to `limits`."""
    bound = {"limits": limits, "by_address": Counter(), "anonymous_bodies": set()}
    return type("DeadlineProtocol", (DeadlineProtocol,), bound)


def uvicorn_config(
    asgi: Any, host: str, port: int, limits: ConnectionLimits | None = None
) -> uvicorn.Config:
    """uvicorn's configuration for perdure's servers: `asgi` on host:port with `limits`."""
    import uvicorn

    limits = limits or ConnectionLimits()
    return uvicorn.Config(
        QuietDisconnects(asgi), host=host, port=port, log_config=None, http=protocol_for(limits),
        timeout_keep_alive=limits.keep_alive, proxy_headers=bool(limits.trusted_proxies),
        forwarded_allow_ips=list(limits.trusted_proxies) or None,
    )  # fmt: skip
