"""A run alone in its process does its store work on the caller's thread (no hand-offs to the
store thread and back), and a `:memory:` store, which has no second connection, still works."""

from __future__ import annotations

import asyncio
from pathlib import Path

import perdure
from perdure.engine.signal import Signal
from perdure.store.threaded import ThreadedStore


def _app(url: str) -> tuple[perdure.App, object]:
    app = perdure.App(url)

    @app.step(effect="once")
    def work(i: int) -> int:
        return i * 2

    @app.workflow(name="five")
    async def five(n: int) -> int:
        total = 0
        for i in range(5):
            total += await work(i)
        return total + n

    return app, five


async def _runs(app: perdure.App, workflow: object, count: int) -> list[int]:
    worker = app.worker(concurrency=1, lease=30.0, poll=0.01)
    task = asyncio.create_task(worker.run())
    try:
        await (await app.start_async(workflow, 0, run_id="warm")).result_async(30)
        store = app.runtime.store
        assert isinstance(store, ThreadedStore)
        queued = store._enqueued
        results = []
        for i in range(count):
            handle = await app.start_async(workflow, i, run_id=f"r{i}")
            results.append(await handle.result_async(30))
        # start, claim, steps, completion and result reads all ran inline; a presence
        # beat or a peers check may still have been queued meanwhile
        assert store._enqueued - queued <= 3, store._enqueued - queued
        return results
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


def test_a_lone_run_does_its_store_work_on_the_callers_thread(tmp_path: Path) -> None:
    app, five = _app(f"sqlite:///{tmp_path}/s.db")
    try:
        assert asyncio.run(_runs(app, five, 5)) == [20 + i for i in range(5)]
    finally:
        app.close()


def test_a_memory_store_runs_everything_on_its_thread() -> None:
    app, five = _app("sqlite:///:memory:")

    async def main() -> int:
        worker = app.worker(concurrency=1, lease=30.0, poll=0.01)
        task = asyncio.create_task(worker.run())
        try:
            result: int = await (await app.start_async(five, 1)).result_async(30)
            return result
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)

    try:
        assert asyncio.run(main()) == 21
    finally:
        app.close()


def test_a_signal_fired_on_its_own_loop_is_set_at_once() -> None:
    """No round trip through the loop's self-pipe: the waiter sees it before the next turn."""

    async def main() -> bool:
        signal = Signal()
        flag = signal.listen()
        signal.fire()
        return flag.raised

    assert asyncio.run(main())
