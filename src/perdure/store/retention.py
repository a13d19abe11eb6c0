"""Retention SQL: delete finished runs beyond a rule, with their journals, events and blobs.

One call is one batch in one transaction. A run goes together with its whole
subtree of child runs, and only when every run in it is finished (so a reused
id can never meet an old child's outcome); a child goes alone only when its
parent can never run again. A blob goes when nothing left names it. Rows that
another transaction holds are skipped, never waited for (PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from .base import FINISHED, TERMINAL, GcBatch, GcRule
from .blobs import BLOB_KEY, blob_ref
from .dialect import Db

# Written exactly as in the partial indexes of migration 2, so the planners use them.
_FINISHED = "status IN ('completed', 'failed', 'cancelled', 'dead')"
_IS_REF = "LIKE '{\"$perdure_blob%'"
_CHUNK = 500


def _chunks(ids: Sequence[str]) -> Iterator[tuple[Sequence[str], str]]:
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        yield chunk, ",".join("?" * len(chunk))


def gc_batch(
    conn: Db, rule: GcRule, after: tuple[float, str] | None = None, limit: int = 500
) -> GcBatch:
    """Delete up to `limit` finished runs of `rule.workflow` that no part of the rule keeps.

    Candidates are taken oldest first after the `after` cursor; the returned
    cursor is where the next batch starts, None when there are no more.
    """
    where = ["workflow = ?", _FINISHED]
    params: list[Any] = [rule.workflow]
    if rule.keep_since is not None:
        where.append("updated_at < ?")
        params.append(rule.keep_since)
    if rule.keep_last:
        edge = conn.execute(
            f"SELECT updated_at, id FROM runs WHERE workflow = ? AND {_FINISHED} "
            "ORDER BY updated_at DESC, id DESC LIMIT 1 OFFSET ?",
            (rule.workflow, rule.keep_last - 1),
        ).fetchone()
        if edge is None:
            return GcBatch()  # fewer finished runs than it keeps
        where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
        params.extend((edge[0], edge[0], edge[1]))
    if after is not None:
        where.append("(updated_at > ? OR (updated_at = ? AND id > ?))")
        params.extend((after[0], after[0], after[1]))
    params.append(limit)
    candidates = conn.execute(
        f"SELECT id, parent_id, updated_at FROM runs WHERE {' AND '.join(where)} "
        "ORDER BY updated_at, id LIMIT ?",
        params,
    ).fetchall()
    batch = GcBatch()
    if len(candidates) >= limit:
        batch.cursor = (float(candidates[-1][2]), str(candidates[-1][0]))
    doomed: dict[str, None] = {}  # ordered set
    for run_id, parent_id, _ in candidates:
        if run_id in doomed:
            continue  # already going with its parent
        unit = _unit(conn, run_id, parent_id)
        if unit is not None:
            doomed.update(dict.fromkeys(unit))
    if doomed:
        _delete(conn, list(doomed), batch)
    return batch


def _unit(conn: Db, run_id: str, parent_id: str | None) -> list[str] | None:
    """The run and all its descendants, locked, if every one may go now; else None."""
    if parent_id is not None:
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (parent_id,)).fetchone()
        if row is not None and row[0] not in FINISHED:
            return None  # its parent may still run and read this child's outcome
    unit, frontier = {run_id: None}, [run_id]
    while frontier:
        found: list[Any] = []
        for chunk, marks in _chunks(frontier):
            found.extend(
                conn.execute(
                    f"SELECT id, status FROM runs WHERE parent_id IN ({marks})", chunk
                ).fetchall()
            )
        if any(status not in TERMINAL for _, status in found):
            return None  # an unfinished child keeps its whole family
        frontier = [r[0] for r in found if r[0] not in unit]
        unit.update(dict.fromkeys(frontier))
    members = list(unit)
    locked = 0
    for chunk, marks in _chunks(members):
        locked += len(
            conn.execute(
                f"SELECT id FROM runs WHERE id IN ({marks}) AND {_FINISHED}{conn.claim_lock}",
                chunk,
            ).fetchall()
        )
    return members if locked == len(members) else None  # one changed or is held elsewhere


def _delete(conn: Db, ids: Sequence[str], batch: GcBatch) -> None:
    """Delete runs with their events and journals, then the blobs only they named."""
    keys: set[str] = set()
    for chunk, marks in _chunks(ids):
        texts = conn.execute(
            f"SELECT DISTINCT data FROM journal WHERE run_id IN ({marks}) AND data {_IS_REF}",
            chunk,
        ).fetchall()
        texts += conn.execute(
            f"SELECT input FROM runs WHERE id IN ({marks}) AND input {_IS_REF}", chunk
        ).fetchall()
        texts += conn.execute(
            f"SELECT result FROM runs WHERE id IN ({marks}) AND result {_IS_REF}", chunk
        ).fetchall()
        keys.update(key for (text,) in texts if (key := blob_ref(text)) is not None)
        batch.events += conn.execute(
            f"DELETE FROM events WHERE run_id IN ({marks})", chunk
        ).rowcount
        batch.entries += conn.execute(
            f"DELETE FROM journal WHERE run_id IN ({marks})", chunk
        ).rowcount
        conn.execute(f"DELETE FROM run_streams WHERE run_id IN ({marks})", chunk)
        batch.runs += conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", chunk).rowcount
    for key in sorted(keys):
        # A writer naming this blob right now holds its row (its insert is an upsert): skip it.
        held = conn.execute(f"SELECT key FROM blobs WHERE key = ?{conn.claim_lock}", (key,))
        if held.fetchone() and not _referenced(conn, json.dumps({BLOB_KEY: key})):
            batch.blobs += conn.execute("DELETE FROM blobs WHERE key = ?", (key,)).rowcount


def _referenced(conn: Db, ref: str) -> bool:
    """True if any journal entry, run input or run result still holds the reference `ref`."""
    for table, column in (("journal", "data"), ("runs", "input"), ("runs", "result")):
        row = conn.execute(
            f"SELECT 1 FROM {table} WHERE {column} = ? AND {column} {_IS_REF} LIMIT 1", (ref,)
        ).fetchone()
        if row is not None:
            return True
    return False
