"""A step's route stays short enough to read: one `once` step, warm and on its first call, on
both stores and from async and sync workflows, touches at most ROUTE_LIMIT of perdure's own
functions (counted with a profile hook, from the step call to its return)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import perdure
from fresh_stores import fresh_store_url
from perdure.engine import context, pace, steps

ROUTE_LIMIT = 40
SOURCE = str(Path(perdure.__file__).parent)
STEPS = 12  # the first is the first call; the body is learned short after pace.LEARN


class RouteTrace:
    """Perdure's functions called for one step call: on the run's own task (an async
    workflow's), on the workflow's own thread (a sync one's), and on the step pool."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None  # the run's task, while tracing
        self.thread: int | None = None  # the sync workflow's thread, while tracing
        self.seen: set[tuple[str, int, str]] = set()
        self.traces: dict[str, set[tuple[str, int, str]]] = {}

    def start(self) -> None:
        self.seen = set()
        if threading.current_thread().name.startswith("perdure-wf"):
            self.thread = threading.get_ident()
        else:
            self.task = asyncio.current_task()

    def stop(self, name: str) -> None:
        self.traces[name], self.task, self.thread = self.seen, None, None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (self.task is None and self.thread is None):
            return
        code = frame.f_code
        if not code.co_filename.startswith(SOURCE) or not self._ours():
            return
        self.seen.add((code.co_filename.removeprefix(SOURCE), code.co_firstlineno, code.co_name))

    def _ours(self) -> bool:
        ident = threading.get_ident()
        if ident == self.thread or threading.current_thread().name.startswith("perdure-step"):
            return True
        if self.task is None or asyncio._get_running_loop() is None:
            return False
        return asyncio.current_task() is self.task


@pytest.fixture
def tracer(monkeypatch: pytest.MonkeyPatch) -> Iterator[RouteTrace]:
    """A profile hook on every thread, for the test's duration (which slows every body: how
    a body's pace is learned must not depend on it)."""
    monkeypatch.setattr(pace, "SHORT", 10.0)
    monkeypatch.setattr(pace, "SLOW", 10.0)
    # a body slowed past LINGER has its outcome committed before the step returns: another
    # write, not the step's own route (and the time it takes is the machine's, not the code's)
    monkeypatch.setattr(steps, "LINGER", 60.0)
    monkeypatch.setattr(context, "LINGER", 60.0)
    trace = RouteTrace()
    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        yield trace
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _app_with_steps(url: str, trace: RouteTrace, sync: bool) -> tuple[perdure.App, Any]:
    app = perdure.App(url)

    @app.step(effect="once")
    def charge(i: int) -> int:
        return i + 1

    def traced(i: int) -> bool:
        return i in (0, STEPS - 2)

    if sync:

        @app.workflow(name="route")
        def route_sync(n: int) -> int:
            total = 0
            for i in range(n):
                if traced(i):
                    trace.start()
                total += charge(i)
                if traced(i):
                    trace.stop("first" if i == 0 else "warm")
            return total

        return app, route_sync

    @app.workflow(name="route")
    async def route(n: int) -> int:
        total = 0
        for i in range(n):
            if traced(i):
                trace.start()
            total += await charge(i)
            if traced(i):
                trace.stop("first" if i == 0 else "warm")
        return total

    return app, route


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_once_step_touches_few_functions(
    kind: str, sync: bool, tracer: RouteTrace, tmp_path: Path
) -> None:
    """The warm step and the first call (its body on the step pool) each touch at most
    ROUTE_LIMIT distinct functions of perdure; the warm one commits its intent and runs its
    body without the pool."""

    async def main(url: str) -> int:
        app, route = _app_with_steps(url, tracer, sync)
        worker = app.worker(concurrency=1, lease=30.0, poll=0.05)
        running = asyncio.create_task(worker.run())
        try:
            handle = await app.start_async(route, STEPS, run_id="route")
            return int(await handle.result_async(60))
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)
            await app.runtime.store.close()

    with fresh_store_url(kind, tmp_path) as url:
        assert asyncio.run(main(url)) == sum(range(1, STEPS + 1))
    first, warm = tracer.traces["first"], tracer.traces["warm"]
    named = " ".join(sorted(f"{path}:{name}" for path, _, name in first | warm))
    assert len(warm) <= ROUTE_LIMIT, " ".join(sorted(f"{p}:{n}" for p, _, n in warm))
    assert len(first) <= ROUTE_LIMIT, " ".join(sorted(f"{p}:{n}" for p, _, n in first))
    steps = {name for path, _, name in first | warm if path == "/engine/steps.py"}
    assert "_attempt" in steps
    assert not sync or "_execute" not in steps, named  # a sync workflow's own thread
    pooled = {name for path, _, name in first if path == "/engine/pace.py"}
    assert sync or "timed" in pooled  # the first call: its body on the step pool
    assert sync or not any(path == "/engine/pace.py" for path, _, _ in warm)  # learned
