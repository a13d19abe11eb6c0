"""The sync facade: blocking calls refuse to run inside an event loop; async forms work there."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.testing import TestWorker


@pytest.fixture
def echo(app: perdure.App) -> perdure.Workflow[[int], int]:
    @app.step(name="inc")
    async def inc(x: int) -> int:
        return x + 1

    @app.workflow(name="echo")
    async def echo(x: int) -> int:
        return await inc(x)

    return echo


def in_loop(call: Callable[[], Any]) -> BaseException | None:
    """Make `call` inside a running event loop; return what it raised (None if nothing)."""

    async def main() -> BaseException | None:
        try:
            call()
        except BaseException as exc:
            return exc
        return None

    return asyncio.run(main())


@pytest.mark.timeout(10)
def test_start_in_event_loop_raises_at_once(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """app.start inside a running loop raises SyncInAsyncError immediately, naming the fix."""
    began = time.monotonic()
    error = in_loop(lambda: app.start(echo, 1))
    assert isinstance(error, perdure.SyncInAsyncError)
    assert time.monotonic() - began < 2
    assert "App.start()" in str(error) and "_async" in str(error)
    assert app.list_runs() == [], "nothing was started"


@pytest.mark.timeout(10)
def test_result_in_event_loop_raises_at_once(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """handle.result inside a running loop raises SyncInAsyncError instead of hanging."""
    handle = app.start(echo, 1)
    error = in_loop(lambda: handle.result())
    assert isinstance(error, perdure.SyncInAsyncError)
    assert "RunHandle.result()" in str(error)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "call",
    [
        lambda app, h: app.get_run(h.id),
        lambda app, h: app.journal(h.id),
        lambda app, h: app.list_runs(),
        lambda app, h: app.cancel(h.id),
        lambda app, h: app.fork(h.id, from_step=0),
        lambda app, h: h.status(),
        lambda app, h: TestWorker(app).run_until_idle(),
    ],
    ids=["get_run", "journal", "list_runs", "cancel", "fork", "status", "run_until_idle"],
)
def test_every_blocking_call_refuses_event_loop(
    app: perdure.App, echo: perdure.Workflow[[int], int], call: Callable[..., Any]
) -> None:
    """Each blocking facade call raises SyncInAsyncError inside a running loop."""
    handle = app.start(echo, 1)
    assert isinstance(in_loop(lambda: call(app, handle)), perdure.SyncInAsyncError)
    assert handle.status() == "pending", "the refused call changed nothing"


@pytest.mark.timeout(10)
def test_refused_call_leaves_no_unawaited_coroutine(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """A refused call closes its coroutine, so no 'never awaited' warning is emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        in_loop(lambda: app.start(echo, 1))
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]


@pytest.mark.timeout(10)
def test_async_forms_work_in_event_loop(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """start_async, run_until_idle_async, status_async and result_async work inside a loop."""

    async def main() -> tuple[str, str, int]:
        handle = await app.start_async(echo, 41)
        before = await handle.status_async()
        await TestWorker(app).run_until_idle_async()
        return before, await handle.status_async(), await handle.result_async(timeout=5)

    assert asyncio.run(main()) == ("pending", "completed", 42)


@pytest.mark.timeout(10)
def test_result_async_waits_for_worker(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """result_async waits while a worker in the same loop finishes the run."""

    async def main() -> int:
        handle = await app.start_async(echo, 1, run_id="waited")
        waiter = asyncio.create_task(handle.result_async(timeout=5))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await TestWorker(app).run_until_idle_async()
        return await waiter

    assert asyncio.run(main()) == 2


@pytest.mark.timeout(10)
def test_sync_facade_from_thread_inside_async_code(
    app: perdure.App, echo: perdure.Workflow[[int], int]
) -> None:
    """Async code may use the sync facade through asyncio.to_thread."""

    async def main() -> str:
        handle = await asyncio.to_thread(app.start, echo, 1)
        return await asyncio.to_thread(handle.status)

    assert asyncio.run(main()) == "pending"


@pytest.mark.timeout(10)
def test_blocking_call_in_async_workflow_fails_run(app: perdure.App, worker: TestWorker) -> None:
    """An async workflow calling the blocking facade fails its run, not freezing the worker."""

    @app.workflow(name="misuse")
    async def misuse() -> str:
        return app.get_run("anything").status

    handle = app.start(misuse)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed"
    assert json.loads(run.error or "{}")["type"].endswith("SyncInAsyncError")


@pytest.mark.timeout(10)
def test_result_timeout(app: perdure.App, echo: perdure.Workflow[[int], int]) -> None:
    """result(timeout=...) on a run nobody executes raises WaitTimeout after about that long."""
    handle = app.start(echo, 1)
    began = time.monotonic()
    with pytest.raises(perdure.WaitTimeout, match=handle.id):
        handle.result(timeout=0.1)
    assert 0.05 < time.monotonic() - began < 2


@pytest.mark.timeout(10)
def test_result_async_timeout(app: perdure.App, echo: perdure.Workflow[[int], int]) -> None:
    """result_async(timeout=...) raises WaitTimeout too."""

    async def main() -> None:
        handle = await app.start_async(echo, 1)
        await handle.result_async(timeout=0.05)

    with pytest.raises(perdure.WaitTimeout):
        asyncio.run(main())
