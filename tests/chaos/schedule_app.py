"""The app the real-time schedule test runs in several worker processes.

Run as `python -m perdure --app schedule_app:app worker ...` from this directory, with
`PERDURE_DB` naming the store and `SCHEDULE_LEDGER` a file outside the store.

The schedule `tick` fires every second. Each run executes one idempotent step that
appends one line to the ledger (a single `write()` on an O_APPEND file, so a line
survives kill -9 whole) and then holds the run for `SCHEDULE_HOLD` seconds, so that
several ticks are in flight at once and a killed worker dies in the middle of a step.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import perdure

LEDGER_ENV = "SCHEDULE_LEDGER"
HOLD_ENV = "SCHEDULE_HOLD"
SCHEDULE = "tick"

app = perdure.App()  # the store from PERDURE_DB


def ledger_write(record: dict[str, Any]) -> None:
    """Append one JSON line to the ledger with one write() (whole, even under kill -9)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@app.step(name="tick_body", effect="idempotent")
async def tick_body() -> str:
    info = perdure.current_step()
    ledger_write(
        {
            "run": info.run_id,
            "key": info.idempotency_key,
            "attempt": info.attempt,
            "pid": os.getpid(),
            "at": time.time(),
        }
    )
    await asyncio.sleep(float(os.environ.get(HOLD_ENV, "2.0")))  # a kill lands mid-step
    return info.idempotency_key


@app.schedule(every=1, overlap="allow")
@app.workflow(name=SCHEDULE)
async def tick() -> str:
    return await tick_body()
