"""The engine's promises hold on every store: the same workflows, SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def insert(db: Any, table: str, value: str) -> None:
    """Insert through the store's own connection, in its placeholder style."""
    mark = "?" if isinstance(db, sqlite3.Connection) else "%s"
    db.execute(f"CREATE TABLE IF NOT EXISTS {table} (v TEXT)")
    db.execute(f"INSERT INTO {table} VALUES ({mark})", (value,))


def build(app: perdure.App, effects: list[str]) -> perdure.Workflow[[str], str]:
    @app.step(name="look", effect="read")
    def look(order: str) -> int:
        effects.append("look")
        return len(order)

    @app.step(name="reserve", effect="keyed")
    def reserve(order: str) -> str:
        effects.append(f"reserve {perdure.current_step().idempotency_key}")
        return f"hold-{order}"

    @app.step(name="mail", effect="once")
    def mail(order: str) -> str:
        effects.append("mail")
        return f"mailed {order}"

    @app.step(name="book", effect="transactional")
    def book(order: str) -> str:
        insert(perdure.current_step().db, "bookings", order)
        return "booked"

    @app.workflow(name="child_wf")
    async def child_wf(n: int) -> int:
        return n * 2

    @app.workflow(name="order_flow")
    async def order_flow(order: str) -> str:
        size = await look(order)
        hold = await reserve(order)
        await perdure.sleep(timedelta(hours=1))
        approved = await perdure.wait_event("approve", timeout=timedelta(days=1))
        doubled = await child_wf(size)
        booked = await book(order)
        sent = await mail(order)
        return f"{hold} {approved} {doubled} {booked} {sent}"

    return order_flow


def test_a_full_workflow_runs_the_same_on_every_store(any_app: perdure.App) -> None:
    """Steps of every effect, a durable sleep, an event, a child and a transaction complete."""
    clock = any_app.clock
    assert isinstance(clock, TestClock)
    effects: list[str] = []
    flow = build(any_app, effects)
    handle = any_app.start(flow, "o-1", run_id="order-1")
    worker = TestWorker(any_app)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    clock.advance(timedelta(hours=1, seconds=1))
    worker.run_until_idle()
    assert handle.status() == "waiting"
    any_app.send_event("order-1", "approve", "ana")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "hold-o-1 ana 6 booked mailed o-1"
    assert effects == ["look", "reserve order-1:1", "mail"]
    seqs = [e.seq for e in any_app.journal("order-1")]
    assert seqs == list(range(len(seqs)))


def test_crash_recovery_follows_the_effects_on_every_store(any_app: perdure.App) -> None:
    """After a crash mid-step: a keyed step re-runs with its key; a once step parks the run."""
    clock = any_app.clock
    assert isinstance(clock, TestClock)
    effects: list[str] = []
    flow = build(any_app, effects)
    handle = any_app.start(flow, "o-2", run_id="order-2")
    dead = TestWorker(any_app)
    dead.crash_after_intent("reserve")
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    clock.advance(31)
    TestWorker(any_app).run_until_idle()
    assert effects == ["look", "reserve order-2:1"]  # the crash came before its effect ran
    clock.advance(timedelta(hours=1))
    any_app.send_event("order-2", "approve", "bo")
    dead = TestWorker(any_app)
    dead.crash_after_intent("mail")
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    clock.advance(31)
    TestWorker(any_app).run_until_idle()
    assert handle.status() == "needs_attention"
    any_app.resolve("order-2", "mail", value="mailed by hand")
    TestWorker(any_app).run_until_idle()
    assert handle.result(timeout=5).endswith("booked mailed by hand")
    assert effects.count("mail") == 0


def test_fork_and_replay_check_on_every_store(any_app: perdure.App) -> None:
    """A fork reuses recorded outcomes, and replay-check finds no divergence in parked runs."""
    from perdure.engine.inspection import replay_check

    effects: list[str] = []
    flow = build(any_app, effects)
    any_app.start(flow, "o-3", run_id="order-3")
    TestWorker(any_app).run_until_idle()
    report = any_app.runtime.sync(replay_check(any_app.runtime), "replay-check")
    assert report.checked == 1 and report.divergences == []
    forked = any_app.fork("order-3", from_step=2, new_id="order-3b")
    TestWorker(any_app).run_until_idle()
    assert forked.status() == "sleeping"
    assert effects == ["look", "reserve order-3:1"]  # the fork ran neither again
