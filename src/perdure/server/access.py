"""Who may do what: bearer tokens with scopes, stored hashed, and the audit log of actions.

Scopes: `read` (look), `operate` (start, cancel, pause, resume, resolve, send),
`approve` (answer gates and approvals), `admin` (tokens, budgets, schedules; all
of the above). A token is shown once, when created; only its SHA-256 is kept,
and it is never logged.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..app import App

SCOPES = ("read", "operate", "approve", "admin")
TOKEN_PREFIX = "pdr_"


@dataclass(frozen=True)
class Principal:
    """The holder of a valid token: its name (the audit log's actor) and scopes."""

    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """`admin` allows everything; `operate` and `approve` also allow `read`."""
        if "admin" in self.scopes or scope in self.scopes:
            return True
        return scope == "read" and bool(self.scopes & {"operate", "approve"})


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_scopes(scopes: list[str] | tuple[str, ...]) -> str:
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise ConfigError(f"scope(s) {', '.join(unknown) or '(none)'}: use {', '.join(SCOPES)}")
    return " ".join(s for s in SCOPES if s in scopes)


async def create_token(app: App, name: str, scopes: list[str] | tuple[str, ...]) -> tuple[str, str]:
    """A new token for `name` with `scopes`: (its id, the token, shown only now)."""
    if not name or len(name) > 100:
        raise ConfigError("a token needs a name of 1 to 100 characters (who or what holds it)")
    kept = check_scopes(scopes)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = uuid.uuid4().hex[:12]
    await app.open_store()
    await app.store.add_token(token_id, name, digest(token), kept, app.clock.now())
    await record(
        app, "admin:cli", "token.create", f"token:{token_id}", {"name": name, "scopes": kept}
    )
    return token_id, token


async def authenticate(app: App, authorization: str | None) -> Principal | None:
    """The principal of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    kind, _, token = authorization.partition(" ")
    if kind.lower() != "bearer" or not token.startswith(TOKEN_PREFIX):
        return None
    await app.open_store()
    row = await app.store.find_token(digest(token.strip()))
    if row is None:
        return None
    return Principal(row.name, frozenset(row.scopes.split()))


async def record(app: App, actor: str, action: str, target: str, detail: dict[str, Any]) -> int:
    """Append an operator action to the audit log (who, what, on what, when, with what)."""
    await app.open_store()
    text = json.dumps(detail, separators=(",", ":"), sort_keys=True, default=str)
    return await app.store.audit(app.clock.now(), actor, action, target, text)
