"""Agents' durable state on every store: usage once per call, budgets, memory search, notes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.store.agent_sql import Budget, UsageRow
from perdure.store.base import Store

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _usage(run_id: str, position: int, tokens: int, at: float, agent: str = "a") -> UsageRow:
    return UsageRow(run_id, position, agent, "m", tokens, 1, 0.5, at)


def test_usage_is_recorded_once_per_call_and_adds_up(store: Store) -> None:
    assert run(store.record_usage(_usage("r1", 3, 10, 100.0))) is True
    assert run(store.record_usage(_usage("r1", 3, 99, 100.0))) is False  # the same call again
    run(store.record_usage(_usage("r1", 7, 20, 200.0)))
    run(store.record_usage(_usage("r2", 1, 40, 300.0, agent="b")))
    assert run(store.spent("a", 0.0)) == (32, 1.0)
    assert run(store.spent("a", 150.0)) == (21, 0.5)
    assert run(store.run_spent("r1")) == (32, 1.0)
    assert [(u.run_id, u.position) for u in run(store.usage(None, 0.0))] == [
        ("r1", 3), ("r1", 7), ("r2", 1),
    ]  # fmt: skip
    assert len(run(store.usage("b", 0.0))) == 1


def test_budgets_are_stored_and_replaced(store: Store) -> None:
    assert run(store.get_budget("a")) is None
    run(store.put_budget(Budget("a", tokens_per_day=1000), 1.0))
    run(store.put_budget(Budget("a", tokens_per_day=5000, cost_per_hour=2.5), 2.0))
    assert run(store.get_budget("a")) == Budget("a", None, 5000, 2.5, None)


def test_memory_is_searched_by_words_and_kept_per_agent(store: Store) -> None:
    first = run(store.remember("a", "The invoice from ACME is overdue", "billing", "r1", 1.0))
    run(store.remember("a", "Ana prefers summaries in French", "people", "r2", 2.0))
    run(store.remember("b", "ACME again, for another agent", "", None, 3.0))
    found = run(store.recall("a", "acme invoices?", 5))
    assert [m.id for m in found] == [first] and found[0].run_id == "r1"
    assert {m.text for m in run(store.recall("a", "french OR billing", 5))} == {
        "The invoice from ACME is overdue",
        "Ana prefers summaries in French",
    }
    assert [m.agent for m in run(store.recall("b", "acme", 5))] == ["b"]
    assert [m.at for m in run(store.recall("a", "", 5))] == [2.0, 1.0]  # no words: newest
    assert run(store.recall("a", "nothing-like-this", 5)) == []


def test_progress_notes_are_one_text_per_agent(store: Store) -> None:
    assert run(store.get_notes("a")) == ""
    run(store.put_notes("a", "did 1", "r1", 1.0))
    run(store.put_notes("a", "did 1, 2", "r2", 2.0))
    assert run(store.get_notes("a")) == "did 1, 2" and run(store.get_notes("b")) == ""


def test_notes_added_at_once_are_all_kept_once_each_and_trimmed(store: Store) -> None:
    """Runs finishing together each keep their line; a step run again adds nothing."""

    async def many() -> list[str]:
        return await asyncio.gather(
            *(store.add_note("a", f"- run {i} done", f"r{i}", float(i), keep=50) for i in range(20))
        )

    run(many())
    lines = run(store.get_notes("a")).splitlines()
    assert sorted(lines) == sorted(f"- run {i} done" for i in range(20))
    assert run(store.add_note("a", "- run 3 done", "r3", 30.0)).count("- run 3 done") == 1
    for i in range(20, 30):
        run(store.add_note("a", f"- run {i} done", f"r{i}", float(i), keep=12))
    assert run(store.get_notes("a")).splitlines() == [f"- run {i} done" for i in range(18, 30)]
