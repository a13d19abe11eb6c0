"""The PostgreSQL store draws every connection of a process from one bounded pool."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from tests_contract_support import PG_URL, drop_schema

import perdure
from extras_needed import needs
from perdure.store import open_store

psycopg = pytest.importorskip("psycopg", reason=needs("postgres"))
pytestmark = pytest.mark.postgres


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(name)


def _connections(schema: str) -> int:
    """Sessions the server has open for this schema's stores (by their application_name)."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (f"perdure:{schema}",),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _gone(schema: str, within: float = 10.0) -> bool:
    """The server has no session left for the schema: a backend whose client closed its
    socket exits a moment later, so a loaded machine may still list it for a few ms; one
    the client kept open would be listed until the end."""
    deadline = time.monotonic() + within
    while _connections(schema):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _busy_app(url: str, runs: int) -> tuple[list[str], int]:
    """Run `runs` concurrent five-step runs on `url`, sampling the server's session count."""
    app = perdure.App(url)
    schema = url.rsplit("schema=", 1)[1].split("&")[0]

    @app.step(name="work")
    def work(i: int) -> int:
        return i

    @app.workflow(name="five")
    async def five(n: int) -> int:
        total = 0
        for i in range(5):
            total += await work(i)
            await perdure.sleep(0.01)
        return total + n

    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.append(_connections(schema))
            done.wait(0.02)

    sampler = threading.Thread(target=sample)

    async def main() -> list[str]:
        worker = app.worker(concurrency=16, poll=0.2)
        task = asyncio.create_task(worker.run())
        try:
            handles = [await app.start_async(five, i, run_id=f"r{i}") for i in range(runs)]
            return [str(await h.result_async(timeout=60)) for h in handles]
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    sampler.start()
    try:
        results = asyncio.run(main())
    finally:
        done.set()
        sampler.join()
        app.close()
    return results, max(seen)


def test_a_busy_process_never_opens_more_connections_than_its_pool(schema: str) -> None:
    """40 runs at concurrency 16 with pool_size=3: at most 3 sessions, all given back at close."""
    results, peak = _busy_app(f"{PG_URL}?schema={schema}&pool_size=3", runs=40)
    assert results == [str(10 + i) for i in range(40)]
    assert 1 <= peak <= 3
    assert _gone(schema)  # close() closed every connection (the server ends each backend soon)


def test_a_pool_of_one_still_runs_everything_by_polling(schema: str) -> None:
    """pool_size=1 leaves no connection for LISTEN: workers poll, and runs still finish."""
    results, peak = _busy_app(f"{PG_URL}?schema={schema}&pool_size=1", runs=5)
    assert results == [str(10 + i) for i in range(5)]
    assert peak == 1


@pytest.mark.parametrize("size", ["0", "many", "-2"])
def test_a_bad_pool_size_is_refused_in_one_line(size: str) -> None:
    with pytest.raises(perdure.ConfigError, match=r"pool_size=.*whole number") as info:
        open_store(f"{PG_URL}?pool_size={size}", environ={})
    assert "\n" not in str(info.value)


def test_an_unknown_database_is_named_at_once(schema: str) -> None:
    """A wrong database name is a one-line ConfigError with the server's reason, not a timeout."""
    url = PG_URL.rsplit("/", 1)[0] + f"/no_such_db_{schema}?schema={schema}"
    store = open_store(url, environ={})
    with pytest.raises(perdure.ConfigError, match="does not exist") as info:
        store.start()  # type: ignore[attr-defined]
    assert "\n" not in str(info.value)
    assert "cannot connect to PostgreSQL" in str(info.value)


def test_a_server_lost_during_start_up_is_the_same_one_line_error(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first connection worked, then the server went away (a restart began) before the
    store was ready: the one-line `cannot connect` ConfigError a worker exits 2 on, never a
    raw driver error (the chaos test's worker started just as the server restarted died of
    one, with a traceback and exit 1)."""
    from perdure.store.postgres import PostgresStore

    migrate = PostgresStore._migrate

    def cut_then_migrate(self: PostgresStore, conn: psycopg.Connection[object]) -> None:
        with psycopg.connect(PG_URL, autocommit=True) as other:  # only this store's session
            other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        migrate(self, conn)

    monkeypatch.setattr(PostgresStore, "_migrate", cut_then_migrate)
    store = open_store(f"{PG_URL}?schema={schema}", environ={})
    try:
        with pytest.raises(perdure.ConfigError, match="cannot connect to PostgreSQL") as info:
            store.start()  # type: ignore[attr-defined]
        assert "lost during start-up" in str(info.value)
        assert "\n" not in str(info.value)
    finally:
        store.stop()  # type: ignore[attr-defined]
