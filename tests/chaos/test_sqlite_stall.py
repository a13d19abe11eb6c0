"""A worker frozen (SIGSTOP) inside a transactional step's write transaction stalls every SQLite
writer; the stall is visible, bounded for `app.start`, and nothing is lost when it ends.

Two real `perdure worker` processes serve tests/chaos/stall_app.py. One enters the
transactional step `hold_lock` (it says so in a mark file from inside the transaction) and
is frozen there for FREEZE seconds. Meanwhile `app.start(timeout=2)` must fail in bounds
naming the stopped pid and its run, the other worker's log must warn the same, and
`perdure stuck` and `/readyz` must report the held lock; after SIGCONT every run completes,
the step's effect is there exactly once, and the reports clear.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from shop import Proc
from starlette.testclient import TestClient

import perdure
from perdure.errors import StoreUnavailable
from perdure.server.app import create_app
from perdure.store.base import COMPLETED
from perdure.store.lockholder import process_state
from waits import wait_for

HERE = Path(__file__).resolve().parent
FREEZE = 8.0  # seconds the holder stays stopped at least (the checks all run before SIGCONT)
QUICK = 6  # quick runs started before the freeze, and again while it lasts


def _load(url: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("perdure_stall_app", HERE / "stall_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(url)


def _spawn(url: str, workdir: Path, name: str, env: dict[str, str]) -> Proc:
    args = [sys.executable, "-m", "perdure", "--app", "stall_app:app", "--db", url, "worker",
            "--concurrency", "2", "--poll", "0.05", "--lease", "30", "--gc-every", "0",
            "--id", name]  # fmt: skip
    log = workdir / f"{name}.log"
    with open(log, "wb") as err:
        popen = subprocess.Popen(args, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=err,
                                 start_new_session=True)  # fmt: skip
    return Proc(popen, log)


def _stuck(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", "--db", url, "stuck"],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.slow
def test_a_frozen_writer_is_named_bounded_and_nothing_is_lost(tmp_path: Path) -> None:
    """SIGSTOP inside a transactional step: start(timeout=2) fails in bounds naming the stopped
    pid and run, the other worker warns, stuck and /readyz report it; SIGCONT: all complete."""
    db = tmp_path / "stall.db"
    url = f"sqlite:///{db}"
    mark = tmp_path / "mark.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STALL_MARK": str(mark), "STALL_HOLD": "1.5",
           "PERDURE_LOG_FORMAT": "console"}  # fmt: skip
    env.pop("PERDURE_DB", None)
    app = _load(url)
    procs: list[Proc] = []
    frozen: int | None = None
    try:
        procs = [_spawn(url, tmp_path, f"w{i}", env) for i in range(2)]
        for proc in procs:
            proc.wait_ready()
        before = [app.start("quick", i, run_id=f"quick-before-{i}").id for i in range(QUICK)]
        for run_id in before:
            assert app.handle(run_id).result(timeout=30) == 2 * int(run_id.rsplit("-", 1)[1])
        app.start("held", 7, run_id="held-1")
        entry = wait_for("the step", lambda: mark.exists() and mark.read_text().strip(), timeout=30)
        holder = json.loads(entry.splitlines()[0])
        os.kill(holder["pid"], signal.SIGSTOP)
        frozen = holder["pid"]
        stopped_at = time.monotonic()
        other = next(p for p in procs if p.pid != frozen)
        assert holder["run"] == "held-1"

        # 1. a bounded start fails in bounds, naming the stopped holder and its run
        probe = _load(url)  # its own store connection: the test app's stays usable
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            probe.start("quick", 99, run_id="quick-refused", timeout=2)
        took = time.monotonic() - began
        message = str(refused.value)
        print(f"\nstart(timeout=2) raised after {took:.2f}s: {message}")
        assert took >= 2.0
        assert process_state(frozen) == "stopped (SIGSTOP)"  # it gave up, the lock still held
        assert "locked for more than 2s" in message
        assert f"pid {frozen}" in message and "stopped (SIGSTOP)" in message
        assert "held-1" in message and "hold_lock" in message
        assert "nothing was written" in message

        # 2. unbounded starts from another thread wait (they complete after SIGCONT)
        during: list[str] = []
        starter = threading.Thread(
            target=lambda: during.extend(
                probe.start("quick", 100 + i, run_id=f"quick-during-{i}").id for i in range(QUICK)
            )
        )
        starter.start()

        # 3. the other worker's log names the stopped pid and the run
        def warned() -> str | None:
            text = other.stderr()
            lines = [ln for ln in text.splitlines() if "waiting" in ln and "write lock" in ln]
            return next((ln for ln in lines if f"pid {frozen}" in ln and "held-1" in ln), None)

        warning = wait_for("the other worker's warning", warned, timeout=30)
        print(f"other worker warned: {warning.strip()}")
        assert "stopped (SIGSTOP)" in warning

        # 4. `perdure stuck` and /readyz report the held lock (held longer than 5 s)
        wait_for("the lock to be 5 s old", lambda: time.monotonic() - stopped_at > 5.5, timeout=10)
        stuck = _stuck(url, env)
        print(f"perdure stuck (exit {stuck.returncode}): {stuck.stdout.strip()}")
        assert stuck.returncode == 1, stuck.stdout + stuck.stderr
        assert f"pid {frozen}" in stuck.stdout and "stopped (SIGSTOP)" in stuck.stdout
        assert "held-1" in stuck.stdout and "since" in stuck.stdout
        server = _load(url)
        with TestClient(create_app(server)) as client:
            ready = client.get("/readyz")
            print(f"/readyz {ready.status_code}: {ready.json()}")
            assert ready.status_code == 503
            assert f"pid {frozen}" in ready.json()["error"]
            wait_for("the freeze", lambda: time.monotonic() - stopped_at > FREEZE, timeout=FREEZE)
            os.kill(frozen, signal.SIGCONT)
            frozen = None

            # 5. everything proceeds: the held run, the waiting starts, every quick run
            assert app.handle("held-1").result(timeout=60) == 7
            starter.join(60)
            assert not starter.is_alive() and len(during) == QUICK
            results = [app.handle(r).result(timeout=60) for r in during]
            assert results == [2 * (100 + i) for i in range(QUICK)]
            wait_for(
                "/readyz to clear", lambda: client.get("/readyz").status_code == 200, timeout=10
            )
        assert app.get_run("held-1").status == COMPLETED
        with sqlite3.connect(db) as conn:
            ledger = conn.execute("SELECT run, n FROM stall_ledger").fetchall()
        assert ledger == [("held-1", 7)]  # the transactional effect: exactly once
        with pytest.raises(perdure.RunNotFound):
            app.get_run("quick-refused")  # the refused start wrote nothing
        clear = _stuck(url, env)
        assert clear.returncode == 0, clear.stdout + clear.stderr
        got = wait_for(
            "the all-clear", lambda: "got the write lock after" in other.stderr(), timeout=10
        )
        assert got
        runs = app.list_runs(limit=1000)
        statuses = [r.status for r in runs]
        print(
            f"runs: {len(runs)} ({statuses.count(COMPLETED)} completed), ledger rows "
            f"{len(ledger)}, refused starts 1, waiting starts {len(during)} (all done)"
        )
        assert statuses.count(COMPLETED) == len(runs) == 2 * QUICK + 1
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.popen.kill()
                proc.popen.wait()
