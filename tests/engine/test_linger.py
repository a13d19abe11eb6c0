"""A buffered entry waits at most LINGER for a commit: an outcome is on disk soon after its
step returned even when the workflow then waits for something that writes nothing."""

from __future__ import annotations

import asyncio
import threading

import pytest

import perdure
from waits import wait_for


@pytest.mark.parametrize("effect", ["once", "keyed"])
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_an_outcome_reaches_disk_while_the_workflow_goes_quiet(
    db_url: str, effect: str, kind: str
) -> None:
    """A step returns, then the workflow waits (not journaled) until another process has
    read the step's outcome from the store: no later write brings it there, the linger
    does (without it the wait never ends and the test times out)."""
    app = perdure.App(db_url)
    reader = perdure.App(db_url)
    seen = threading.Event()

    @app.step(effect=effect, name="pay")  # type: ignore[call-overload]
    def pay() -> str:
        return "paid"

    if kind == "async":

        @app.workflow(name="quiet")
        async def quiet() -> str:
            paid: str = await pay()
            while not seen.is_set():  # nothing journaled meanwhile
                await asyncio.sleep(0.01)
            return paid

    else:

        @app.workflow(name="quiet")
        def quiet_sync() -> str:
            paid: str = pay()
            seen.wait(30)
            return paid

    def outcome_on_disk() -> bool:
        return any(e.kind == "step.outcome" for e in reader.journal("q"))

    async def main() -> str:
        worker = app.worker(concurrency=1, lease=30.0, poll=0.02)
        running = asyncio.create_task(worker.run())
        try:
            handle = await app.start_async("quiet", run_id="q")
            await asyncio.to_thread(wait_for, "the outcome on disk", outcome_on_disk, None, 10.0)
            seen.set()
            return str(await handle.result_async(10))
        finally:
            seen.set()
            worker.stop()
            await asyncio.wait_for(running, 10)
            await app.runtime.store.close()

    try:
        assert asyncio.run(main()) == "paid"
    finally:
        reader.close()
