"""An app whose one workflow runs a step of HELD_STEP seconds (66 by default), started
by its inbox on HELD_INBOX, by `app.start` and by the CLI (tests/engine/test_long_steps.py)."""

from __future__ import annotations

import asyncio
import os

import perdure

app = perdure.App(os.environ["PERDURE_DB"])


@app.step(effect="keyed", name="held.step")
async def step(x: str) -> str:
    await asyncio.sleep(float(os.environ.get("HELD_STEP", "66")))
    return x


@app.workflow(name="held")
async def held(x: str) -> str:
    return await step(x)


app.inbox(os.environ["HELD_INBOX"], held, stable=0)
