"""The SQL of run streams: what a run's steps write while they run, in order per run.

Each row has a gap-free `seq` per run. A stream keeps its newest `keep` rows: older ones
are dropped and a `dropped` row says up to which seq, so a reader knows what it missed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .dialect import Db

CHUNK, RETRY, ATTEMPT, DROPPED = "chunk", "retry", "attempt", "dropped"


@dataclass(slots=True)
class StreamRow:
    """One row of a run's stream: a chunk of a topic, or a marker (attempt, retry, dropped)."""

    run_id: str
    seq: int
    kind: str
    topic: str
    data: str | None  # JSON
    at: float


def append(conn: Db, run_id: str, rows: Sequence[tuple[str, str, str | None, float]],
           keep: int) -> int:  # fmt: skip
    """Append (kind, topic, data, at) rows to `run_id`'s stream; the last seq written. Beyond
    `keep` rows the oldest are dropped, and the drop is recorded."""
    first = last(conn, run_id) + 1
    marked: set[str] = set()  # steps with a marker in this batch already
    rows = [_marked(conn, run_id, row, marked) if row[0] == ATTEMPT else row for row in rows]
    conn.executemany(
        "INSERT INTO run_streams (run_id, seq, kind, topic, data, at) VALUES (?, ?, ?, ?, ?, ?)",
        [(run_id, first + i, *row) for i, row in enumerate(rows)],
    )
    newest = first + len(rows) - 1
    oldest = newest - keep + 1
    if oldest > 0:
        cur = conn.execute(
            "DELETE FROM run_streams WHERE run_id = ? AND seq < ? AND kind <> ?",
            (run_id, oldest, DROPPED),
        )
        if cur.rowcount:
            newest += 1
            note = json.dumps({"before": oldest, "rows": cur.rowcount})
            conn.execute(
                "INSERT INTO run_streams (run_id, seq, kind, topic, data, at) "
                "VALUES (?, ?, ?, '', ?, ?)",
                (run_id, newest, DROPPED, note, rows[-1][3]),
            )
    conn.notify()  # readers in other processes wake (PostgreSQL: NOTIFY at commit)
    return newest


def _marked(
    conn: Db, run_id: str, row: tuple[str, str, str | None, float], marked: set[str]
) -> tuple[str, str, str | None, float]:
    """An attempt's marker is a `retry` if its step (the topic names its position) already
    has one in the stream: an earlier attempt, or an execution a crash cut off, wrote there
    first, and a reader drops what it had of that step."""
    seen = (
        row[1] in marked
        or conn.execute(
            "SELECT 1 FROM run_streams WHERE run_id = ? AND topic = ? AND kind IN (?, ?) LIMIT 1",
            (run_id, row[1], ATTEMPT, RETRY),
        ).fetchone()
    )
    marked.add(row[1])
    return (RETRY, *row[1:]) if seen else row


def read(conn: Db, run_id: str, after: int = -1, limit: int = 500) -> list[StreamRow]:
    rows = conn.execute(
        "SELECT run_id, seq, kind, topic, data, at FROM run_streams "
        "WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (run_id, after, limit),
    ).fetchall()
    return [StreamRow(*r) for r in rows]


def last(conn: Db, run_id: str) -> int:
    """The offset of the run's newest stream row (-1: none)."""
    row = conn.execute(
        "SELECT COALESCE(MAX(seq), -1) FROM run_streams WHERE run_id = ?", (run_id,)
    ).fetchone()
    return int(row[0])
