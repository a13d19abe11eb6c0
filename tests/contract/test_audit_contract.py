"""The audit log on every store: append-only, each record's outcome and reason, and filters by
target, actor and time that combine, newest first, paged by id."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.server import access_sql
from perdure.server.access_sql import Access
from perdure.store.base import Store

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_record_keeps_its_outcome_and_reason(store: Store) -> None:
    """A refused action is kept with its outcome and one-line reason; one recorded without
    either is `ok` with no reason."""
    access = Access(store)
    ok = run(access.audit(10.0, "cli:ana@h1", "run.cancel", "run:r1", "{}"))
    refused = run(access.audit(11.0, "bot", "run.cancel", "run:nope", '{"comment":"x"}',
                              "refused", "no run with id 'nope'"))  # fmt: skip
    assert refused > ok
    newest, oldest = run(access.audit_log())
    assert (newest.actor, newest.target, newest.outcome, newest.reason, newest.detail) == (
        "bot", "run:nope", "refused", "no run with id 'nope'", '{"comment":"x"}',
    )  # fmt: skip
    assert (oldest.id, oldest.at, oldest.outcome, oldest.reason) == (ok, 10.0, "ok", "")


def test_filters_by_target_actor_and_since_combine(store: Store) -> None:
    """target, actor and since each narrow the log and hold together; `before` pages on."""
    rows = [
        (100.0, "cli:ana@h1", "run.pause", "run:r1"),
        (200.0, "bot", "run.cancel", "run:r1"),
        (300.0, "cli:ana@h1", "run.resume", "run:r1"),
        (400.0, "cli:ana@h1", "schedule.pause", "schedule:s1"),
        (500.0, "cli:ana@h1", "run.cancel", "run:r1"),
    ]
    ids = [run(Access(store).audit(at, who, what, target, "{}")) for at, who, what, target in rows]

    def found(**query: Any) -> list[int]:
        return [r.id for r in run(Access(store).audit_log(**query))]

    assert found() == ids[::-1]
    assert found(target="run:r1") == [ids[4], ids[2], ids[1], ids[0]]
    assert found(actor="bot") == [ids[1]]
    assert found(since=300.0) == [ids[4], ids[3], ids[2]]
    assert found(target="run:r1", actor="cli:ana@h1", since=250.0) == [ids[4], ids[2]]
    assert found(target="run:r1", actor="cli:ana@h1", limit=1) == [ids[4]]
    assert found(target="run:r1", actor="cli:ana@h1", before=ids[4]) == [ids[2], ids[0]]
    assert found(actor="nobody") == []


def test_the_store_has_no_way_to_change_or_remove_a_record() -> None:
    """Access control's tables offer appending and reading the audit log, nothing that
    rewrites it, and their SQL never updates or deletes a record."""
    names = [n for n in dir(Access) if "audit" in n]
    assert sorted(names) == ["audit", "audit_log"]
    assert not [n for n in dir(Store) if "audit" in n]
    text = " ".join(inspect.getsource(access_sql).split())
    assert "UPDATE audit_log" not in text and "DELETE FROM audit_log" not in text
    assert "INSERT INTO audit_log" in text
