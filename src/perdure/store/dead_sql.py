"""The SQL of dead messages: broker messages that could start no run, kept with the reason."""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import Db


@dataclass(slots=True)
class DeadMessage:
    """A message a trigger could not turn into a run: which trigger, the message's id at its
    source, the source kind, why, the body (cut at the trigger's payload limit) and its size."""

    trigger: str
    message_id: str
    kind: str
    reason: str
    body: str
    size: int
    at: float


def add_dead(conn: Db, row: DeadMessage) -> bool:
    """Keep `row`; False if that message was kept already (a redelivery of a dead message)."""
    cur = conn.execute(
        "INSERT INTO dead_messages (trigger, message_id, kind, reason, body, size, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (trigger, message_id) DO NOTHING",
        (row.trigger, row.message_id, row.kind, row.reason, row.body, row.size, row.at),
    )
    return bool(cur.rowcount)


def list_dead(conn: Db, trigger: str | None = None, limit: int = 100) -> list[DeadMessage]:
    """Dead messages newest first, of one trigger or all."""
    where, args = ("WHERE trigger = ? ", (trigger,)) if trigger is not None else ("", ())
    rows = conn.execute(
        "SELECT trigger, message_id, kind, reason, body, size, at FROM dead_messages "
        f"{where}ORDER BY at DESC, message_id LIMIT ?",
        (*args, limit),
    ).fetchall()
    return [DeadMessage(*row) for row in rows]


def forget_dead(conn: Db, trigger: str, message_id: str) -> bool:
    """Drop one dead message (an operator dealt with it); False if there was none."""
    cur = conn.execute(
        "DELETE FROM dead_messages WHERE trigger = ? AND message_id = ?", (trigger, message_id)
    )
    return bool(cur.rowcount)
