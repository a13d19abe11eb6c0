"""Table changes under kill -9: worker processes die mid-stream, no change is lost or doubled.

Two worker processes run tests/triggers/table_app.py on a database of the test's own
while the test commits inserts (and rolls back a third of them) in separate
transactions. A worker is SIGKILLed twice while changes stream in, and replaced;
in the end every committed insert has exactly one run, completed, and the outbox is
empty.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
from test_table_changes import write_orders

from module_files import load_file
from perdure.triggers.changes_sql import Outbox
from perdure.triggers.table_changes import TableChange
from process_stops import stop_processes
from waits import wait_for

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "table_app.py"
INSERTS = 900
WORKERS = 2


def load_app_module() -> ModuleType:
    return load_file("perdure_table_app", SCRIPT)


class Workers:
    """Worker processes on one store; every one is stopped at the end."""

    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("PERDURE_DB", None)
        self.procs: list[subprocess.Popen[bytes]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(self) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), self.url],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.procs.append(proc)
        wait_for(
            "a worker",
            lambda: "ready worker=" in log.read_text(errors="replace"),
            timeout=60,
            every=0.05,
        )
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop_all(self) -> None:
        stop_processes(self.procs, grace=15)

    def text(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.logs.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_workers_leave_exactly_one_run_per_committed_change(
    database: str, tmp_path: Path
) -> None:
    """Inserts stream in while workers are kill -9'd and replaced: one run per committed
    insert, none for a rolled-back one, none twice; the outbox drains."""
    mod = load_app_module()
    app = mod.build_app(database)
    change = app.runtime.triggers.of(TableChange)["orders"]
    app.runtime.sync(change.install(), "install")  # changes count from here on
    workers = Workers(database, tmp_path / "logs")
    committed: set[int] = set()
    try:
        for _ in range(WORKERS):
            workers.spawn()
        writer = threading.Thread(target=lambda: committed.update(write_orders(database, INSERTS)))
        writer.start()
        kills = 0
        for share in (0.2, 0.5):
            wait_for(f"{share:.0%} of the runs",
                     lambda s=share: len(app.list_runs(workflow="ship", limit=10_000))
                     >= s * INSERTS * 2 / 3, timeout=120, every=0.05)  # fmt: skip
            victim = workers.alive()[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills += 1
            workers.spawn()
        writer.join(timeout=120)
        assert not writer.is_alive()
        assert len(committed) == INSERTS * 2 // 3

        def settled() -> bool:
            runs = app.list_runs(workflow="ship", limit=10_000)
            return len(runs) >= len(committed) and all(r.status == "completed" for r in runs)

        wait_for("every run completed", settled, timeout=120, every=0.05)
        runs = app.list_runs(workflow="ship", limit=10_000)
        keys = [json.loads(r.input)["args"][0]["key"]["id"] for r in runs]
        assert len(keys) == len(set(keys)), "a change started two runs"
        assert set(keys) == committed
        assert {int(json.loads(r.result or "0")) for r in runs} == committed
        assert app.runtime.sync(Outbox(app.runtime.store).change_counts("orders"), "counts")[0] == 0
        assert kills == 2
        assert len(workers.alive()) == WORKERS, workers.text()
    finally:
        workers.stop_all()
        app.close()
