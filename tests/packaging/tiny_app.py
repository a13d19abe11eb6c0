"""A tiny app the packaging tests run on a bare or fresh install: two steps and a durable sleep.

Its store comes from PERDURE_DB (or --db), set by the test.
"""

from __future__ import annotations

import perdure

app = perdure.App()


@app.step(effect="read")
def double(x: int) -> int:
    return 2 * x


@app.workflow()
async def twice(x: int) -> dict[str, int]:
    once = await double(x)
    await perdure.sleep(0.2)  # a timer: the worker's timer loop wakes the run
    return {"x": x, "result": await double(once)}
