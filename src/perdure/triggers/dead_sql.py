"""The dead messages' store extension: broker messages that could start no run, kept with
the reason once per (trigger, message id); their table, SQL and methods
(`DeadMessages(store)`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes

DEAD = Extension(
    "dead_messages",
    [
        # 1 (brokers): a broker message that can start no run (not JSON, refused by the
        # workflow's input check, over the payload limit), kept with the reason once per
        # (trigger, message id) and acknowledged, so the broker stops redelivering it
        """
        CREATE TABLE dead_messages (
            trigger     TEXT NOT NULL,
            message_id  TEXT NOT NULL,
            kind        TEXT NOT NULL,
            reason      TEXT NOT NULL,
            body        TEXT NOT NULL,
            size        INTEGER NOT NULL,
            at          REAL NOT NULL,
            PRIMARY KEY (trigger, message_id)
        );
        CREATE INDEX dead_messages_by_at ON dead_messages (at)
        """,
    ],
    tables=("dead_messages",),
    legacy=(17,),  # made by the core's script 17 before
    at_open=True,
)


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


class DeadMessages(Methods):
    """The dead messages' methods over one store."""

    extension = DEAD
    add_dead_message = writes(add_dead)
    dead_messages = reads(list_dead)
    forget_dead_message = writes(forget_dead)
