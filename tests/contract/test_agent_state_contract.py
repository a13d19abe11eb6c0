"""Agents' durable state on every store: usage once per call, budgets, memory search, notes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.agent.budget_sql import Budget, Budgets, UsageRow
from perdure.agent.memory_sql import AgentMemory
from perdure.store.base import Store

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _usage(run_id: str, position: int, tokens: int, at: float, agent: str = "a") -> UsageRow:
    return UsageRow(run_id, position, agent, "m", tokens, 1, 0.5, at)


def test_usage_is_recorded_once_per_call_and_adds_up(store: Store) -> None:
    budgets = Budgets(store)
    assert run(budgets.record_usage(_usage("r1", 3, 10, 100.0))) is True
    assert run(budgets.record_usage(_usage("r1", 3, 99, 100.0))) is False  # the same call again
    run(budgets.record_usage(_usage("r1", 7, 20, 200.0)))
    run(budgets.record_usage(_usage("r2", 1, 40, 300.0, agent="b")))
    assert run(budgets.spent("a", 0.0)) == (32, 1.0)
    assert run(budgets.spent("a", 150.0)) == (21, 0.5)
    assert run(budgets.run_spent("r1")) == (32, 1.0)
    assert [(u.run_id, u.position) for u in run(budgets.usage(None, 0.0))] == [
        ("r1", 3), ("r1", 7), ("r2", 1),
    ]  # fmt: skip
    assert len(run(budgets.usage("b", 0.0))) == 1


def test_budgets_are_stored_and_replaced(store: Store) -> None:
    budgets = Budgets(store)
    assert run(budgets.get_budget("a")) is None
    run(budgets.put_budget(Budget("a", tokens_per_day=1000), 1.0))
    run(budgets.put_budget(Budget("a", tokens_per_day=5000, cost_per_hour=2.5), 2.0))
    assert run(budgets.get_budget("a")) == Budget("a", None, 5000, 2.5, None)


def test_memory_is_searched_by_words_and_kept_per_agent(store: Store) -> None:
    memory = AgentMemory(store)
    first = run(memory.remember("a", "The invoice from ACME is overdue", "billing", "r1", 1.0))
    run(memory.remember("a", "Ana prefers summaries in French", "people", "r2", 2.0))
    run(memory.remember("b", "ACME again, for another agent", "", None, 3.0))
    found = run(memory.recall("a", "acme invoices?", 5))
    assert [m.id for m in found] == [first] and found[0].run_id == "r1"
    assert {m.text for m in run(memory.recall("a", "french OR billing", 5))} == {
        "The invoice from ACME is overdue",
        "Ana prefers summaries in French",
    }
    assert [m.agent for m in run(memory.recall("b", "acme", 5))] == ["b"]
    assert [m.at for m in run(memory.recall("a", "", 5))] == [2.0, 1.0]  # no words: newest
    assert run(memory.recall("a", "nothing-like-this", 5)) == []


def test_progress_notes_are_one_text_per_agent(store: Store) -> None:
    memory = AgentMemory(store)
    assert run(memory.get_notes("a")) == ""
    run(memory.put_notes("a", "did 1", "r1", 1.0))
    run(memory.put_notes("a", "did 1, 2", "r2", 2.0))
    assert run(memory.get_notes("a")) == "did 1, 2" and run(memory.get_notes("b")) == ""


def test_notes_added_at_once_are_all_kept_once_each_and_trimmed(store: Store) -> None:
    """Runs finishing together each keep their line; a step run again adds nothing."""
    memory = AgentMemory(store)

    async def many() -> list[str]:
        return await asyncio.gather(
            *(memory.add_note("a", f"- run {i} done", f"r{i}", float(i)) for i in range(20))
        )

    run(many())
    lines = run(memory.get_notes("a")).splitlines()
    assert sorted(lines) == sorted(f"- run {i} done" for i in range(20))
    assert run(memory.add_note("a", "- run 3 done", "r3", 30.0)).count("- run 3 done") == 1
    for i in range(20, 30):
        run(memory.add_note("a", f"- run {i} done", f"r{i}", float(i), keep=12))
    assert run(memory.get_notes("a")).splitlines() == [f"- run {i} done" for i in range(18, 30)]
