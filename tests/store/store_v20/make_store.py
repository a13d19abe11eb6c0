"""How `store.db` was made: run with perdure at 6c846c3 (the last schema before each
extension kept its own tables), `PYTHONPATH=<that checkout>/src python make_store.py`.

It writes one row (or a few) into every table through that code's own store methods, so the
upgrade test (tests/store/test_extension_upgrade.py) opens a store exactly as it left one.
Kept for the record: the methods it calls have since moved to the extensions.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

from perdure.store.access_sql import TokenRow  # noqa: F401  (the old layout: fails on new code)
from perdure.store.agent_sql import Budget, Limit, Reservation, SharedBudget, UsageRow
from perdure.store.changes_sql import TableTrigger
from perdure.store.dead_sql import DeadMessage

from perdure.store import SQLiteStore
from perdure.store.base import Entry, NewRun, ScheduleAdvance, ScheduleRow, TickRow
from perdure.store.workers_sql import WorkerRow

NOW = 1_700_000_000.0


async def fill(store: SQLiteStore) -> None:
    await store.create_run(
        NewRun(
            "run-1",
            "wf",
            '{"args":[],"kwargs":{}}',
            "v1",
            NOW,
            entries=[Entry(kind="run.started", at=NOW)],
        )
    )
    await store.send_event("run-1", "go", '"x"', NOW, key="k1")
    await store.set_pause("workflow", "paused_wf", True, NOW)
    await store.append_stream("run-1", [("token", "0", '"hi"', NOW)], keep=100)
    await store.worker_beat(WorkerRow("w1", "host", 1, NOW, NOW, 4, 0))
    # schedules
    await store.put_schedule(
        ScheduleRow(
            "nightly", "wf", cron="0 3 * * *", next_fire=NOW, created_at=NOW, updated_at=NOW
        ),
        replace_state=True,
    )
    await store.advance_schedule(
        ScheduleAdvance(
            "nightly",
            NOW,
            NOW + 86400,
            NOW,
            ticks=[TickRow("nightly", NOW, "skipped", reason="overlap", at=NOW)],
        )
    )
    # budgets and memory
    await store.record_usage(UsageRow("run-1", 3, "helper", "m", 100, 20, 0.5, NOW, pool="team"))
    await store.put_budget(Budget("helper", tokens_per_day=1000), NOW)
    await store.put_shared_budget(SharedBudget("team", cost_per_day=5.0), NOW)
    await store.declare_agent("helper", '{"tokens_per_day": 1000}', NOW)
    held = Reservation("run-1", 5, 0, "helper", "main", "m", 50, 0.1, "open", NOW, "team")
    assert await store.reserve(held, [Limit("this day", 86400.0, tokens=1000)], NOW) is None
    parked = Reservation("run-2", 1, 0, "helper", "main", "m", 5000, 1.0, "open", NOW)
    assert await store.reserve(parked, [Limit("this day", 86400.0, tokens=1000)], NOW)
    await store.remember("helper", "the customer prefers email", "contact", "run-1", NOW)
    await store.add_note("helper", "called the customer", "run-1", NOW)
    # access
    await store.add_token("t1", "ops", "digest-1", "read operate", NOW)
    await store.add_session("sdigest-1", "t1", NOW, NOW - 86400)
    await store.audit(NOW, "token:ops", "run.cancel", "run:run-1", "{}", "refused", "finished")
    # dead messages, agent sessions
    await store.add_dead_message(DeadMessage("inbox", "m-1", "kafka", "not JSON", "{", 1, NOW))
    await store.agent_session_add("conv-1", ['{"role": "user", "content": "hi"}'], NOW)
    # table changes: a user's table in the store's file with its trigger, one change pending
    await store.install_table_trigger(TableTrigger("orders", "orders", ("insert",)))


def main(path: Path) -> None:
    path.unlink(missing_ok=True)
    store = SQLiteStore(str(path))
    store.start()
    store.stop()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
    conn.commit()
    conn.close()
    store = SQLiteStore(str(path))
    store.start()
    try:
        asyncio.run(fill(store))
    finally:
        store.stop()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")  # the trigger records it
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("PRAGMA page_size = 1024")  # a small file to check in
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("store.db"))
