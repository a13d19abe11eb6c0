"""The worker registry on every store: a beat registers or refreshes, stopping is recorded."""

from __future__ import annotations

import asyncio

from perdure.store.base import Store
from perdure.store.workers_sql import WorkerRow


def test_beats_refresh_and_stops_are_kept(store: Store) -> None:
    async def main() -> list[WorkerRow]:
        await store.worker_beat(WorkerRow("h:1:a", "h", 1, 10.0, 10.0, 4, 0))
        await store.worker_beat(WorkerRow("h:1:a", "h", 1, 99.0, 20.0, 4, 3))  # refresh
        await store.worker_beat(WorkerRow("h:2:b", "h", 2, 10.0, 12.0, 8, 1))
        await store.worker_beat(WorkerRow("h:2:b", "h", 2, 10.0, 12.0, 8, 1, stopped_at=15.0))
        await store.worker_beat(WorkerRow("old:3:c", "old", 3, 1.0, 2.0, 1, 0))
        return await store.list_workers(since=10.0)

    rows = {w.id: w for w in asyncio.run(main())}
    assert set(rows) == {"h:1:a", "h:2:b"}  # "old" last lived before `since`
    a = rows["h:1:a"]
    assert (a.started_at, a.heartbeat_at, a.running, a.stopped_at) == (10.0, 20.0, 3, None)
    assert (rows["h:2:b"].stopped_at, rows["h:2:b"].running) == (15.0, 0)


def test_register_refuses_an_id_held_by_a_live_worker(store: Store) -> None:
    """worker_register takes a new id, refuses one held by another worker (returning that
    holder), takes over a holder only while it is the life the caller judged gone, and
    refuses one that beat again since."""

    async def main() -> list[WorkerRow | None]:
        first = await store.worker_register(WorkerRow("w", "h", 1, 10.0, 10.0, 4, 0))
        refused = await store.worker_register(WorkerRow("w", "h", 2, 20.0, 20.0, 8, 0))
        assert refused is not None
        await store.worker_beat(WorkerRow("w", "h", 1, 10.0, 25.0, 4, 0))  # alive after all
        stale = await store.worker_register(
            WorkerRow("w", "h", 2, 20.0, 20.0, 8, 0), replaces=refused
        )
        assert stale is not None
        taken = await store.worker_register(
            WorkerRow("w", "h2", 3, 30.0, 30.0, 2, 0), replaces=stale
        )
        rows = await store.list_workers(since=0.0)
        return [first, refused, stale, taken, *rows]

    first, refused, stale, taken, *rows = asyncio.run(main())
    assert first is None and taken is None
    assert refused is not None and (refused.host, refused.pid, refused.heartbeat_at) == (
        "h", 1, 10.0,
    )  # fmt: skip
    assert stale is not None and (stale.pid, stale.heartbeat_at) == (1, 25.0)
    (row,) = rows
    assert row is not None and (row.host, row.pid, row.started_at, row.concurrency) == (
        "h2",
        3,
        30.0,
        2,
    )
