"""The refund crash bench's plumbing: the outside world (stubs and the scripted model), the
stores, the worker processes and the killer. bench/refunds.py runs trials with it."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import PYTHON, ROOT

EXAMPLE = ROOT / "examples" / "refund_agent"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))  # the refund agent's modules, as its demo imports them

from refund_model import ScriptedModelServer  # noqa: E402
from refund_outside import MailStub, PaymentsStub, Probe  # noqa: E402

PG_SERVER = os.environ.get("PERDURE_BENCH_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
DB_PREFIX = "perdure_refunds_"  # the only databases this bench creates or drops


class World:
    """The payments and mail stubs and the scripted model server, fresh for one trial (`model`:
    another started server with `base_url`, `snapshot()` and `stop()`, e.g. the Claude one)."""

    def __init__(self, model: Any = None) -> None:
        self.payments = PaymentsStub().start()
        self.mail = MailStub().start()
        self.model = model or ScriptedModelServer().start()

    def env(self) -> dict[str, str]:
        """What a worker process needs to find them."""
        return {
            "REFUND_PAYMENTS_URL": self.payments.url,
            "REFUND_MAIL_URL": self.mail.url,
            "REFUND_MODEL": self.model.base_url,
        }

    def open_calls(self, pid: int) -> list[Probe]:
        """Tool bodies process `pid` is inside of now."""
        return self.payments.open_calls(pid) + self.mail.open_calls(pid)

    def stop(self) -> None:
        for server in (self.payments, self.mail, self.model):
            server.stop()


@dataclass
class Store:
    """A fresh store for one trial: a SQLite file, or a PostgreSQL database of its own."""

    kind: str
    url: str
    database: str | None = None

    @classmethod
    def create(cls, kind: str, folder: Path) -> Store:
        if kind == "sqlite":
            return cls(kind, f"sqlite:///{folder}/refunds.db")
        if kind != "postgres":
            raise SystemExit(f"unknown store {kind!r}: use sqlite or postgres")
        import psycopg

        name = f"{DB_PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=10) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return cls(kind, f"{PG_SERVER}/{name}", name)

    def drop(self) -> None:
        if self.database is None:
            return
        if not self.database.startswith(DB_PREFIX):
            raise ValueError(f"refusing to drop {self.database!r}: not one of the bench's own")
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=10) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


class Workers:
    """`count` worker processes running `command`; one can be `kill -9`ed and restarted."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, logs: Path,
                 count: int) -> None:  # fmt: skip
        self.command = command
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("PERDURE_DB", None)  # only the store the trial names
        self.env.update(env)
        self.cwd = cwd
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_of: dict[int, Path] = {}
        self.spawned = 0
        for _ in range(count):
            self.procs.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{self.spawned}.log"
        self.spawned += 1
        with log.open("wb") as out:
            proc = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.log_of[proc.pid] = log
        return proc

    def ready(self) -> list[int]:
        """Slots whose process is up and said `ready` (claiming work)."""
        return [
            i
            for i, p in enumerate(self.procs)
            if p.poll() is None and b"ready" in self.log_of[p.pid].read_bytes()
        ]

    def pid(self, slot: int) -> int:
        return self.procs[slot].pid

    def kill_and_restart(self, slot: int) -> None:
        """kill -9 (no drain, no lease handed back), then a fresh process in its place."""
        proc = self.procs[slot]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs[slot] = self._spawn()

    def died(self) -> list[str]:
        """Logs of processes that exited without being killed (a crash of the worker itself)."""
        return [self.log_of[p.pid].read_text(errors="replace")[-2000:]
                for p in self.procs if p.poll() not in (None, -signal.SIGKILL)]  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class Kill:
    """One kill -9: whose, and which tool bodies it cut short."""

    pid: int
    at: float
    in_tools: tuple[Probe, ...]


@dataclass
class Chaos:
    """Kills a ready worker every `every` seconds (uniform), `kills_wanted` times, while it
    releases the conversations: enough to keep every worker slot busy (`backlog` released
    and unsettled), and no faster than the kills go (kill k allows the first (k+1)/K of
    them), so each kill lands on busy workers; the last waits for the last kill."""

    workers: Workers
    world: World
    every: tuple[float, float]
    kills_wanted: int
    backlog: int
    rng: random.Random
    kills: list[Kill] = field(default_factory=list)

    def run(self, release: list[Callable[[], None]], unsettled: Callable[[], int],
            on_kill: Callable[[int], None], timeout: float) -> bool:  # fmt: skip
        """Release, kill and wait; True if everything settled within `timeout` seconds."""
        start = time.monotonic()
        pending = list(release)
        total = len(release)
        next_kill = start + self.rng.uniform(*self.every)
        next_check = start
        while True:
            now = time.monotonic()
            if now >= next_check:
                open_now = unsettled()
                if not pending and open_now == 0:
                    return True
                allowed = -(-total * (len(self.kills) + 1) // max(1, self.kills_wanted))
                while pending and open_now < self.backlog and total - len(pending) < allowed:
                    if len(pending) == 1 and not self.enough():
                        break
                    pending.pop(0)()
                    open_now += 1
                next_check = now + 0.1
            if now >= next_kill and not self.enough():
                ready = self.workers.ready()
                if ready:
                    slot = self.rng.choice(ready)
                    pid = self.workers.pid(slot)
                    cut = tuple(self.world.open_calls(pid))
                    self.workers.kill_and_restart(slot)
                    self.kills.append(Kill(pid, now - start, cut))
                    on_kill(pid)
                    next_kill = time.monotonic() + self.rng.uniform(*self.every)
            if now - start > timeout:
                return False
            time.sleep(0.01)

    def enough(self) -> bool:
        return len(self.kills) >= self.kills_wanted


def perdure_worker_command(concurrency: int, app: str = "refund_worker:app") -> list[str]:
    """`perdure worker` on the refund app. A long lease: a killed worker is seen dead by its
    pid at once; no recovery limit, since this killer would make any run look poisonous."""
    return [PYTHON, "-m", "perdure", "--app", app, "worker",
            "--concurrency", str(concurrency), "--poll", "0.05", "--lease", "30",
            "--max-recoveries", "-1", "--gc-every", "0", "--grace", "2"]  # fmt: skip


def plain_worker_command(framework: str, queue: Path, concurrency: int) -> list[str]:
    return [PYTHON, "-m", "bench.refunds", "--plain-worker", framework, "--queue", str(queue),
            "--concurrency", str(concurrency)]  # fmt: skip


def load() -> str:
    """The machine's load average, for the header."""
    one, five, _ = os.getloadavg()
    return f"{one:.1f} {five:.1f}"


def describe(value: Any) -> str:
    return "-" if value is None else str(value)
