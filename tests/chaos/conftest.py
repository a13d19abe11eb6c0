"""Fixtures for the chaos tests: the chaos app module and a pool of real worker processes."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from private_pg import PrivateServer, wait_pg_up

from module_files import load_file

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "chaos_app.py"


def _load_chaos_app() -> ModuleType:
    return load_file("perdure_chaos_app", SCRIPT)


@pytest.fixture(scope="session")
def chaos_app() -> ModuleType:
    """The chaos app module (tests/chaos/chaos_app.py), loaded by path."""
    return _load_chaos_app()


class WorkerPool:
    """Worker processes running chaos_app.py on one workdir; every one is reaped at the end."""

    def __init__(self, workdir: Path, *, concurrency: int, lease: float) -> None:
        self.workdir = workdir
        self.concurrency = concurrency
        self.lease = lease
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def spawn(
        self,
        role: str = "",
        *,
        prefix: list[str] | None = None,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> subprocess.Popen[bytes]:
        """A worker process; `prefix` runs it through another command (`ip netns exec NS`),
        `env` adds to its environment."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "CHAOS_ROLE": role, **(env or {})}
        env.pop("PERDURE_DB", None)
        args = [
            *(prefix or []),
            sys.executable,
            str(SCRIPT),
            str(self.workdir),
            "--concurrency",
            str(options.get("concurrency", self.concurrency)),
            "--lease",
            str(options.get("lease", self.lease)),
            "--poll",
            "0.05",
            "--grace",
            str(options.get("grace", 3.0)),
        ]
        log = self.workdir / "logs" / f"worker-{len(self.procs)}-{role or 'x'}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def log_text(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """kill -9: no drain, no lease release, nothing flushed."""
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
        """SIGTERM and wait for the worker to drain and exit; returns its exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def reap(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


@pytest.fixture
def worker_pool(tmp_path: Path) -> Iterator[Callable[..., WorkerPool]]:
    """Make WorkerPools on a workdir; all their processes are killed when the test ends."""
    pools: list[WorkerPool] = []

    def make(workdir: Path, *, concurrency: int = 6, lease: float = 1.0) -> WorkerPool:
        pool = WorkerPool(workdir, concurrency=concurrency, lease=lease)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.reap()


@pytest.fixture
def pg_server(tmp_path: Path) -> Iterator[PrivateServer]:
    """This test's own PostgreSQL server, destroyed afterwards (its log kept in tmp_path)."""
    server = PrivateServer()
    why = server.missing()
    if why is not None:  # the PostgreSQL suites run in CI too: a machine without it fails, loudly
        shutil.rmtree(server.root, ignore_errors=True)
        pytest.fail(why)
    try:
        server.init()
        server.start()
        wait_pg_up(server.url, 60)
        yield server
    finally:
        if server.log.exists():
            shutil.copy(server.log, tmp_path / "postgresql.log")
        server.destroy()


@pytest.fixture
def pg_chaos_url(pg_server: PrivateServer) -> str:
    """A schema on the test's own server (the whole server is thrown away afterwards)."""
    return f"{pg_server.url}?schema=chaos_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's random choices, printed: CHAOS_SEED if set (to replay a
    failure), else a new one."""
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 30))
    print(f"{request.node.name}: seed {seed} (set CHAOS_SEED to replay its choices)")
    return seed


@pytest.fixture
def wait_until() -> Callable[[Callable[[], object], float, str], None]:
    """Wait for `predicate` to hold, polling every 50 ms; fail naming `what` after `seconds`."""

    def wait(predicate: Callable[[], object], seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"waited {seconds:g}s for {what}")
            time.sleep(0.05)

    return wait
