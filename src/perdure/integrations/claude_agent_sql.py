"""The Claude Agent SDK sessions' store extension: the transcripts the SDK mirrors to a
`SessionStore` (one JSON entry per transcript line, under project key, session id and
subpath), each session's write time and the SDK's folded summary; its table, SQL and
methods (`ClaudeSessions(store)`).

Entries that carry a `uuid` are kept once (a retried batch adds nothing); entries without
one (titles, tags) are appended as they come. The SDK's summary fold is passed in by the
caller, so this module never imports the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

CLAUDE_SESSIONS = Extension(
    "claude_sessions",
    [
        # 1: the Claude Agent SDK's transcripts, their write times and summaries
        """
        CREATE TABLE claude_session_entries (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            project_key TEXT NOT NULL,
            session_id  TEXT NOT NULL,
            subpath     TEXT NOT NULL,
            uuid        TEXT,
            entry       TEXT NOT NULL
        );
        CREATE INDEX claude_session_entries_by_key
            ON claude_session_entries (project_key, session_id, subpath, id);
        CREATE UNIQUE INDEX claude_session_entries_once
            ON claude_session_entries (project_key, session_id, subpath, uuid)
            WHERE uuid IS NOT NULL;
        CREATE TABLE claude_sessions (
            project_key TEXT NOT NULL,
            session_id  TEXT NOT NULL,
            subpath     TEXT NOT NULL,
            mtime       BIGINT NOT NULL,
            PRIMARY KEY (project_key, session_id, subpath)
        );
        CREATE TABLE claude_session_summaries (
            project_key TEXT NOT NULL,
            session_id  TEXT NOT NULL,
            mtime       BIGINT NOT NULL,
            data        TEXT NOT NULL,
            PRIMARY KEY (project_key, session_id)
        )
        """,
    ],
    tables=("claude_session_entries", "claude_sessions", "claude_session_summaries"),
    at_open=True,
)

Fold = Callable[[dict[str, Any] | None], dict[str, Any]]


def append(
    conn: Db,
    project_key: str,
    session_id: str,
    subpath: str,
    entries: list[tuple[str | None, str]],
    now_ms: int,
    fold: Fold | None = None,
) -> int:
    """Append `entries` ((uuid or None, JSON)) in order, each uuid once; stamp the session's
    write time (strictly later than its last) and, with `fold`, fold its summary. Returns
    the write time stamped."""
    conn.executemany(
        "INSERT INTO claude_session_entries (project_key, session_id, subpath, uuid, entry) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        [(project_key, session_id, subpath, uuid, entry) for uuid, entry in entries],
    )
    row = conn.execute(
        "SELECT mtime FROM claude_sessions WHERE project_key = ? AND session_id = ? "
        "AND subpath = ?",
        (project_key, session_id, subpath),
    ).fetchone()
    mtime = now_ms if row is None else max(now_ms, int(row[0]) + 1)
    conn.execute(
        "INSERT INTO claude_sessions (project_key, session_id, subpath, mtime) "
        "VALUES (?, ?, ?, ?) ON CONFLICT (project_key, session_id, subpath) "
        "DO UPDATE SET mtime = excluded.mtime",
        (project_key, session_id, subpath, mtime),
    )
    if fold is not None:
        found = conn.execute(
            "SELECT data FROM claude_session_summaries WHERE project_key = ? AND session_id = ?",
            (project_key, session_id),
        ).fetchone()
        summary = fold(None if found is None else json.loads(found[0]))
        summary["mtime"] = mtime
        conn.execute(
            "INSERT INTO claude_session_summaries (project_key, session_id, mtime, data) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (project_key, session_id) "
            "DO UPDATE SET mtime = excluded.mtime, data = excluded.data",
            (project_key, session_id, mtime, json.dumps(summary)),
        )
    return mtime


def load(conn: Db, project_key: str, session_id: str, subpath: str) -> list[str] | None:
    """The transcript's entries (JSON) in order; None if it was never written."""
    known = conn.execute(
        "SELECT 1 FROM claude_sessions WHERE project_key = ? AND session_id = ? AND subpath = ?",
        (project_key, session_id, subpath),
    ).fetchone()
    if known is None:
        return None
    rows = conn.execute(
        "SELECT entry FROM claude_session_entries WHERE project_key = ? AND session_id = ? "
        "AND subpath = ? ORDER BY id",
        (project_key, session_id, subpath),
    ).fetchall()
    return [str(r[0]) for r in rows]


def sessions(conn: Db, project_key: str) -> list[tuple[str, int]]:
    """The main transcripts of `project_key`: (session id, write time in ms)."""
    rows = conn.execute(
        "SELECT session_id, mtime FROM claude_sessions WHERE project_key = ? AND subpath = ''",
        (project_key,),
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def summaries(conn: Db, project_key: str) -> list[str]:
    """The folded summaries (JSON) of `project_key`'s sessions."""
    rows = conn.execute(
        "SELECT data FROM claude_session_summaries WHERE project_key = ?", (project_key,)
    ).fetchall()
    return [str(r[0]) for r in rows]


def subkeys(conn: Db, project_key: str, session_id: str) -> list[str]:
    """The subpaths (subagent transcripts) written under a session."""
    rows = conn.execute(
        "SELECT subpath FROM claude_sessions WHERE project_key = ? AND session_id = ? "
        "AND subpath <> '' ORDER BY subpath",
        (project_key, session_id),
    ).fetchall()
    return [str(r[0]) for r in rows]


def delete(conn: Db, project_key: str, session_id: str, subpath: str | None) -> None:
    """Forget a transcript; the main one (`subpath` None) with every subpath and summary."""
    where, args = "project_key = ? AND session_id = ?", [project_key, session_id]
    if subpath is not None:
        where, args = where + " AND subpath = ?", [*args, subpath]
    else:
        conn.execute(f"DELETE FROM claude_session_summaries WHERE {where}", tuple(args))
    conn.execute(f"DELETE FROM claude_session_entries WHERE {where}", tuple(args))
    conn.execute(f"DELETE FROM claude_sessions WHERE {where}", tuple(args))


class ClaudeSessions(Methods):
    """The Claude sessions' methods over one store."""

    extension = CLAUDE_SESSIONS
    claude_session_append = writes(append)
    claude_session_load = reads(load)
    claude_session_list = reads(sessions)
    claude_session_summaries = reads(summaries)
    claude_session_subkeys = reads(subkeys)
    claude_session_delete = writes(delete)
