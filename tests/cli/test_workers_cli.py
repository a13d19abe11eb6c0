"""The worker registry: a worker says who and where it is, alive or stopped; silence shows."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from live_workers import worker_task
from module_files import load_file
from perdure.cli.main import cli
from perdure.engine.worker import WorkerOptions, id_reusable, public_url
from perdure.store.workers_sql import WorkerRow
from waits import wait_for


def test_workers_report_host_pid_load_and_state(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/w.db"
    app = perdure.App(db)

    @app.workflow(name="nap")
    async def nap() -> None:
        await asyncio.sleep(0.3)

    seen: dict[str, str] = {}

    async def main() -> None:
        async with worker_task(app, concurrency=3, lease=3.0) as worker:
            await app.start_async(nap)
            await asyncio.sleep(0.2)
            shown = await asyncio.to_thread(CliRunner().invoke, cli, ["--db", db, "workers"])
            seen["alive"] = shown.output
        seen["id"] = worker.id

    try:
        asyncio.run(main())
        stale = WorkerRow("ghost:1:abc", "ghost", 1, time.time() - 600, time.time() - 120, 4, 2)
        app.runtime.sync(app.runtime.store.worker_beat(stale), "beat")
        after = CliRunner().invoke(cli, ["--db", db, "workers"]).output
    finally:
        app.close()
    line = next(x for x in seen["alive"].splitlines() if x.startswith(seen["id"]))
    assert socket.gethostname() in line and str(os.getpid()) in line
    assert line.rstrip().endswith(("alive (busy)", "alive (idle)")) and "/3" in line
    mine = next(x for x in after.splitlines() if x.startswith(seen["id"]))
    assert "stopped" in mine
    ghost = next(x for x in after.splitlines() if x.startswith("ghost:1:abc"))
    assert "silent: no heartbeat for 1" in ghost and "2/4" in ghost


def _shop_module() -> Any:
    """tests/chaos/shop.py (worker processes on the stop_app shop), loaded by path."""
    path = Path(__file__).resolve().parents[1] / "chaos" / "shop.py"
    return load_file("perdure_test_shop", path)


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Any]:
    """The stop_app shop on a fresh SQLite store; its worker processes are killed after."""
    made = _shop_module().Shop(f"sqlite:///{tmp_path}/shop.db", tmp_path)
    try:
        yield made
    finally:
        made.reap()


def test_a_script_can_wait_for_the_ready_line(shop: Any) -> None:
    """`perdure worker` prints exactly one ready line on stdout once claiming; logs go to
    stderr; a run started right after the line is picked up."""
    proc = shop.spawn(grace=5, worker_id="shop-1")
    line = proc.wait_ready()
    assert line == f"ready worker=shop-1 store={shop.url} concurrency=4\n"
    run_id = shop.app.start("risky", 0.0, 0.0).id
    assert shop.app.handle(run_id).result(timeout=10) == "receipt"
    proc.signal(signal.SIGTERM)
    code, _ = proc.wait()
    assert code == 0
    assert proc.stdout == [line]  # nothing else ever reaches stdout
    assert "claiming" in proc.stderr() and "ready" not in proc.stderr()


def test_a_live_workers_id_is_refused_and_a_dead_ones_is_reused(shop: Any) -> None:
    """A second worker under a live worker's id exits 2 with one line; after kill -9 the id
    may be taken again, and the new worker recovers the dead one's run at once."""
    first = shop.spawn(grace=5, worker_id="billing")
    first.wait_ready()
    twin = shop.spawn(grace=5, worker_id="billing")
    code, _ = twin.wait(timeout=30)
    assert code == 2
    assert twin.stdout == []
    error = [x for x in twin.stderr().splitlines() if x.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in twin.stderr()
    assert f"worker id 'billing' is taken by a live worker (host {socket.gethostname()}, " \
        f"pid {first.pid}" in error[0]  # fmt: skip
    run_id = shop.app.start("risky", 30.0, 0.0).id
    shop.wait_started("prepare")
    first.signal(signal.SIGKILL)
    first.wait()
    again = shop.spawn(grace=5, worker_id="billing")  # the 30 s lease has not expired
    assert again.wait_ready().startswith("ready worker=billing ")
    wait_for("recovery", lambda: len(shop.started("prepare")) == 2, timeout=10)
    assert shop.app.get_run(run_id).lease_owner == "billing"


def test_worker_ids_are_unique_in_one_process_too(db_url: str) -> None:
    """Two workers of one process cannot share an id; a stopped worker's id can be reused."""
    app = perdure.App(db_url)

    async def main() -> str:
        async with worker_task(app, WorkerOptions(id="w1", lease=3.0)) as first:
            await asyncio.wait_for(first.ready.wait(), 10)
            with pytest.raises(perdure.PerdureError, match="'w1' is taken by a live worker"):
                await app.worker(WorkerOptions(id="w1")).run()
        async with worker_task(app, WorkerOptions(id="w1", lease=3.0)) as again:
            await asyncio.wait_for(again.ready.wait(), 10)
        return again.id

    try:
        assert asyncio.run(main()) == "w1"
        with pytest.raises(perdure.ConfigError, match="without spaces"):
            app.worker(WorkerOptions(id="two words"))
    finally:
        app.close()


def test_an_id_left_by_this_pids_earlier_life_is_reusable() -> None:
    """A registry row of this host and pid that no live worker here holds (a restarted
    container gets the same pid) does not block the id; another host's recent one does."""
    here, now = socket.gethostname(), time.time()
    mine = WorkerRow("svc", here, os.getpid(), now - 60, now - 1, 4, 0)
    assert id_reusable(mine, now)
    remote = WorkerRow("svc", "elsewhere", 7, now - 60, now - 1, 4, 0)
    assert not id_reusable(remote, now)
    assert id_reusable(WorkerRow("svc", "elsewhere", 7, now - 600, now - 300, 4, 0), now)


def test_printed_store_urls_carry_no_secret() -> None:
    """The ready line's store URL drops a password and every query option but the schema."""
    url = "postgresql://app:s3cret@db:5432/prod?schema=shop&sslpassword=x&sslmode=require"
    assert public_url(url) == "postgresql://app@db:5432/prod?schema=shop"
    assert public_url("sqlite:////var/lib/p.db") == "sqlite:////var/lib/p.db"
