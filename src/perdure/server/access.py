"""Who may do what: bearer tokens with scopes, stored hashed, and the audit log of actions.

Scopes: `read` (look), `operate` (start, cancel, pause, resume, resolve, send),
`approve` (answer gates and approvals), `admin` (tokens, budgets, schedules; all
of the above). A token is shown once, when created; only its SHA-256 is kept,
and it is never logged. The CLI acts as `cli:<OS user>@<host>` with every scope:
whoever can run it can reach the store directly anyway.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import secrets
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..store.names import check
from .access_sql import Access

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

    from ..app import App
    from .throttle import Throttle

SCOPES = ("read", "operate", "approve", "admin")
TOKEN_PREFIX = "pdr_"


@dataclass(frozen=True)
class Principal:
    """The holder of a valid token: its name (the audit log's actor) and scopes, and which
    token it is (empty for the CLI's local operator)."""

    name: str
    scopes: frozenset[str]
    token_id: str = field(default="", compare=False)

    def allows(self, scope: str) -> bool:
        """`admin` allows everything; `operate` and `approve` also allow `read`."""
        if "admin" in self.scopes or scope in self.scopes:
            return True
        return scope == "read" and bool(self.scopes & {"operate", "approve"})


def local_operator() -> Principal:
    """The person at this terminal, as the CLI acts: `cli:alice@host1`, every scope."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        user = f"uid{os.getuid()}"
    return Principal(f"cli:{user}@{socket.gethostname()}", frozenset({"admin"}))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_scopes(scopes: list[str] | tuple[str, ...]) -> str:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ConfigError(f"scope(s) {', '.join(unknown) or '(none)'}: use {', '.join(SCOPES)}")
    return " ".join(s for s in SCOPES if s in scopes)


async def create_token(
    app: App, name: str, scopes: list[str] | tuple[str, ...], token_id: str | None = None
) -> tuple[str, str]:
    """A new token for `name` with `scopes`: (its id, the token, shown only now).

    Not audited by itself: operators create tokens through `operations.create_token`."""
    check(name, "token name", 100)  # who or what holds it
    kept = check_scopes(scopes)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = token_id or new_token_id()
    await app.runtime.open_store()
    await Access(app.runtime.store).add_token(token_id, name, digest(token), kept, app.clock.now())
    return token_id, token


def new_token_id() -> str:
    return uuid.uuid4().hex[:12]


async def authenticate(app: App, authorization: str | None) -> Principal | None:
    """The principal of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    kind, _, token = authorization.partition(" ")
    if kind.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        return None
    await app.runtime.open_store()
    row = await Access(app.runtime.store).find_token(digest(token.strip()))
    if row is None:
        return None
    return Principal(row.name, frozenset(row.scopes.split()), row.id)


def address_of(request: HTTPConnection) -> str:
    """The client's address as the server sees it (what failed sign-ins are counted by)."""
    return request.client.host if request.client else "unknown"


async def authenticate_request(
    request: HTTPConnection, authorization: str | None
) -> Principal | None:
    """`authenticate`, with wrong tokens counted against the client's address by the
    server's `Throttle` (raises TooManyFailures, a 429, while the address is held back)."""
    throttle: Throttle = request.app.state.throttle
    return await authenticate_counted(
        request.app.state.perdure, throttle, address_of(request), authorization
    )


async def authenticate_counted(
    app: App, throttle: Throttle, address: str, authorization: str | None
) -> Principal | None:
    """`authenticate`, with a wrong token counted against `address` by `throttle`."""
    if not authorization:
        return None
    return await throttle.check(address, lambda: authenticate(app, authorization))


MAX_DETAIL = 8192  # characters of an audit row's detail (JSON)
REFUSED_FIELD = 200  # characters of one detail field kept as it is in a refused action's row


def audit_detail(detail: dict[str, Any], outcome: str = "ok") -> str:
    """The detail an audit row keeps, as JSON. A refused or failed action keeps its small
    fields (a reason, an option) but of any longer one only `{"sha256", "bytes"}`: a refusal
    costs the caller nothing, so it may not grow the store or the audit pages by its
    payload. A done action keeps its detail whole up to `MAX_DETAIL` characters, beyond
    which its longest fields are kept the same way."""
    fields = {k: json.dumps(v, separators=(",", ":"), sort_keys=True, default=str)
              for k, v in detail.items()}  # fmt: skip
    limit = REFUSED_FIELD if outcome != "ok" else None
    if limit is None and sum(len(k) + len(v) + 4 for k, v in fields.items()) > MAX_DETAIL:
        limit = MAX_DETAIL // max(1, len(fields)) // 2
    kept = {k: (json.loads(v) if limit is None or len(v) <= limit else {
        "sha256": hashlib.sha256(v.encode()).hexdigest(), "bytes": len(v.encode())})
        for k, v in fields.items()}  # fmt: skip
    text = json.dumps(kept, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= MAX_DETAIL else json.dumps({"sha256": hashlib.sha256(
        text.encode()).hexdigest(), "bytes": len(text.encode())})  # fmt: skip


async def record(
    app: App,
    actor: str,
    action: str,
    target: str,
    detail: dict[str, Any],
    outcome: str = "ok",
    reason: str = "",
) -> int:
    """Append an operator action to the audit log (who, what, on what, when, with what, how
    it ended); `operations.perform` is the one caller for actions. See `audit_detail` for
    what of `detail` is kept."""
    await app.runtime.open_store()
    text = audit_detail(detail, outcome)
    return await Access(app.runtime.store).audit(
        app.clock.now(), actor, action, target, text, outcome, reason
    )
