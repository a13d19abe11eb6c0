"""Agents' long-term memory and progress notes, a store extension: their tables, SQL and
methods (`AgentMemory(store)`).

Memory search is full-text: FTS5 on SQLite, a generated tsvector on PostgreSQL; a query
matches any of its words. Notes are a few lines per agent, kept under a row lock so runs
finishing at once each keep theirs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

MEMORY = Extension(
    "memory",
    [
        # 1: long-term memory with full-text search (FTS5 on SQLite, a tsvector on
        # PostgreSQL) and progress notes
        """
        CREATE TABLE agent_memory (
            id      INTEGER PRIMARY KEY AUTOINCREMENT,
            agent   TEXT NOT NULL,
            text    TEXT NOT NULL,
            tags    TEXT NOT NULL DEFAULT '',
            run_id  TEXT,
            at      REAL NOT NULL
        );
        CREATE INDEX agent_memory_by_agent ON agent_memory (agent, id);
        /*sqlite*/ CREATE VIRTUAL TABLE agent_memory_fts
            USING fts5(text, tags, agent UNINDEXED, memory_id UNINDEXED);
        /*postgres*/ ALTER TABLE agent_memory ADD COLUMN tsv tsvector
            GENERATED ALWAYS AS (to_tsvector('simple', text || ' ' || tags)) STORED;
        /*postgres*/ CREATE INDEX agent_memory_search ON agent_memory USING gin (tsv);
        CREATE TABLE agent_notes (
            agent   TEXT PRIMARY KEY,
            notes   TEXT NOT NULL,
            run_id  TEXT,
            at      REAL NOT NULL
        )
        """,
    ],
    tables=("agent_memory", "agent_notes"),  # agent_memory_fts: SQLite's only
    legacy=(5,),  # made by the core's script 5 before
    at_open=True,
)


@dataclass(slots=True)
class MemoryRow:
    """A long-term memory entry of an agent, with the run that wrote it."""

    id: int
    agent: str
    text: str
    tags: str
    run_id: str | None
    at: float


def remember(conn: Db, agent: str, text: str, tags: str, run_id: str | None, now: float) -> int:
    row = conn.execute(
        "INSERT INTO agent_memory (agent, text, tags, run_id, at) VALUES (?, ?, ?, ?, ?) "
        "RETURNING id",
        (agent, text, tags, run_id, now),
    ).fetchone()
    memory_id = int(row[0])
    if conn.dialect == "sqlite":
        conn.execute(
            "INSERT INTO agent_memory_fts (text, tags, agent, memory_id) VALUES (?, ?, ?, ?)",
            (text, tags, agent, memory_id),
        )
    return memory_id


_WORD = re.compile(r"\w+", re.UNICODE)


def recall(conn: Db, agent: str, query: str, limit: int) -> list[MemoryRow]:
    """The agent's entries matching any word of `query`, best first; newest first if none."""
    words = [w.lower() for w in _WORD.findall(query)][:32]
    columns = "m.id, m.agent, m.text, m.tags, m.run_id, m.at"
    rows: list[Any]
    if not words:
        rows = conn.execute(
            f"SELECT {columns} FROM agent_memory m WHERE m.agent = ? ORDER BY m.id DESC LIMIT ?",
            (agent, limit),
        ).fetchall()
    elif conn.dialect == "sqlite":
        match = " OR ".join(f'"{w}"' for w in words)
        rows = conn.execute(
            f"SELECT {columns} FROM agent_memory_fts f JOIN agent_memory m ON m.id = f.memory_id "
            "WHERE agent_memory_fts MATCH ? AND f.agent = ? ORDER BY f.rank LIMIT ?",
            (match, agent, limit),
        ).fetchall()
    else:
        tsquery = " | ".join(words)
        rows = conn.execute(
            f"SELECT {columns} FROM agent_memory m WHERE m.agent = ? "
            "AND m.tsv @@ to_tsquery('simple', ?) "
            "ORDER BY ts_rank(m.tsv, to_tsquery('simple', ?)) DESC, m.id DESC LIMIT ?",
            (agent, tsquery, tsquery, limit),
        ).fetchall()
    return [MemoryRow(int(r[0]), r[1], r[2], r[3], r[4], float(r[5])) for r in rows]


def get_notes(conn: Db, agent: str) -> str:
    row = conn.execute("SELECT notes FROM agent_notes WHERE agent = ?", (agent,)).fetchone()
    return str(row[0]) if row else ""


def add_note(
    conn: Db, agent: str, line: str, run_id: str | None, now: float, keep: int = 50
) -> str:
    """Append one line to an agent's progress notes under a row lock, so runs finishing at
    once each keep theirs; a line already there (a step run again) is not added twice.
    Only the last `keep` lines stay. Returns the notes after."""
    conn.execute(
        "INSERT INTO agent_notes (agent, notes, run_id, at) VALUES (?, '', ?, ?) "
        "ON CONFLICT (agent) DO NOTHING",
        (agent, run_id, now),
    )
    lock = " FOR UPDATE" if conn.dialect == "postgres" else ""  # SQLite writes one at a time
    row = conn.execute(f"SELECT notes FROM agent_notes WHERE agent = ?{lock}", (agent,)).fetchone()
    lines = [x for x in str(row[0]).splitlines() if x.strip()]
    if line not in lines:
        lines = [*lines, line][-keep:]
        conn.execute(
            "UPDATE agent_notes SET notes = ?, run_id = ?, at = ? WHERE agent = ?",
            ("\n".join(lines), run_id, now, agent),
        )
    return "\n".join(lines)


def put_notes(conn: Db, agent: str, notes: str, run_id: str | None, now: float) -> None:
    conn.execute(
        "INSERT INTO agent_notes (agent, notes, run_id, at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (agent) DO UPDATE SET notes = excluded.notes, run_id = excluded.run_id, "
        "at = excluded.at",
        (agent, notes, run_id, now),
    )


class AgentMemory(Methods):
    """Agents' long-term memory and progress notes over one store."""

    extension = MEMORY
    remember = writes(remember)
    recall = reads(recall)
    get_notes = reads(get_notes)
    put_notes = writes(put_notes)
    add_note = writes(add_note)
