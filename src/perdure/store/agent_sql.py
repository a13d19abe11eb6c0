"""The SQL of agents' durable state: model usage, budgets, long-term memory, progress notes.

Usage rows are keyed by (run, journal position), so recording a model call's
usage again after a crash changes nothing. Memory search is full-text: FTS5 on
SQLite, a generated tsvector on PostgreSQL; a query matches any of its words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .dialect import Db
from .names import check


@dataclass(slots=True)
class UsageRow:
    """One model call's tokens and cost."""

    run_id: str
    position: int
    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float
    at: float


@dataclass(slots=True)
class Budget:
    """An agent's spending limits per rolling window (None: no limit)."""

    agent: str
    tokens_per_hour: int | None = None
    tokens_per_day: int | None = None
    cost_per_hour: float | None = None
    cost_per_day: float | None = None


@dataclass(slots=True)
class MemoryRow:
    """A long-term memory entry of an agent, with the run that wrote it."""

    id: int
    agent: str
    text: str
    tags: str
    run_id: str | None
    at: float


def record_usage(conn: Db, u: UsageRow) -> bool:
    """Record a call's usage once; False if this (run, position) was already recorded."""
    cur = conn.execute(
        "INSERT INTO agent_usage (run_id, position, agent, model, input_tokens, output_tokens, "
        "cost, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, position) DO NOTHING",
        (u.run_id, u.position, u.agent, u.model, u.input_tokens, u.output_tokens, u.cost, u.at),
    )
    return cur.rowcount == 1


def spent(conn: Db, agent: str, since: float) -> tuple[int, float]:
    """Tokens and cost an agent spent since `since`."""
    row = conn.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0) "
        "FROM agent_usage WHERE agent = ? AND at >= ?",
        (agent, since),
    ).fetchone()
    return int(row[0]), float(row[1])


def run_spent(conn: Db, run_id: str) -> tuple[int, float]:
    row = conn.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0) "
        "FROM agent_usage WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    return int(row[0]), float(row[1])


def usage(conn: Db, agent: str | None, since: float) -> list[UsageRow]:
    where, params = "at >= ?", [since]
    if agent is not None:
        where += " AND agent = ?"
        params.append(agent)  # type: ignore[arg-type]
    rows = conn.execute(
        "SELECT run_id, position, agent, model, input_tokens, output_tokens, cost, at "
        f"FROM agent_usage WHERE {where} ORDER BY at, run_id, position",
        params,
    ).fetchall()
    return [UsageRow(*r) for r in rows]


def get_budget(conn: Db, agent: str) -> Budget | None:
    row = conn.execute(
        "SELECT agent, tokens_per_hour, tokens_per_day, cost_per_hour, cost_per_day "
        "FROM agent_budgets WHERE agent = ?",
        (agent,),
    ).fetchone()
    return Budget(*row) if row else None


def put_budget(conn: Db, b: Budget, now: float) -> None:
    check(b.agent, "agent name")
    conn.execute(
        "INSERT INTO agent_budgets (agent, tokens_per_hour, tokens_per_day, cost_per_hour, "
        "cost_per_day, updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent) DO UPDATE SET "
        "tokens_per_hour = excluded.tokens_per_hour, tokens_per_day = excluded.tokens_per_day, "
        "cost_per_hour = excluded.cost_per_hour, cost_per_day = excluded.cost_per_day, "
        "updated_at = excluded.updated_at",
        (b.agent, b.tokens_per_hour, b.tokens_per_day, b.cost_per_hour, b.cost_per_day, now),
    )
    conn.notify()


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


def add_note(conn: Db, agent: str, line: str, run_id: str | None, now: float, keep: int) -> str:
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
