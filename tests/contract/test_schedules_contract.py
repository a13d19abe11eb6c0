"""The schedule rows every store keeps: compare-and-set steps, tick records, prefix scans."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.store.base import NewRun, Store
from perdure.triggers.schedule_sql import ScheduleAdvance, ScheduleRow, Schedules, TickRow

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _row(next_fire: float = 60.0) -> ScheduleRow:
    return ScheduleRow(name="s", workflow="wf", every=60.0, next_fire=next_fire, created_at=1.0)


def test_a_step_applies_once_and_only_from_the_state_it_read(store: Store) -> None:
    schedules = Schedules(store)
    run(schedules.put_schedule(_row(), replace_state=True))
    tick = TickRow("s", 60.0, "fired", run_id="sched:s:60", at=61.0)
    new = NewRun(id="sched:s:60", workflow="wf", input="{}", code_version="", now=61.0)
    step = ScheduleAdvance(name="s", expected=60.0, next_fire=120.0, now=61.0, ticks=[tick],
                           new_runs=[new])  # fmt: skip
    assert run(schedules.advance_schedule(step)) is True
    assert run(schedules.advance_schedule(step)) is False  # another worker read 60.0 too: refused
    stored = run(schedules.get_schedule("s"))
    assert stored is not None and stored.next_fire == 120.0
    assert [(t.fire_at, t.status, t.run_id) for t in run(schedules.schedule_ticks("s"))] == [
        (60.0, "fired", "sched:s:60")
    ]
    assert [r.id for r in run(schedules.active_runs("sched:s:"))] == ["sched:s:60"]
    assert run(schedules.active_runs("sched:t:")) == []


def test_definition_updates_keep_or_reset_state(store: Store) -> None:
    """The same timing stored again (another worker starting) keeps the next tick; a new
    timing, or a forced reset, replaces it; pausing survives both."""
    schedules = Schedules(store)
    run(schedules.put_schedule(_row(60.0), replace_state=False))
    run(schedules.set_schedule_paused("s", True, 5.0, None))
    kept = run(schedules.put_schedule(_row(999.0), replace_state=False))
    assert (kept.next_fire, kept.paused, kept.created_at) == (60.0, True, 1.0)
    retimed = _row(999.0)
    retimed.every = 30.0
    moved = run(schedules.put_schedule(retimed, replace_state=False))
    assert (moved.next_fire, moved.paused) == (999.0, True)
    reset = run(schedules.put_schedule(_row(555.0), replace_state=True))
    assert (reset.next_fire, reset.paused) == (555.0, True)
    assert run(schedules.due_schedules(10_000.0)) == []  # paused
    resumed = run(schedules.set_schedule_paused("s", False, 6.0, 1200.0))  # (from 555)
    assert resumed.next_fire == 1200.0
    assert [r.name for r in run(schedules.due_schedules(1200.0))] == ["s"]
    assert run(schedules.next_schedule_fire()) == 1200.0
    assert run(schedules.delete_schedule("s")) is True
    assert run(schedules.list_schedules()) == [] and run(schedules.delete_schedule("s")) is False


def test_queued_ticks_make_a_schedule_due(store: Store) -> None:
    schedules = Schedules(store)
    run(schedules.put_schedule(_row(60.0), replace_state=True))
    queued = TickRow("s", 60.0, "queued", reason="waiting", at=61.0)
    step = ScheduleAdvance(name="s", expected=60.0, next_fire=120.0, now=61.0, ticks=[queued])
    assert run(schedules.advance_schedule(step))
    assert [r.name for r in run(schedules.due_schedules(61.0))] == ["s"]  # before 120: queued
    fired = TickRow("s", 60.0, "fired", run_id="sched:s:60", at=62.0)
    step = ScheduleAdvance(name="s", expected=120.0, next_fire=120.0, now=62.0, ticks=[fired])
    assert run(schedules.advance_schedule(step))
    assert run(schedules.due_schedules(61.0)) == []
    assert [t.status for t in run(schedules.schedule_ticks("s"))] == ["fired"]
