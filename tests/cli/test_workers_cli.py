"""The worker registry: a worker says who and where it is, alive or stopped; silence shows."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from click.testing import CliRunner

import perdure
from perdure.cli.main import cli
from perdure.store.workers_sql import WorkerRow


def test_workers_report_host_pid_load_and_state(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/w.db"
    app = perdure.App(db)

    @app.workflow(name="nap")
    async def nap() -> None:
        await asyncio.sleep(0.3)

    seen: dict[str, str] = {}

    async def main() -> None:
        worker = app.worker(concurrency=3, lease=3.0)
        task = asyncio.create_task(worker.run())
        await app.start_async(nap)
        await asyncio.sleep(0.2)
        shown = await asyncio.to_thread(CliRunner().invoke, cli, ["--db", db, "workers"])
        seen["alive"] = shown.output
        worker.stop()
        await asyncio.wait_for(task, 10)
        seen["id"] = worker.id

    try:
        asyncio.run(main())
        stale = WorkerRow("ghost:1:abc", "ghost", 1, time.time() - 600, time.time() - 120, 4, 2)
        app.sync(app.store.worker_beat(stale), "beat")
        after = CliRunner().invoke(cli, ["--db", db, "workers"]).output
    finally:
        app.close()
    line = next(x for x in seen["alive"].splitlines() if x.startswith(seen["id"]))
    assert socket.gethostname() in line and str(os.getpid()) in line
    assert line.rstrip().endswith("alive") and "/3" in line
    mine = next(x for x in after.splitlines() if x.startswith(seen["id"]))
    assert "stopped" in mine
    ghost = next(x for x in after.splitlines() if x.startswith("ghost:1:abc"))
    assert "SILENT for 1" in ghost and "2/4" in ghost
