"""`result()` of a run that ends in this process takes its end from the ending write, not
from another read of the store; a row it did not see end is still read."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from step_loops import counting_loop, one_after_another

import perdure
from live_workers import worker_task
from perdure.engine.client import Client
from perdure.store.base import RunRow


def test_result_reads_nothing_after_the_run_ended_here(db_url: str) -> None:
    """Waiting for runs a worker of this process executes: no store read after the end."""
    app = perdure.App(db_url)
    log: list[str] = []

    wf = counting_loop(app)

    async def main() -> list[Any]:
        async with worker_task(app, concurrency=4, poll=0.01, stop_within=30):
            store: Any = app.runtime.store
            get_run, ended = store.get_run, app.runtime.run_ended

            async def counted_get(run_id: str) -> RunRow | None:
                log.append(f"read {run_id}")
                return await get_run(run_id)  # type: ignore[no-any-return]

            def counted_end(row: RunRow) -> None:
                log.append(f"ended {row.id}")
                ended(row)

            store.get_run, app.runtime.run_ended = counted_get, counted_end  # type: ignore[method-assign]
            return await one_after_another(app, wf, 3)

    try:
        assert asyncio.run(main()) == [3] * 5
    finally:
        app.close()
    for i in range(5):
        mine = [line for line in log if line.endswith(f" r{i}")]
        assert f"ended r{i}" in mine
        assert f"read r{i}" not in mine[mine.index(f"ended r{i}") :]


def test_an_older_end_kept_here_is_not_taken_for_a_newer_row(app: perdure.App) -> None:
    """A run that ended here once and was read since (resumed, say) is read again, not
    answered from the end this process kept."""
    client = Client(app)
    now = RunRow(id="r", workflow="wf", status="pending", input="{}", updated_at=20.0)
    app.runtime.run_ended(replace(now, status="failed", updated_at=10.0))
    assert client._known(now) is None
    app.runtime.run_ended(replace(now, status="completed", updated_at=30.0))
    known = client._known(now)
    assert known is not None and known.status == "completed"


def test_ends_kept_here_are_few_and_small(app: perdure.App) -> None:
    """The kept ends are bounded in number, and one with a large result is read instead."""
    from perdure.engine import runtime

    row = RunRow(id="big", workflow="wf", status="completed", input="{}", updated_at=1.0)
    app.runtime.run_ended(replace(row, result='"' + "x" * runtime.ENDED_TEXT + '"'))
    assert "big" not in app.runtime.ended
    for i in range(runtime.ENDED_KEPT + 10):
        app.runtime.run_ended(replace(row, id=f"r{i}", result="1"))
    assert len(app.runtime.ended) == runtime.ENDED_KEPT
    assert "r0" not in app.runtime.ended and f"r{runtime.ENDED_KEPT + 9}" in app.runtime.ended
