"""A store, the stop_app shop on it, and `perdure worker` processes to signal (graceful-stop tests).

Not a test module: test_graceful_stop.py and tests/cli/test_workers_cli.py drive it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from perdure.store.base import NEEDS_ATTENTION, TERMINAL, Entry
from waits import wait_for

HERE = Path(__file__).resolve().parent
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def load_stop_app() -> Any:
    """tests/chaos/stop_app.py as a module, loaded by path."""
    spec = importlib.util.spec_from_file_location("perdure_stop_app", HERE / "stop_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Proc:
    """One `perdure worker` process: its stdout lines, its stderr log, its exit."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.popen = popen
        self.log = log
        self.pid = popen.pid
        self.stdout: list[str] = []
        self.signalled_at: float | None = None

    def read_line(self, timeout: float) -> str | None:
        """The next stdout line, or None if none came within `timeout` (or stdout closed)."""
        out = self.popen.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            return None
        line = out.readline().decode()
        if not line:
            return None
        self.stdout.append(line)
        return line

    def wait_ready(self, timeout: float = 20.0) -> str:
        line = self.read_line(timeout)
        assert line is not None, f"no ready line within {timeout}s:\n{self.stderr()}"
        return line

    def signal(self, sig: int) -> None:
        self.signalled_at = self.signalled_at or time.monotonic()
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 30.0) -> tuple[int, float]:
        """Exit code, and seconds from the first signal to the exit."""
        code = self.popen.wait(timeout=timeout)
        took = time.monotonic() - (self.signalled_at or time.monotonic())
        rest = self.popen.stdout.read().decode() if self.popen.stdout else ""
        self.stdout.extend(rest.splitlines(keepends=True))
        return code, took

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


class Shop:
    """The stop_app shop on one store, and the worker processes started on it."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.ledger_path = workdir / "ledger.jsonl"
        self.app: perdure.App = load_stop_app().build(url)
        self.procs: list[Proc] = []

    def spawn(self, *, grace: float, worker_id: str | None = None, lease: float = 30.0) -> Proc:
        """Start `perdure worker` (a long lease: only a release lets another worker go on)."""
        args = [sys.executable, "-m", "perdure", "--app", "stop_app:app", "--db", self.url,
                "worker", "--grace", str(grace), "--lease", str(lease), "--poll", "0.05",
                "--gc-every", "0", "--concurrency", "4"]  # fmt: skip
        if worker_id is not None:
            args += ["--id", worker_id]
        env = {**os.environ, "STOP_LEDGER": str(self.ledger_path), "PYTHONUNBUFFERED": "1"}
        env.pop("PERDURE_DB", None)
        log = self.workdir / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as err:
            popen = subprocess.Popen(args, cwd=HERE, env=env, stdout=subprocess.PIPE,
                                     stderr=err, start_new_session=True)  # fmt: skip
        proc = Proc(popen, log)
        self.procs.append(proc)
        return proc

    def ledger(self) -> list[dict[str, Any]]:
        if not self.ledger_path.exists():
            return []
        return [json.loads(x) for x in self.ledger_path.read_text().splitlines() if x]

    def started(self, step: str, pid: int | None = None) -> list[dict[str, Any]]:
        """Ledger lines of `step` bodies that started (in process `pid`, if given)."""
        return [
            e
            for e in self.ledger()
            if e["step"] == step and e["phase"] == "start" and pid in (None, e["pid"])
        ]

    def wait_started(self, step: str, count: int = 1, timeout: float = 20.0) -> None:
        wait_for(f"step {step} to start", lambda: len(self.started(step)) >= count, timeout=timeout)

    def journal(self, run_id: str) -> list[Entry]:
        return self.app.journal(run_id)

    def status(self, run_id: str) -> str:
        return self.app.handle(run_id).status()

    def settle(self, run_id: str, timeout: float = 20.0) -> str:
        """Run a fresh worker until the run is final or needs_attention; stop it; the status."""
        proc = self.spawn(grace=5.0)
        proc.wait_ready()
        status = wait_for(
            f"run {run_id} to settle",
            lambda: (s := self.status(run_id)) in (*TERMINAL, NEEDS_ATTENTION) and s,
            timeout=timeout,
        )
        proc.signal(signal.SIGTERM)
        proc.wait()
        return str(status)

    def reap(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait()
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()
        self.app.close()
