"""Dashboard sessions on every store: found while live, never after sign-out or once their
token is revoked, their last use kept, and long-dead ones forgotten when a new one starts."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.server.access_sql import Access
from perdure.store.base import Store

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_session_lives_until_signed_out(store: Store) -> None:
    access = Access(store)
    run(access.add_token("t1", "ana", "tokenhash1", "read operate", 1.0))
    run(access.add_session("s1", "t1", 10.0, forget_before=0.0))
    found = run(access.find_session("s1"))
    assert found is not None
    assert (found.token_id, found.name, found.scopes, found.created_at, found.seen_at) == (
        "t1", "ana", "read operate", 10.0, 10.0,
    )  # fmt: skip
    run(access.touch_session("s1", 50.0))
    run(access.touch_session("s1", 40.0))  # an older touch never moves it back
    assert run(access.find_session("s1")).seen_at == 50.0  # type: ignore[union-attr]
    assert run(access.find_session("other")) is None
    assert run(access.end_session("s1", 60.0)) is True
    assert run(access.end_session("s1", 61.0)) is False
    assert run(access.find_session("s1")) is None


def test_revoking_the_token_ends_its_sessions(store: Store) -> None:
    access = Access(store)
    run(access.add_token("t1", "ana", "tokenhash1", "admin", 1.0))
    run(access.add_token("t2", "bob", "tokenhash2", "read", 1.0))
    for digest, token in (("s1", "t1"), ("s2", "t1"), ("s3", "t2")):
        run(access.add_session(digest, token, 10.0, forget_before=0.0))
    assert run(access.revoke_token("t1", 20.0))
    assert [run(access.find_session(s)) is not None for s in ("s1", "s2", "s3")] == [
        False, False, True,
    ]  # fmt: skip


def test_sessions_dead_long_ago_are_forgotten(store: Store) -> None:
    access = Access(store)
    run(access.add_token("t1", "ana", "tokenhash1", "read", 1.0))
    run(access.add_session("old", "t1", 10.0, forget_before=0.0))
    run(access.add_session("recent", "t1", 100.0, forget_before=0.0))
    run(access.add_session("new", "t1", 200.0, forget_before=50.0))
    assert run(access.find_session("old")) is None
    assert run(access.find_session("recent")) is not None
