"""Dead messages on every store: kept once per (trigger, message id), listed newest first,
filtered by trigger, and forgotten one by one."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.store.base import Store
from perdure.triggers.dead_sql import DeadMessage, DeadMessages

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def dead(trigger: str, message_id: str, at: float, reason: str = "not JSON") -> DeadMessage:
    return DeadMessage(trigger, message_id, "rabbitmq", reason, "{oops", 5, at)


def test_a_dead_message_is_kept_once_with_its_reason(store: Store) -> None:
    """A redelivered dead message is not kept twice; the first reason stays."""
    messages = DeadMessages(store)
    assert run(messages.add_dead_message(dead("orders", "m1", 10.0))) is True
    assert run(messages.add_dead_message(dead("orders", "m1", 11.0, "other"))) is False
    assert run(messages.add_dead_message(dead("orders", "m2", 12.0))) is True
    assert run(messages.add_dead_message(dead("billing", "m1", 13.0))) is True
    rows = run(messages.dead_messages())
    assert [(r.trigger, r.message_id) for r in rows] == [
        ("billing", "m1"), ("orders", "m2"), ("orders", "m1"),
    ]  # fmt: skip
    assert rows[2].reason == "not JSON" and rows[2].body == "{oops" and rows[2].size == 5
    assert [r.message_id for r in run(messages.dead_messages("orders", limit=1))] == ["m2"]


def test_a_dead_message_can_be_forgotten(store: Store) -> None:
    """Forgetting drops exactly that message, once."""
    messages = DeadMessages(store)
    run(messages.add_dead_message(dead("orders", "m1", 10.0)))
    run(messages.add_dead_message(dead("orders", "m2", 10.0)))
    assert run(messages.forget_dead_message("orders", "m1")) is True
    assert run(messages.forget_dead_message("orders", "m1")) is False
    assert [r.message_id for r in run(messages.dead_messages())] == ["m2"]
