"""The table-change outbox every store keeps: triggers record committed changes only, and
stores racing to take them start each change's run exactly once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any

from tests_contract_support import PG_URL

from perdure.store.base import NewRun, Store
from perdure.triggers.changes_sql import ChangeRow, Outbox, TableTrigger

CHANGES = 300


def user_connection(store_url: str) -> tuple[Any, str]:
    """A connection of the user's own to the store's database, and the table's name there."""
    if store_url.startswith("sqlite"):
        return sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None), "orders"
    import psycopg

    schema = store_url.rpartition("schema=")[2]
    return psycopg.connect(PG_URL, autocommit=True), f"{schema}.orders"


def build(change: ChangeRow) -> NewRun:
    return NewRun(id=f"table:t:{change.id}", workflow="w", input='{"args":[],"kwargs":{}}',
                  code_version="", now=0.0)  # fmt: skip


def test_racing_stores_start_each_committed_change_once(
    new_store: Callable[[], Store], store_url: str
) -> None:
    """Two stores (as two workers) take the same outbox at once: every committed insert
    has one run, rolled-back ones none, and the outbox ends empty."""
    first, second = new_store(), new_store()

    async def scenario() -> tuple[int, list[str]]:
        outbox = Outbox(first)
        await first.open()
        await second.open()
        conn, table = user_connection(store_url)
        with closing(conn):
            conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, item TEXT)")
            trigger = TableTrigger("t", table, ("insert",))
            assert await outbox.install_table_trigger(trigger) is True
            assert await Outbox(second).install_table_trigger(trigger) is False
            for i in range(CHANGES):
                conn.execute("BEGIN")
                conn.execute(f"INSERT INTO {table} (id, item) VALUES ({i}, 'x')")
                conn.execute("ROLLBACK" if i % 3 == 2 else "COMMIT")
        started = 0
        while True:
            taken = await asyncio.gather(
                *(Outbox(s).take_changes("t", 25, build, 0.0) for s in [first, second] * 2)
            )
            started += sum(t.started for t in taken)
            if not any(t.started for t in taken):
                break
        runs = await first.list_runs(limit=10_000)
        assert await outbox.change_counts("t") == (0, None, 0, None)
        assert await outbox.has_changes("t") is False
        return started, [r.id for r in runs]

    started, ids = asyncio.run(scenario())
    committed = CHANGES - CHANGES // 3
    assert started == committed
    assert len(ids) == len(set(ids)) == committed
