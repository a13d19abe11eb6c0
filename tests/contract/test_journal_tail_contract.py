"""A run's journal stays one gap-free sequence, and a retried write lands once, whatever
mix of writes reaches it: a worker's steps (SQLite keeps their seqs and keys in the
journal, PostgreSQL on the run row), operators' notes and cancels, transactional bodies
that commit or fail, takeovers, writes sent again after a lost connection."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.store import sqlops
from perdure.store.base import Append, AppendResult, Entry, NewRun, Store

T = TypeVar("T")
_RUNS = itertools.count()
WRITES = ("step", "step", "status", "note", "tx_ok", "tx_fail", "retry", "takeover")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _entries(kind: str, n: int) -> list[Entry]:
    return [Entry(kind=kind, name="s", data=str(i), at=1.0) for i in range(n)]


async def _send(store: Store, write: Append, body: Any) -> AppendResult:
    """A write as the engine sends it: through `append`, or with a body in its transaction
    through the store's generic entry."""
    if body is None:
        return await store.append(write)
    with_body = functools.partial(sqlops.append_with_body, append=write, body=body)
    return await store.run_sql(with_body, write=True)


def _ok(conn: Any) -> str:
    return '"done"'


def _fail(conn: Any) -> str:
    raise ValueError("the body failed")


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(writes=st.lists(st.tuples(st.sampled_from(WRITES), st.integers(1, 3)), max_size=14))
def test_every_mix_of_writes_keeps_one_gap_free_journal(
    store: Store, writes: list[tuple[str, int]]
) -> None:
    """Seqs are 0..n-1 in write order; each write's entries are there once, a failed
    body's entry never; a retried write that landed adds nothing."""
    run_id = f"tail-{next(_RUNS)}"  # one store serves every example: a run of its own each
    run(store.create_run(NewRun(id=run_id, workflow=run_id, input="{}", code_version="v",
                                now=100.0)))  # fmt: skip
    now = 100.0
    [claim] = run(store.claim("w0", now, 30.0, 10, [run_id]))
    epoch, expected = claim.run.lease_epoch, 0
    landed: list[Append] = []
    bodies: dict[str | None, Any] = {}  # a write's body (transactional), by its key
    for i, (kind, n) in enumerate(writes):
        key = f"{run_id}:{i}"
        if kind == "step":
            write = Append(run_id, epoch, _entries("step.outcome", n), key=key)
        elif kind == "status":
            write = Append(run_id, epoch, _entries("run.note", n), status="running",
                           fields={"updated_at": now}, key=key)  # fmt: skip
        elif kind == "note":
            write = Append(run_id, None, _entries("run.note", n))
        elif kind in ("tx_ok", "tx_fail"):
            body = _ok if kind == "tx_ok" else _fail
            entries = [*_entries("step.intent", n - 1), Entry(kind="step.outcome", at=1.0)]
            write = Append(run_id, epoch, entries, key=key)
            bodies[key] = body
        elif kind == "retry":
            if landed:  # a worker sends its last write again (it waits for that one)
                again = landed[-1]
                resent = Append(run_id, again.epoch, list(again.entries), key=again.key,
                                retry=True)  # fmt: skip
                run(_send(store, resent, bodies.get(again.key)))
            continue
        else:  # another worker takes the run over once its lease ran out
            now += 31.0
            [taken] = run(store.claim(f"w{i}", now, 30.0, 10, [run_id]))
            epoch, expected = taken.run.lease_epoch, expected + 1  # + its run.recovered
            continue
        result = run(_send(store, write, bodies.get(write.key)))
        assert (result.tx_error is not None) == (kind == "tx_fail")
        expected += n - (kind == "tx_fail")
        if write.key is not None:  # a failed body's write lands too (all but its outcome)
            landed.append(write)
    journal = run(store.journal(run_id))
    assert [e.seq for e in journal] == list(range(expected))
    data = [(e.kind, e.data) for e in journal if e.kind != "run.recovered"]
    assert len(data) == expected - sum(kind == "takeover" for kind, _ in writes)
