"""Child runs: starting them from a workflow, waiting for them, fan-out/fan-in, failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import perdure
from perdure.testing import TestClock, TestWorker


def children_of(app: perdure.App, parent_id: str) -> list[perdure.RunRow]:
    rows = app.runtime.sync(app.runtime.store.list_runs(parent_id=parent_id, limit=1000), "test")
    return sorted(rows, key=lambda r: r.id)


def test_start_child_and_await_its_result(app: perdure.App, worker: TestWorker) -> None:
    """`handle = await child.start(x)` then `await handle.result()` returns the child's result."""

    @app.workflow
    async def double(x: int) -> int:
        return x * 2

    @app.workflow
    async def parent(x: int) -> dict[str, Any]:
        handle = await double.start(x)
        return {"child": handle.id, "value": await handle.result()}

    handle = app.start(parent, 21, run_id="p")
    worker.run_until_idle()
    out = handle.result(timeout=5)
    assert out["value"] == 42
    child = app.get_run(out["child"])
    assert child.parent_id == "p"
    assert child.workflow == double.name
    assert child.status == "completed"


def test_calling_a_workflow_in_a_workflow_starts_and_waits(
    app: perdure.App, worker: TestWorker
) -> None:
    """`await child(x)` inside a workflow is start + wait: it returns the child run's result."""

    @app.workflow
    async def square(x: int) -> int:
        return x * x

    @app.workflow
    async def parent() -> int:
        return await square(7) + await square(2)

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 53
    assert [c.status for c in children_of(app, "p")] == ["completed", "completed"]


def test_sync_parent_with_children(app: perdure.App, worker: TestWorker) -> None:
    """A sync workflow starts children with `.start()` / `()` and gets results without await."""

    @app.workflow
    def inc(x: int) -> int:
        return x + 1

    @app.workflow
    def parent() -> list[int]:
        handle = inc.start(1)
        direct = inc(10)
        return [handle.result(), direct]

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert handle.result(timeout=5) == [2, 11]
    assert len(children_of(app, "p")) == 2


def test_parent_waits_while_child_runs(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A parent whose child is not finished is `waiting` on that child and resumes after it ends."""

    @app.workflow
    async def slow_child() -> str:
        await perdure.sleep(3600)
        return "child done"

    @app.workflow
    async def parent() -> str:
        return "parent got " + await slow_child()

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    (child,) = children_of(app, "p")
    parent_row = app.get_run("p")
    assert child.status == "sleeping"
    assert parent_row.status == "waiting"
    assert parent_row.waiting_for == f"child:{child.id}"
    assert parent_row.lease_owner is None

    clock.advance(3599)
    assert worker.run_until_idle() == 0
    assert handle.status() == "waiting"
    clock.advance(1)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "parent got child done"


def test_fan_out_fan_in(app: perdure.App, clock: TestClock, worker: TestWorker) -> None:
    """A parent starts N children then awaits all results: all N run, results come in order."""
    ran: list[int] = []

    @app.step
    def work(i: int) -> int:
        ran.append(i)
        return i * 10

    @app.workflow
    async def part(i: int) -> int:
        value = await work(i)
        await perdure.sleep(60 * (5 - i))  # children finish in reverse order
        return value

    @app.workflow
    async def fan(n: int) -> list[int]:
        handles = [await part.start(i) for i in range(n)]
        return [await h.result() for h in handles]

    handle = app.start(fan, 5, run_id="fan")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    assert len(children_of(app, "fan")) == 5
    clock.advance(301)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [0, 10, 20, 30, 40]
    assert sorted(ran) == [0, 1, 2, 3, 4]


def test_fan_in_with_gather(app: perdure.App, clock: TestClock, worker: TestWorker) -> None:
    """Child results awaited together with asyncio.gather come back complete and in order."""

    @app.workflow
    async def part(i: int) -> int:
        await perdure.sleep(10 + i)
        return i

    @app.workflow
    async def fan(n: int) -> list[int]:
        handles = [await part.start(i) for i in range(n)]
        return list(await asyncio.gather(*(h.result() for h in handles)))

    handle = app.start(fan, 4, run_id="fan")
    worker.run_until_idle()
    clock.advance(60)
    worker.run_until_idle()
    assert handle.result(timeout=5) == [0, 1, 2, 3]


def test_child_failure_raises_run_failed_in_parent(app: perdure.App, worker: TestWorker) -> None:
    """A failed child raises perdure.RunFailed in the parent, naming the child and its error."""

    @app.workflow
    async def broken() -> None:
        raise ValueError("child exploded")

    @app.workflow
    async def parent() -> dict[str, Any]:
        handle = await broken.start()
        try:
            await handle.result()
        except perdure.RunFailed as exc:
            return {"run_id": exc.run_id, "status": exc.status, "error": exc.error}
        return {}

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    out = handle.result(timeout=5)
    assert out["run_id"] == children_of(app, "p")[0].id
    assert out["status"] == "failed"
    assert "child exploded" in out["error"]


def test_uncaught_child_failure_fails_the_parent(app: perdure.App, worker: TestWorker) -> None:
    """A child failure the parent does not catch fails the parent too."""

    @app.workflow
    def broken() -> None:
        raise RuntimeError("nope")

    @app.workflow
    def parent() -> None:
        broken()

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert info.value.run_id == "p"
    assert info.value.error == "run 'p.0' ended failed: nope"


def test_child_ids_are_parent_id_and_position(app: perdure.App, worker: TestWorker) -> None:
    """Child run ids are deterministic: the parent's id and the call's journal position."""

    @app.workflow
    async def leaf(i: int) -> int:
        return i

    @app.step
    def noop() -> None:
        return None

    @app.workflow
    async def parent() -> list[str]:
        a = await leaf.start(0)  # position 0
        await noop()  # position 1
        b = await leaf.start(1)  # position 2
        return [a.id, b.id]

    handle = app.start(parent, run_id="order-7")
    worker.run_until_idle()
    assert handle.result(timeout=5) == ["order-7.0", "order-7.2"]


def test_child_with_explicit_run_id(app: perdure.App, worker: TestWorker) -> None:
    """`child.start(x, run_id=...)` inside a workflow names the child run as given."""

    @app.workflow
    async def leaf(x: int) -> int:
        return x + 1

    @app.workflow
    async def parent() -> int:
        handle = await leaf.start(1, run_id="my-child")
        return await handle.result()

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 2
    assert app.get_run("my-child").parent_id == "p"


def test_replayed_parent_does_not_start_duplicate_children(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A parent replayed several times starts each child exactly once (one row, one execution)."""
    executions: list[int] = []

    @app.step
    def work(i: int) -> int:
        executions.append(i)
        return i

    @app.workflow
    async def leaf(i: int) -> int:
        return await work(i)

    @app.workflow
    async def parent() -> int:
        first = await leaf.start(1)
        await perdure.sleep(60)  # parent parks and is replayed from the top
        second = await leaf.start(2)
        await perdure.sleep(60)
        return await first.result() + await second.result()

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert [c.id for c in children_of(app, "p")] == ["p.0", "p.2"]
    assert sorted(executions) == [1, 2]
    started = [e for e in app.journal("p") if e.kind == "child.started"]
    assert len(started) == 2


def test_child_result_is_journaled_in_the_parent(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Once a parent has a child's result it replays it from its own journal, not the child row."""

    @app.workflow
    async def leaf() -> str:
        return "v1"

    @app.workflow
    async def parent() -> str:
        value = await leaf()
        await perdure.sleep(60)
        return value

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    results = [e for e in app.journal("p") if e.kind == "child.result"]
    assert len(results) == 1 and results[0].final
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "v1"
    assert len([e for e in app.journal("p") if e.kind == "child.result"]) == 1


def test_cancelled_child_raises_run_failed_in_waiting_parent(
    app: perdure.App, worker: TestWorker
) -> None:
    """Cancelling a child the parent waits on wakes the parent with RunFailed(status=cancelled)."""

    @app.workflow
    async def stuck() -> None:
        await perdure.wait_event("never")

    @app.workflow
    async def parent() -> str:
        try:
            await stuck()
        except perdure.RunFailed as exc:
            return exc.status
        return "no error"

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    (child,) = children_of(app, "p")
    assert app.cancel(child.id) == "cancelled"
    assert handle.status() == "pending"
    worker.run_until_idle()
    assert handle.result(timeout=5) == "cancelled"
