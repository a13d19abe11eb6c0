"""The clock-skew test's app: quick runs of three steps, and runs that sleep on a store timer.

Store from PERDURE_DB. Every step body appends a line to SKEW_DIR/ledger-<pid> (which
worker ran what), so a body run twice shows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import perdure

LEDGER = Path(os.environ.get("SKEW_DIR", ".")) / f"ledger-{os.getpid()}.jsonl"


def note(run: str, step: str) -> None:
    with LEDGER.open("a") as out:
        out.write(json.dumps({"run": run, "step": step, "pid": os.getpid()}) + "\n")


def register(app: perdure.App) -> perdure.App:
    """The workflows on `app` (the workers' app below; a test's own client on its store)."""

    @app.step(effect="once", name="charge")
    def charge(tag: str) -> str:
        note(tag, "charge")
        return f"charged {tag}"

    @app.step(effect="idempotent", name="record")
    def record(tag: str) -> str:
        note(tag, "record")
        return f"recorded {tag}"

    @app.workflow(name="quick")
    async def quick(tag: str) -> str:
        first = await charge(tag)
        await perdure.sleep(0.2)  # in the worker: the lease is what keeps the run
        return first + " / " + await record(tag)

    @app.workflow(name="sleeper")
    async def sleeper(tag: str, seconds: float) -> str:
        await charge(tag)
        await perdure.sleep(seconds)  # on the store's timer: whoever claims it must wait
        return await record(tag)

    return app


app = register(perdure.App())
