"""Runs started beside an idle worker of the same process are created claimed by it: one
transaction, no claim. Never past a runnable run, a pause, a queue limit or a partition.
On SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import perdure
from perdure.store.base import Entry, NewRun, Store


@asynccontextmanager
async def running(
    app: perdure.App, concurrency: int = 2, poll: float = 0.5
) -> AsyncIterator[perdure.Worker]:
    """A worker on this loop, once its first claim found nothing to run."""
    worker = app.worker(concurrency=concurrency, lease=30.0, poll=poll)
    task = asyncio.create_task(worker.run())
    await async_wait(worker.nothing_runnable)
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def async_wait(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    limit = loop.time() + timeout
    while not condition():
        assert loop.time() < limit, "the expected state was not reached in time"
        await asyncio.sleep(0.005)


def _app(store_url: str) -> perdure.App:
    app = perdure.App(store_url)

    @app.step(name="add", effect="keyed")
    def add(i: int) -> int:
        return i + 1

    @app.workflow(name="job")
    async def job(i: int) -> int:
        return await add(i)

    return app


def test_a_run_started_beside_an_idle_worker_is_created_claimed(store_url: str) -> None:
    """The run row is created running under the worker's lease (epoch 1, as a first claim
    leaves it) and already executing when start returns: no claim was made for it."""
    app = _app(store_url)

    async def main() -> None:
        async with running(app) as worker:
            taken: list[str] = []  # runs any claim took (PostgreSQL's NOTIFY of a run's
            claim = app.runtime.store.claim  # end wakes claims that find nothing)

            async def claiming(*args: Any, **kwargs: Any) -> Any:
                claims = await claim(*args, **kwargs)
                taken.extend(c.run.id for c in claims)
                return claims

            app.runtime.store.claim = claiming  # type: ignore[method-assign]
            handle = await app.start_async("job", 1, run_id="r1")
            row = await app.runtime.store.get_run("r1")
            assert row is not None and row.status == "running"
            assert (row.lease_owner, row.lease_epoch, row.recoveries) == (worker.id, 1, 0)
            assert row.started_at is not None
            assert "r1" in worker.tasks
            assert await handle.result_async(10) == 2
            assert taken == [] and worker.claimed == 1  # taken without a claim

    asyncio.run(main())
    assert [e.kind for e in app.journal("r1") if e.kind.startswith("run.recovered")] == []
    app.close()


def test_paused_workflow_queue_limits_and_partitions_leave_the_run_pending(store_url: str) -> None:
    """A run of a paused workflow, of a queue with limits or with a partition key is
    created pending and claimed as usual (the claim counts what these need)."""
    app = _app(store_url)
    app.queue("narrow", concurrency=1)

    @app.workflow(name="other")
    async def other() -> int:
        return 2

    async def main() -> None:
        async with running(app) as worker:
            await app.client.set_pause("workflow", "other", True)
            await async_wait(worker.nothing_runnable)  # it claimed again after the pause
            leases: list[Any] = []
            created: dict[str, Any] = {}  # the row each create wrote, as it answered
            create = app.runtime.store.create_run

            async def creating(new: NewRun) -> Any:
                leases.append(new.lease)
                row, made = await create(new)
                created[new.id] = row
                return row, made

            app.runtime.store.create_run = creating  # type: ignore[method-assign]
            await app.start_async("other", run_id="paused")
            assert leases[0] is not None and leases[0][0] == worker.id  # offered: the store refused
            for run_id, options in (("queued", {"queue": "narrow"}),
                                    ("keyed", {"partition_key": "k"})):  # fmt: skip
                await app.start_async("job", 1, run_id=run_id, **options)  # type: ignore[arg-type]
                # created pending, no lease offered (a read now may find the worker's claim)
                assert leases[-1] is None
                row = created[run_id]
                assert row.status == "pending" and row.lease_epoch == 0
            for run_id in ("queued", "keyed"):
                assert await app.handle(run_id).result_async(10) == 2
            row = await app.runtime.store.get_run("paused")
            assert row is not None and row.status == "pending" and row.lease_owner is None
            await app.client.set_pause("workflow", "other", False)
            assert await app.handle("paused").result_async(10) == 2
            assert worker.claimed == 3

    asyncio.run(main())
    app.close()


def test_a_new_run_never_passes_one_waiting_for_a_slot(store_url: str) -> None:
    """With the worker full, a started run waits pending; one started once the slot is free
    does not go first: the worker's knowledge that nothing else is runnable went with the
    first start, so the second is created pending too and the claim keeps their order."""
    app = perdure.App(store_url)
    gate = threading.Event()
    order: list[str] = []

    @app.step(name="hold", effect="read")
    def hold(tag: str) -> str:
        if tag == "first":
            gate.wait(10)
        order.append(tag)
        return tag

    @app.workflow(name="job")
    async def job(tag: str) -> str:
        return await hold(tag)

    async def main() -> None:
        async with running(app, concurrency=1):
            await app.start_async("job", "first", run_id="first")
            await app.start_async("job", "waiting", run_id="waiting")
            row = await app.runtime.store.get_run("waiting")
            assert row is not None and row.status == "pending"
            gate.set()
            await app.handle("first").result_async(10)
            await app.start_async("job", "later", run_id="later")
            for run_id in ("waiting", "later"):
                await app.handle(run_id).result_async(10)

    asyncio.run(main())
    assert order == ["first", "waiting", "later"]
    app.close()


def test_runs_started_from_another_thread_are_claimed(store_url: str) -> None:
    """Only a start on the worker's own loop is created claimed: the sync facade, on its
    own loop, creates the run pending and the worker claims it."""
    app = _app(store_url)
    ready = threading.Event()
    done = threading.Event()

    async def serve() -> None:
        async with running(app) as worker:
            ready.set()
            await async_wait(done.is_set, 30)
            assert worker.claimed == 1

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    assert ready.wait(10)
    handle = app.start("job", 4, run_id="from-thread")
    assert handle.result(timeout=10) == 5
    done.set()
    thread.join(30)
    app.close()


def test_the_store_creates_claimed_unless_the_worker_or_workflow_is_paused(store: Store) -> None:
    """`create_run` with a lease, on its own: claimed (running, epoch 1, started), or pending
    with no lease when the worker is paused by id or by host, or its workflow is; a second
    create of the same id finds the first and changes nothing."""
    owner = "host-a:123:abc"

    def new(run_id: str, workflow: str = "job") -> NewRun:
        return NewRun(id=run_id, workflow=workflow, input='{"args":[1],"kwargs":{}}',
                      code_version="v", now=100.0, lease=(owner, 130.0))  # fmt: skip

    async def main() -> None:
        row, created = await store.create_run(new("free"))
        assert created and (row.status, row.lease_owner, row.lease_until) == (
            "running",
            owner,
            130.0,
        )
        assert (row.lease_epoch, row.started_at) == (1, 100.0)
        again, created = await store.create_run(new("free"))
        assert not created and again == row
        pauses = [
            ("worker", owner, "by-id", "job"),
            ("worker", "host-a", "by-host", "job"),
            ("workflow", "other", "by-workflow", "other"),
        ]
        for scope, name, run_id, workflow in pauses:
            await store.set_pause(scope, name, True, 100.0)
            row, created = await store.create_run(new(run_id, workflow))
            assert created and (row.status, row.lease_owner, row.lease_until) == (
                "pending",
                None,
                None,
            ), (scope, name)
            assert (row.lease_epoch, row.started_at) == (0, None)
            await store.set_pause(scope, name, False, 100.0)
        plain = NewRun(id="unleased", workflow="job", input="{}", code_version="v", now=1.0)
        row, created = await store.create_run(plain)
        assert created and (row.status, row.lease_owner, row.lease_epoch) == ("pending", None, 0)

    asyncio.run(main())


def test_the_row_a_create_returns_is_the_row_the_store_holds(store: Store) -> None:
    """`create_run` answers with the row it created without reading it back (SQLite), so
    that row must be what a read finds, field for field, for every kind of new run."""
    variants = [
        NewRun(id="bare", workflow="job", input="{}", code_version="", now=1.5),
        NewRun(
            id="full",
            workflow="job",
            input='{"args":[2]}',
            code_version="v7",
            now=2.25,
            parent_id="bare",
            deadline_at=99.125,
            queue="slow",
            priority=-3,
            partition_key="customer-9",
        ),
        NewRun(
            id="claimed",
            workflow="job",
            input="{}",
            code_version="v",
            now=3.0,
            lease=("host-b:9:x", 33.5),
            priority=4,
        ),
        NewRun(
            id="seeded",
            workflow="job",
            input="{}",
            code_version="v",
            now=4.0,
            entries=[Entry(kind="run.origin", data='{"event":"x"}', at=4.0)],
        ),
    ]

    async def main() -> None:
        for new in variants:
            row, created = await store.create_run(new)
            assert created, new.id
            assert row == await store.get_run(new.id), new.id

    asyncio.run(main())


def test_runs_started_one_after_another_are_all_created_claimed(store_url: str) -> None:
    """Each run started right after the previous one's result() finds the worker's slot free:
    the waiter woken by a run's end runs before the worker's task callback that frees the
    slot, so a slot counts free once its task returned. No run needs a claim. (A long poll:
    what a claim found holds until the next poll, and a busy machine may take longer than
    a short one for the twenty runs; past it, a start rightly goes through a claim.)"""
    app = _app(store_url)

    async def main() -> None:
        async with running(app, concurrency=1, poll=60.0):
            taken: list[str] = []
            claim = app.runtime.store.claim

            async def claiming(*args: Any, **kwargs: Any) -> Any:
                claims = await claim(*args, **kwargs)
                taken.extend(c.run.id for c in claims)
                return claims

            app.runtime.store.claim = claiming  # type: ignore[method-assign]
            for i in range(20):
                handle = await app.start_async("job", i, run_id=f"next-{i}")
                assert await handle.result_async(10) == i + 1
            assert taken == []

    asyncio.run(main())
    app.close()
