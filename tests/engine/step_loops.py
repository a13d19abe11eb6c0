"""Workflows the engine tests count things with: `n` step calls one after another."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import perdure


def loop_workflow(
    app: perdure.App, step: Callable[[int], Awaitable[int]]
) -> perdure.Workflow[..., int]:
    """The workflow `wf(n)`: awaits `step(i)` for i in range(n), one after another; returns n."""

    @app.workflow
    async def wf(n: int) -> int:
        for i in range(n):
            await step(i)
        return n

    return wf


def counting_loop(app: perdure.App) -> perdure.Workflow[..., int]:
    """`loop_workflow` over a keyed step `work(i)` that returns i."""

    @app.step(effect="keyed")
    def work(i: int) -> int:
        return i

    return loop_workflow(app, work)


async def one_after_another(app: perdure.App, wf: perdure.Workflow[..., int], n: int) -> list[int]:
    """Start runs r0..r4 of `wf(n)`, each once the one before has ended; their results."""
    results = []
    for i in range(5):
        handle = await app.start_async(wf, n, run_id=f"r{i}")
        results.append(await handle.result_async(30))
    return results
