"""Dashboard sign-in sessions: an id in an HttpOnly cookie, only its SHA-256 in the store.

A session ends when its holder signs out, when its token is revoked, after `idle`
seconds without a request, and `absolute` seconds after sign-in whatever happens; a copied
cookie is then worth nothing. The token itself never leaves the sign-in form.

Browsers send a cookie of 127.0.0.1 to every port of 127.0.0.1, so a process serving
another port (or a page it serves, `<img src="/ui/x">`) gets the session cookie. The cookie
alone therefore authorises no action and no stream: the session id is a one-way digest of
a random *tab key* that the browser keeps in the dashboard origin's own storage (which
another port cannot read) and its script sends as `X-Perdure-Tab` (the stream: `?tab=`).
The server keeps no tab key: it checks that the key's digest is the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .access import Principal, address_of, digest
from .access_sql import Access

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

    from ..app import App
    from .throttle import Throttle

SESSION_PREFIX = "pds_"
TAB_PREFIX = "pdt_"
IDLE = 4 * 3600.0  # seconds without a request before a session ends
ABSOLUTE = 24 * 3600.0  # seconds after sign-in when a session ends however busy
TOUCH_EVERY = 60.0  # a session's last use is written at most this often


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """How long sessions last (`perdure serve --session-idle/--session-max`)."""

    idle: float = IDLE
    absolute: float = ABSOLUTE

    def __post_init__(self) -> None:
        if not (0 < self.idle <= self.absolute):
            raise ValueError("sessions need 0 < idle <= absolute seconds")


def session_of(tab: str) -> str:
    """The session id (the cookie) of tab key `tab`: a digest nobody can undo."""
    raw = hashlib.sha256(b"perdure tab key\0" + tab.encode()).digest()
    return SESSION_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def tab_matches(tab: str, session: str) -> bool:
    """`tab` is the key of `session` (compared in constant time)."""
    if not tab.startswith(TAB_PREFIX) or len(tab) > 100:
        return False
    return secrets.compare_digest(session_of(tab).encode(), session.encode())


async def start(app: App, who: Principal, policy: SessionPolicy) -> tuple[str, str]:
    """A new session for the holder of token `who`: (the id to set as the cookie, its tab
    key, for the signed-in page's script only)."""
    tab = TAB_PREFIX + secrets.token_urlsafe(32)
    session = session_of(tab)
    now = app.clock.now()
    await Access(app.runtime.store).add_session(
        digest(session), who.token_id, now, now - 2 * policy.absolute
    )
    return session, tab


async def holder(
    app: App, session: str, policy: SessionPolicy, *, touch: bool = True
) -> Principal | None:
    """Who the session `session` is of, or None: unknown, signed out, token revoked, idle
    too long or too old. `touch` records this use (a page or action; a live stream does
    not, so an open tab left alone still ends)."""
    if not session.startswith(SESSION_PREFIX):
        return None
    key = digest(session)
    row = await Access(app.runtime.store).find_session(key)
    if row is None:
        return None
    now = app.clock.now()
    if now - row.seen_at > policy.idle or now - row.created_at > policy.absolute:
        await Access(app.runtime.store).end_session(key, now)
        return None
    if touch and now - row.seen_at >= TOUCH_EVERY:
        await Access(app.runtime.store).touch_session(key, now)
    return Principal(row.name, frozenset(row.scopes.split()), row.token_id)


async def request_holder(
    request: HTTPConnection, session: str, *, touch: bool = True
) -> Principal | None:
    """`holder`, with wrong session ids counted against the client's address like wrong
    tokens (raises TooManyFailures while the address is held back)."""
    throttle: Throttle = request.app.state.throttle
    policy: SessionPolicy = request.app.state.sessions
    app: App = request.app.state.perdure
    return await throttle.check(
        address_of(request), lambda: holder(app, session, policy, touch=touch)
    )


async def end(app: App, session: str) -> None:
    """Sign out: the session is ended for good (a copy of its cookie no longer works)."""
    await Access(app.runtime.store).end_session(digest(session), app.clock.now())
