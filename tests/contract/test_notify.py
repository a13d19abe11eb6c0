"""PostgreSQL wakes idle workers of other processes by LISTEN/NOTIFY, not at the next poll."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from tests_contract_support import PG_URL, drop_schema

import perdure

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url() -> Iterator[str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    drop_schema(schema)


def test_a_run_started_elsewhere_wakes_an_idle_worker(pg_url: str) -> None:
    """With a 60 s poll, a run started through another App is picked up within seconds."""
    worker_app = perdure.App(pg_url)
    client_app = perdure.App(pg_url)  # another "process": its own store and connections

    @worker_app.workflow(name="ping")
    async def ping() -> str:
        return "pong"

    client_app.workflow(name="ping")(ping.definition.fn)

    async def main() -> None:
        worker = worker_app.worker(concurrency=2, poll=60.0)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.5)  # the worker is idle, waiting on its 60 s poll
            handle = await client_app.start_async("ping")
            assert await handle.result_async(timeout=10) == "pong"
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    try:
        asyncio.run(main())
    finally:
        worker_app.close()
        client_app.close()


def test_event_sent_elsewhere_resumes_a_waiting_run(pg_url: str) -> None:
    """An event sent through another App wakes the worker holding nothing but a waiting run."""
    worker_app = perdure.App(pg_url)
    client_app = perdure.App(pg_url)

    @worker_app.workflow(name="approval")
    async def approval() -> str:
        return str(await perdure.wait_event("ok"))

    client_app.workflow(name="approval")(approval.definition.fn)

    async def main() -> None:
        worker = worker_app.worker(concurrency=2, poll=60.0)
        task = asyncio.create_task(worker.run())
        try:
            handle = await client_app.start_async("approval", run_id="waits")
            for _ in range(100):
                if await handle.status_async() == "waiting":
                    break
                await asyncio.sleep(0.05)
            await client_app.client.send_event("waits", "ok", "yes")
            assert await handle.result_async(timeout=10) == "yes"
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    try:
        asyncio.run(main())
    finally:
        worker_app.close()
        client_app.close()


def test_store_works_without_session_state(pg_url: str) -> None:
    """Behind a transaction-mode pooler (no prepared statements, no search_path) runs still work."""
    app = perdure.App(f"{pg_url}&pooler=transaction")

    @app.step(effect="transactional")
    def book(n: int) -> int:
        db = perdure.current_step().db
        db.execute("CREATE TABLE IF NOT EXISTS booked (n INTEGER)")  # lands in the app's schema
        db.execute("INSERT INTO booked VALUES (%s)", (n,))
        return n

    @app.workflow(name="pooled")
    async def pooled() -> int:
        total = 0
        for i in range(8):  # past psycopg's prepare threshold
            total += await book(i)
        return total

    from perdure.testing import TestWorker

    try:
        handle = app.start(pooled)
        TestWorker(app).run_until_idle()
        assert handle.result(timeout=10) == 28
        schema = pg_url.rpartition("schema=")[2]
        import psycopg

        with psycopg.connect(PG_URL) as conn:
            count = conn.execute(f'SELECT COUNT(*) FROM "{schema}".booked').fetchone()
        assert count == (8,)
    finally:
        app.close()


def test_a_run_ending_elsewhere_wakes_its_waiters_not_idle_workers(pg_url: str) -> None:
    """A run's end is told to other processes as such: their result waiters wake, their
    idle workers do not claim (it freed nothing a claim counts)."""
    idle_app = perdure.App(pg_url)
    busy_app = perdure.App(pg_url)
    for app in (idle_app, busy_app):

        @app.workflow(name="nap")
        async def nap() -> str:
            await asyncio.sleep(0.5)
            return "rested"

    claims: list[int] = []
    claim = idle_app.runtime.store.claim

    async def counted(*args: object, **kwargs: object) -> object:
        claims.append(1)
        return await claim(*args, **kwargs)  # type: ignore[arg-type]

    idle_app.runtime.store.claim = counted  # type: ignore[method-assign]

    async def main() -> None:
        idle = idle_app.worker(concurrency=2, poll=60.0)
        busy = busy_app.worker(concurrency=2, poll=60.0)
        tasks = [asyncio.create_task(w.run()) for w in (idle, busy)]
        try:
            while not (idle.nothing_runnable() and busy.nothing_runnable()):
                await asyncio.sleep(0.01)
            before = len(claims)
            handle = await busy_app.start_async("nap")  # created claimed by `busy`: no NOTIFY
            waiter = await idle_app.client.get(handle.id)
            assert waiter.lease_owner == busy.id
            assert await idle_app.handle(handle.id).result_async(timeout=10) == "rested"
            await asyncio.sleep(0.3)
            assert len(claims) == before  # the end woke the waiter, not the idle worker
        finally:
            for w in (idle, busy):
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)

    try:
        asyncio.run(main())
    finally:
        idle_app.close()
        busy_app.close()
