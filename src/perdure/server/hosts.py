"""Host and Origin checks against DNS rebinding, for `perdure serve` and `perdure mcp --http`.

A page on evil.example can re-point its own name at 127.0.0.1 and then call a local
server from the victim's browser; the browser still sends `Host: evil.example` (and
`Origin: http://evil.example`). So a request is served only if its Host is one the
server answers to: the bound address and port (127.0.0.1, localhost and [::1] for a
loopback address; any IP literal when bound to every interface, since a rebinding
attack always carries a DNS name) or a name given with `--allowed-host` (any port, or
the one it names; `*` turns the check off). An Origin, when sent, must name such a
host and port too; requests without one (curl, SDKs, webhooks) pass. A wrong Host is
answered 421, a wrong Origin 403, as the MCP SDK does, with a one-line JSON error.
`perdure serve` checks Host only: its dashboard judges Origin itself (CSRF).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

EVERY_INTERFACE = ("", "0.0.0.0", "::")  # a bind to every interface
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORTS = {"http": 80, "https": 443}
WRONG_HOST = "Host {} is not served here; if that name is this server's: --allowed-host NAME"
WRONG_ORIGIN = "Origin {} may not call this server (pages only from a host it serves)"


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header value (`[::1]:8000` → `::1`, 8000); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else ""
    elif value.count(":") > 1:  # an IPv6 literal without brackets is not a Host value
        return None
    else:
        name, _, port_text = value.partition(":")
    if not name:
        return None
    if not port_text:
        return name, None
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AllowedHosts:
    """The Host values a server bound to `host`:`port` answers to, plus configured names."""

    host: str
    port: int
    names: tuple[str, ...] = ()  # `--allowed-host`: NAME (any port), NAME:PORT, or `*`

    @property
    def anything(self) -> bool:
        return "*" in self.names

    def local(self) -> tuple[str, ...]:
        """The bound address's own names (every IP literal too when bound to all)."""
        bound = self.host.strip("[]").lower()
        if bound in EVERY_INTERFACE or bound in LOOPBACK_NAMES or bound.startswith("127."):
            return (*LOOPBACK_NAMES, bound) if bound not in EVERY_INTERFACE else LOOPBACK_NAMES
        return (bound,)

    def allows(self, name: str, port: int | None) -> bool:
        """Whether a request for `name`:`port` is for us (a configured name: any port; None:
        a Host without a port, which no browser sends for a server on another port than
        80, so no page can make it)."""
        if self.anything:
            return True
        for given in self.names:
            parsed = split_host(given)
            if parsed is not None and parsed[0] == name and parsed[1] in (None, port):
                return True
        if port not in (self.port, None):
            return False
        wildcard = self.host.strip("[]") in EVERY_INTERFACE
        return name in self.local() or (wildcard and _is_ip(name))

    def allows_host(self, value: str | None) -> bool:
        parsed = split_host(value or "")
        return parsed is not None and self.allows(*parsed)

    def allows_origin(self, origin: str | None) -> bool:
        """No Origin (not a browser, or same-origin GET) passes; `null` never does."""
        if origin is None:
            return True
        try:
            url = urlsplit(origin.strip().lower())
            port = url.port or DEFAULT_PORTS.get(url.scheme)
        except ValueError:
            return False
        if url.scheme not in DEFAULT_PORTS or not url.hostname:
            return False
        return port is not None and self.allows(url.hostname, port)

    def patterns(self) -> tuple[list[str], list[str]] | None:
        """The same rule as the MCP SDK's exact/`:*` lists (hosts, origins); None when it
        cannot be written so (bound to every interface, or `*`)."""
        if self.anything or self.host.strip("[]") in EVERY_INTERFACE:
            return None
        bare = [f"[{n}]" if ":" in n else n for n in self.local()]
        own = [f"{n}:{self.port}" for n in bare]
        named: list[str] = []
        for given in self.names:
            parsed = split_host(given)
            named += [given] if parsed is None or parsed[1] else [given, f"{given}:*"]
        origins = [f"{scheme}://{h}" for h in (*own, *named) for scheme in DEFAULT_PORTS]
        origins += [f"{s}://{h}" for s, p in DEFAULT_PORTS.items() if p == self.port for h in bare]
        hosts = [*own, *bare, *named]  # a Host without a port: see `allows`
        return hosts, origins


def _refusal(status: int, message: str) -> tuple[dict[str, object], bytes]:
    body = json.dumps({"error": message}).encode() + b"\n"
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {"type": "http.response.start", "status": status, "headers": headers}, body


def _shown(value: str | None) -> str:
    return repr((value or "")[:100])


class HostCheck:
    """ASGI middleware: answer 421/403 before anything else reads a request not for us.

    `origins=False` checks Host only, for an application that judges Origin itself (the
    dashboard's CSRF check, which knows which requests change state)."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts, origins: bool = True) -> None:
        self.app = app
        self.allowed = allowed
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed.anything:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        if not self.allowed.allows_host(host):
            start, body = _refusal(421, WRONG_HOST.format(_shown(host)))
        elif self.origins and not self.allowed.allows_origin(origin):
            start, body = _refusal(403, WRONG_ORIGIN.format(_shown(origin)))
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(start)
        await send({"type": "http.response.body", "body": body})


def hosts_for(host: str, port: int, names: Iterable[str] = ()) -> AllowedHosts:
    """`AllowedHosts` for a server bound to host:port with `--allowed-host` names."""
    return AllowedHosts(host, port, tuple(n.strip().lower() for n in names if n.strip()))
