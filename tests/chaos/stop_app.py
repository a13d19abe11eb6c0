"""The shop the graceful-stop tests stop with signals: a slow idempotent step, then a slow once
step, then a receipt; and a workflow of many short once steps.

Run by the tests as `perdure --app stop_app:app --db URL worker ...` from this folder. Every
step body writes one line when it starts and one when it ends to the file named by
`STOP_LEDGER` (a single `write()` on an O_APPEND file, so a killed process cannot take it
back), so the tests see from outside which process executed what, and when.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import perdure


def note(step: str, phase: str) -> None:
    """One ledger line: which run, step and process, starting or ending, when."""
    path = os.environ.get("STOP_LEDGER")
    if not path:
        return
    info = perdure.current_step()
    line = {"run": info.run_id, "step": step, "pos": info.position, "phase": phase,
            "pid": os.getpid(), "t": time.time()}  # fmt: skip
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def build(url: str | None = None) -> perdure.App:
    """The app on `url` (None: `--db` / PERDURE_DB)."""
    app = perdure.App(url)

    @app.step(name="prepare", effect="idempotent")
    def prepare(seconds: float) -> str:
        note("prepare", "start")
        time.sleep(seconds)
        note("prepare", "end")
        return "prepared"

    @app.step(name="charge", effect="once")
    def charge(seconds: float) -> str:
        note("charge", "start")
        time.sleep(seconds)
        note("charge", "end")
        return "charged"

    @app.step(name="receipt", effect="read")
    def receipt() -> str:
        note("receipt", "start")
        note("receipt", "end")
        return "receipt"

    @app.workflow(name="risky")
    def risky(prep: float, pay: float, pause: float = 0.0) -> str:
        """A pause before anything (an in-process sleep), then prepare, charge, receipt."""
        if pause:
            perdure.sleep(pause)
        prepare(prep)
        charge(pay)
        return receipt()

    @app.step(name="charge_async", effect="once")
    async def charge_async(seconds: float) -> str:
        note("charge", "start")
        await asyncio.sleep(seconds)
        note("charge", "end")
        return "charged"

    @app.step(name="prepare_async", effect="idempotent")
    async def prepare_async(seconds: float) -> str:
        note("prepare", "start")
        await asyncio.sleep(seconds)
        note("prepare", "end")
        return "prepared"

    @app.workflow(name="risky_async")
    async def risky_async(prep: float, pay: float, pause: float = 0.0) -> str:
        """`risky` as an async workflow with async steps."""
        if pause:
            await perdure.sleep(pause)
        await prepare_async(prep)
        await charge_async(pay)
        return "done"

    @app.step(name="tick", effect="once")
    def tick(i: int, seconds: float) -> int:
        note("tick", "start")
        time.sleep(seconds)
        note("tick", "end")
        return i

    @app.workflow(name="ticks")
    def ticks(n: int, seconds: float) -> list[Any]:
        """`n` once steps in a row: a signal at any moment lands near a step boundary."""
        return [tick(i, seconds) for i in range(n)]

    return app


app = build()
