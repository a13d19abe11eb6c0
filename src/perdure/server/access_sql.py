"""Access control's store extension: API tokens and dashboard sessions (only their hashes
are stored) and the audit log; their tables, SQL and methods (`Access(store)`).

The audit log is append-only: perdure has no statement that updates or deletes it.
Plain Python (no starlette): the core CLI (`perdure token`, `perdure audit`) uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

ACCESS = Extension(
    "access",
    [
        # 1: API tokens (stored hashed) and the append-only audit log
        """
        CREATE TABLE api_tokens (
            id          TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            hash        TEXT NOT NULL UNIQUE,
            scopes      TEXT NOT NULL,
            created_at  REAL NOT NULL,
            revoked_at  REAL
        );
        CREATE TABLE audit_log (
            id       INTEGER PRIMARY KEY AUTOINCREMENT,
            at       REAL NOT NULL,
            actor    TEXT NOT NULL,
            action   TEXT NOT NULL,
            target   TEXT NOT NULL,
            detail   TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX audit_by_target ON audit_log (target, id)
        """,
        # 2: the audit log says how each action ended (ok, refused, failed) and why, and is
        # searched by actor; rows written before were all of actions that succeeded
        """
        ALTER TABLE audit_log ADD COLUMN outcome TEXT NOT NULL DEFAULT 'ok';
        ALTER TABLE audit_log ADD COLUMN reason TEXT NOT NULL DEFAULT '';
        CREATE INDEX audit_by_actor ON audit_log (actor, id)
        """,
        # 3: dashboard sign-ins are server-side sessions (only the session id's hash is
        # kept): ended on sign-out, dead with their token, expired by the server's limits
        """
        CREATE TABLE dashboard_sessions (
            hash        TEXT PRIMARY KEY,
            token_id    TEXT NOT NULL,
            created_at  REAL NOT NULL,
            seen_at     REAL NOT NULL,
            ended_at    REAL
        );
        CREATE INDEX sessions_by_token ON dashboard_sessions (token_id);
        CREATE INDEX sessions_by_seen ON dashboard_sessions (seen_at)
        """,
    ],
    tables=("api_tokens", "audit_log", "dashboard_sessions"),
    legacy=(6, 8, 9),  # made by the core's scripts 6, 8 and 9 before
    at_open=True,
)


@dataclass(slots=True)
class TokenRow:
    """An API token as stored: its id, a name, its scopes; never the token itself."""

    id: str
    name: str
    scopes: str  # space-separated: read operate approve admin
    created_at: float
    revoked_at: float | None = None


@dataclass(slots=True)
class SessionRow:
    """A live dashboard session with its token's name and scopes (a session of a revoked
    token, or one ended by signing out, is never found)."""

    token_id: str
    name: str
    scopes: str
    created_at: float
    seen_at: float


@dataclass(slots=True)
class AuditRow:
    """Who did what to which run, schedule or agent, when, with any comment, and how it
    ended: `ok`, `refused` (not allowed, or not possible: the reason says why) or `failed`."""

    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str  # JSON
    outcome: str = "ok"
    reason: str = ""


def add_token(conn: Db, token_id: str, name: str, digest: str, scopes: str, now: float) -> None:
    conn.execute(
        "INSERT INTO api_tokens (id, name, hash, scopes, created_at) VALUES (?, ?, ?, ?, ?)",
        (token_id, name, digest, scopes, now),
    )


def find_token(conn: Db, digest: str) -> TokenRow | None:
    row = conn.execute(
        "SELECT id, name, scopes, created_at, revoked_at FROM api_tokens "
        "WHERE hash = ? AND revoked_at IS NULL",
        (digest,),
    ).fetchone()
    return TokenRow(*row) if row else None


def list_tokens(conn: Db) -> list[TokenRow]:
    rows = conn.execute(
        "SELECT id, name, scopes, created_at, revoked_at FROM api_tokens ORDER BY created_at"
    ).fetchall()
    return [TokenRow(*r) for r in rows]


def revoke_token(conn: Db, token_id: str, now: float) -> bool:
    cur = conn.execute(
        "UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
        (now, token_id),
    )
    return cur.rowcount == 1


def add_session(conn: Db, digest: str, token_id: str, now: float, forget_before: float) -> None:
    """Keep a new session; sessions last seen before `forget_before` are long dead: drop them."""
    conn.execute("DELETE FROM dashboard_sessions WHERE seen_at < ?", (forget_before,))
    conn.execute(
        "INSERT INTO dashboard_sessions (hash, token_id, created_at, seen_at) VALUES (?, ?, ?, ?)",
        (digest, token_id, now, now),
    )


def find_session(conn: Db, digest: str) -> SessionRow | None:
    row = conn.execute(
        "SELECT s.token_id, t.name, t.scopes, s.created_at, s.seen_at "
        "FROM dashboard_sessions s JOIN api_tokens t ON t.id = s.token_id "
        "WHERE s.hash = ? AND s.ended_at IS NULL AND t.revoked_at IS NULL",
        (digest,),
    ).fetchone()
    return SessionRow(*row) if row else None


def touch_session(conn: Db, digest: str, now: float) -> None:
    conn.execute(
        "UPDATE dashboard_sessions SET seen_at = ? WHERE hash = ? AND seen_at < ?",
        (now, digest, now),
    )


def end_session(conn: Db, digest: str, now: float) -> bool:
    cur = conn.execute(
        "UPDATE dashboard_sessions SET ended_at = ? WHERE hash = ? AND ended_at IS NULL",
        (now, digest),
    )
    return cur.rowcount == 1


def audit(
    conn: Db, at: float, actor: str, action: str, target: str, detail: str,
    outcome: str = "ok", reason: str = "",
) -> int:  # fmt: skip
    found = conn.execute(
        "INSERT INTO audit_log (at, actor, action, target, detail, outcome, reason) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (at, actor, action, target, detail, outcome, reason),
    ).fetchone()
    return int(found[0])


def audit_log(
    conn: Db, target: str | None = None, limit: int = 100, before: int | None = None,
    *, actor: str | None = None, since: float | None = None,
) -> list[AuditRow]:  # fmt: skip
    """Audit records, newest first, that match every filter given (`before`: ids below
    this one, the next page; `since`: at or after this time)."""
    where: list[str] = []
    params: list[str | int | float] = []
    for clause, value in (
        ("target = ?", target),
        ("actor = ?", actor),
        ("at >= ?", since),
        ("id < ?", before),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    text = f"WHERE {' AND '.join(where)} " if where else ""
    rows = conn.execute(
        "SELECT id, at, actor, action, target, detail, outcome, reason FROM audit_log "
        f"{text}ORDER BY id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [AuditRow(*r) for r in rows]


class Access(Methods):
    """Access control's methods over one store: API tokens (hashed), dashboard sessions
    (hashed ids; found only while unended and their token unrevoked), the audit log."""

    extension = ACCESS
    add_token = writes(add_token)
    find_token = reads(find_token)
    list_tokens = reads(list_tokens)
    revoke_token = writes(revoke_token)
    add_session = writes(add_session)
    find_session = reads(find_session)
    touch_session = writes(touch_session)
    end_session = writes(end_session)
    audit = writes(audit)
    audit_log = reads(audit_log)
