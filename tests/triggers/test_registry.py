"""The trigger registry: every kind is kept in one place, listed from there, and a new kind
is one class added once (its loop run by every worker, its rows listed, its failure shown)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.engine.client import Client
from perdure.engine.runtime import Runtime
from perdure.engine.triggers import TriggerStatus
from perdure.engine.worker import Worker, WorkerOptions
from perdure.errors import ConfigError


class Ticker:
    """A trigger kind of a user's own: starts run `tick:{name}` once, then waits."""

    kind = "ticker"

    def __init__(self, name: str, workflow: str) -> None:
        self.name = name
        self.workflow = workflow
        self.started = asyncio.Event()

    async def run(self, worker: Worker) -> None:
        client = Client(worker.runtime)
        origin = {"ticker": self.name}
        await client.start(self.workflow, (self.name,), run_id=f"tick:{self.name}", origin=origin)
        self.started.set()
        await worker.stopping.wait()

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        state = "fired" if self.started.is_set() else "waiting"
        return [TriggerStatus(self.kind, self.name, self.workflow, state)]


class Broken:
    """A trigger whose status cannot be read."""

    kind = "broken"
    name = "b"

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        raise RuntimeError("cannot tell")


def make_app(tmp_path: Path) -> tuple[perdure.App, perdure.Workflow[[Any], Any]]:
    app = perdure.App(f"sqlite:///{tmp_path / 'p.db'}")

    @app.workflow(name="handle")
    def handle(item: Any) -> Any:
        return item

    return app, handle


def test_every_kind_is_kept_in_the_one_registry(tmp_path: Path) -> None:
    """Schedules, inbox folders, webhooks, events and table changes registered on the App are
    all in its one registry; only those that watch something are worker loops."""
    app, handle = make_app(tmp_path)
    try:
        app.schedule(every=60, name="minutely", workflow="handle")
        app.inbox(tmp_path / "in", "handle", name="drop")
        app.webhook("push", "handle", secret="s")
        app.on_event("order.paid", name="paid")(handle)
        app.on_table_change("orders", "handle")
        kept = [(t.kind, t.name) for t in app.runtime.triggers]
        assert kept == [("schedule", "scheduler"), ("inbox", "drop"), ("webhook", "push"),
                        ("event", "paid"), ("table_change", "orders")]  # fmt: skip
        loops = [type(t).__name__ for t in app.runtime.triggers.loops()]
        assert loops == ["Scheduler", "Inbox", "TableChange"]
    finally:
        app.close()


def test_a_new_kind_is_one_class_added_once(tmp_path: Path) -> None:
    """A kind of one's own, added to the registry, is listed by `App.triggers()` with the
    built-in kinds, and every worker runs its loop (here: its loop starts a run)."""
    app, _ = make_app(tmp_path)
    try:
        ticker = app.runtime.triggers.add(Ticker("t1", "handle"))
        app.webhook("push", "handle", secret="s")
        assert app.triggers() == [
            TriggerStatus("ticker", "t1", "handle", "waiting"),
            TriggerStatus("webhook", "push", "handle", "ready", detail="/hooks/push"),
        ]

        async def work() -> Any:
            worker = Worker(app.runtime, WorkerOptions(poll=0.05, gc_every=None))
            task = asyncio.create_task(worker.run())
            try:
                await asyncio.wait_for(ticker.started.wait(), 10)
                return await app.client.result("tick:t1", timeout=10)
            finally:
                worker.stop()
                await task

        assert app.runtime.sync(work(), "work") == "t1"
        assert app.triggers()[0].state == "fired"
    finally:
        app.close()


def test_a_status_that_fails_is_its_error_row(tmp_path: Path) -> None:
    """A trigger whose `statuses()` raises shows as an error row; the others are listed."""
    app, handle = make_app(tmp_path)
    try:
        app.runtime.triggers.add(Broken())
        app.on_event("order.paid", name="paid")(handle)
        rows = {(t.kind, t.name): t for t in app.triggers()}
        assert rows[("broken", "b")].state == "error"
        assert rows[("broken", "b")].last_error == "statuses() failed: cannot tell"
        assert rows[("event", "paid")].state == "ready"
    finally:
        app.close()


def test_a_name_is_kept_once_per_class(tmp_path: Path) -> None:
    """Adding an equal trigger again keeps the first; another of its class and name is
    refused; the same name in another class is another trigger."""
    app, _ = make_app(tmp_path)
    try:
        first = app.runtime.triggers.add(Ticker("t", "handle"))
        assert app.runtime.triggers.add(first) is first
        with pytest.raises(ConfigError, match="two ticker triggers are named 't'"):
            app.runtime.triggers.add(Ticker("t", "handle"))
        hook = app.webhook("t", "handle", secret="s")
        assert app.webhook("t", "handle", secret="s") is hook
        assert sorted(t.kind for t in app.runtime.triggers) == ["schedule", "ticker", "webhook"]
    finally:
        app.close()
