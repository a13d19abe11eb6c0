"""Every store refuses, by the id rule, an id or name it is asked to write (runs, children,
schedule ticks, queues, schedules, budgets), writes nothing of the refused operation, and
gives back every id it accepted exactly as given."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.agent.budget_sql import Budget, Budgets
from perdure.store.base import Append, Entry, NewRun, Store
from perdure.store.names import MAX_RUN_ID, BadName, problem
from perdure.triggers.schedule_sql import ScheduleAdvance, ScheduleRow, Schedules

T = TypeVar("T")
BAD = ["a\x1bb", "bell\x07", "line\nbreak", "x\u202eevil", "zw\u200b", " lead", "", "r" * 513]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def new(run_id: str, queue: str = "default") -> NewRun:
    return NewRun(id=run_id, workflow="wf", input="{}", code_version="", now=1.0, queue=queue)


@pytest.mark.parametrize("bad", BAD)
def test_a_run_with_a_refused_id_is_not_created(store: Store, bad: str) -> None:
    """create_run refuses the id with the rule's one line; no run is written."""
    with pytest.raises(BadName, match=r"^run id"):
        run(store.create_run(new(bad)))
    assert run(store.list_runs()) == []


def test_a_refused_queue_child_or_tick_writes_nothing(store: Store) -> None:
    """A bad queue name, a child with a bad id (in an append) and a tick run with a bad id
    (in a scheduler step) are refused whole: the parent's entry and the tick are not written."""
    schedules = Schedules(store)
    with pytest.raises(BadName, match=r"^queue name 'q\\x1b'"):
        run(store.create_run(new("r1", queue="q\x1b")))
    parent, _ = run(store.create_run(new("parent")))
    child = new("parent.\u202e0")
    entry = Entry(kind="child.started", name="wf", position=0, final=True, at=2.0)
    with pytest.raises(BadName, match=r"U\+202E"):
        run(store.append(Append(run_id="parent", epoch=None, entries=[entry], new_runs=[child])))
    assert run(store.journal("parent")) == []
    row = ScheduleRow(name="s", workflow="wf", every=60.0, next_fire=60.0, created_at=1.0)
    run(schedules.put_schedule(row, replace_state=True))
    step = ScheduleAdvance(name="s", expected=60.0, next_fire=120.0, now=61.0,
                           new_runs=[new("sched:s:\x0760")])  # fmt: skip
    with pytest.raises(BadName):
        run(schedules.advance_schedule(step))
    stored = run(schedules.get_schedule("s"))
    assert stored is not None and stored.next_fire == 60.0
    assert [r.id for r in run(store.list_runs())] == [parent.id]


def test_schedules_and_budgets_with_refused_names_are_not_stored(store: Store) -> None:
    """put_schedule and put_budget refuse a bad name; nothing is stored."""
    schedules = Schedules(store)
    budgets = Budgets(store)
    row = ScheduleRow(name="night\u202ely", workflow="wf", every=60.0, created_at=1.0)
    with pytest.raises(BadName, match=r"^schedule name 'night\\u202ely' has U\+202E"):
        run(schedules.put_schedule(row, replace_state=True))
    assert run(schedules.list_schedules()) == []
    with pytest.raises(BadName, match=r"^agent name 'bot\\x1b\[2J'"):
        run(budgets.put_budget(Budget("bot\x1b[2J", tokens_per_day=5), 1.0))
    assert run(budgets.get_budget("bot\x1b[2J")) is None


ids = st.text(min_size=1, max_size=60).filter(lambda v: problem(v, "run id", MAX_RUN_ID) is None)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(run_id=ids)
def test_every_accepted_id_round_trips(store: Store, run_id: str) -> None:
    """An id the rule accepts is stored and read back unchanged, by get and by list."""
    created, _ = run(store.create_run(new(run_id)))
    assert created.id == run_id
    found = run(store.get_run(run_id))
    assert found is not None and found.id == run_id
    assert [r.id for r in run(store.list_runs(ids=[run_id]))] == [run_id]
