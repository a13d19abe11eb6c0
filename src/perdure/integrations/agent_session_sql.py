"""The agent sessions' store extension: a framework's conversation history (the OpenAI
Agents SDK's Session items), kept as JSON rows in order under a session id shared by
every run of it; its table, SQL and methods (`AgentSessions(store)`).

Each function takes a `Db`, so a durable run calls them inside a transactional step (the
write commits with the step's outcome: a replay or a recovery never adds an item twice)
and a caller outside a run through `AgentSessions(store)`.
"""

from __future__ import annotations

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

AGENT_SESSIONS = Extension(
    "agent_sessions",
    [
        # 1: agent sessions: a framework's conversation history under a session id, in order
        """
        CREATE TABLE agent_session_items (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id  TEXT NOT NULL,
            item        TEXT NOT NULL,
            at          REAL NOT NULL
        );
        CREATE INDEX agent_session_items_by_session ON agent_session_items (session_id, id)
        """,
    ],
    tables=("agent_session_items",),
    legacy=(18,),  # made by the core's script 18 before
    at_open=True,
)


def items(conn: Db, session_id: str, limit: int | None = None) -> list[str]:
    """The session's items (JSON), oldest first; with `limit`, the latest `limit` of them."""
    if limit is None:
        rows = conn.execute(
            "SELECT item FROM agent_session_items WHERE session_id = ? ORDER BY id",
            (session_id,),
        ).fetchall()
        return [r[0] for r in rows]
    if limit <= 0:
        return []
    rows = conn.execute(
        "SELECT item FROM agent_session_items WHERE session_id = ? ORDER BY id DESC LIMIT ?",
        (session_id, limit),
    ).fetchall()
    return [r[0] for r in reversed(rows)]


def add(conn: Db, session_id: str, new: list[str], now: float) -> None:
    """Append `new` (JSON items) to the session, in order."""
    conn.executemany(
        "INSERT INTO agent_session_items (session_id, item, at) VALUES (?, ?, ?)",
        [(session_id, item, now) for item in new],
    )


def pop(conn: Db, session_id: str) -> str | None:
    """Remove and return the session's latest item (None if it has none)."""
    row = conn.execute(
        "DELETE FROM agent_session_items WHERE id = (SELECT MAX(id) FROM agent_session_items "
        "WHERE session_id = ?) RETURNING item",
        (session_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def clear(conn: Db, session_id: str) -> int:
    """Remove every item of the session; how many there were."""
    return conn.execute(
        "DELETE FROM agent_session_items WHERE session_id = ?", (session_id,)
    ).rowcount


class AgentSessions(Methods):
    """The agent sessions' methods over one store, for callers outside a run."""

    extension = AGENT_SESSIONS
    agent_session_items = reads(items)
    agent_session_add = writes(add)
    agent_session_pop = writes(pop)
    agent_session_clear = writes(clear)
