"""After kill -9, a worker's runs are taken over at once, not after its lease; a frozen
worker's runs wait for its lease. Real `perdure worker` processes with default settings,
on SQLite and on PostgreSQL (same host: the pid proves death; another host, made with a
UTS namespace of another name: the session lock does)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from waits import wait_for

PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
LEASE = 30.0  # the default lease: the takeover must come long before it ends
RUNS = 100

APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import perdure

    app = perdure.App(os.environ["FAST_DB"])
    HERE = Path(os.environ["FAST_DIR"])

    @app.step(effect="idempotent")
    def hold(i: int) -> int:
        (HERE / "entered" / f"{os.getpid()}-{i}").write_text("")
        while not (HERE / "go").exists():
            time.sleep(0.02)
        return os.getpid()

    @app.workflow()
    def held(i: int) -> int:
        return hold(i)
    """
)

Where = tuple[str, str]  # (store, host): the store kind, and "same" or "other" host


def _other_host_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--uts", "sh", "-c", "hostname perdure-elsewhere"], capture_output=True
    )
    return probe.returncode == 0


WHERE = [
    pytest.param(("sqlite", "same"), id="sqlite"),
    pytest.param(("postgres", "same"), id="postgres", marks=pytest.mark.postgres),
    pytest.param(
        ("postgres", "other"),
        id="postgres-other-host",
        marks=[
            pytest.mark.postgres,
            pytest.mark.skipif(not _other_host_works(), reason="needs unshare --uts (root)"),
        ],
    ),
]


class Setup:
    """The app's folder, its store, and the worker processes started on it."""

    def __init__(self, folder: Path, url: str) -> None:
        self.folder = folder
        self.url = url
        (folder / "entered").mkdir()
        (folder / "fast_app.py").write_text(APP)
        path = os.pathsep.join([str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env = {**os.environ, "FAST_DB": url, "FAST_DIR": str(folder), "PYTHONPATH": path,
                    "PYTHONUNBUFFERED": "1"}  # fmt: skip
        self.env.pop("PERDURE_DB", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, name: str, *options: str, other_host: bool = False) -> subprocess.Popen[bytes]:
        """`perdure worker` with `options` (else defaults); `other_host`: in a UTS namespace
        whose host name is not this host's, so only its session can prove it dead."""
        command = [sys.executable, "-m", "perdure", "--app", "fast_app:app", "worker", *options]
        if other_host:
            command = ["unshare", "--uts", "sh", "-c",
                       'hostname perdure-elsewhere && exec "$@"', "sh", *command]  # fmt: skip
        with open(self.folder / f"worker-{name}.log", "wb") as log:
            proc = subprocess.Popen(command, cwd=self.folder, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        self.procs.append(proc)
        return proc

    def app(self) -> perdure.App:
        """The app itself, as the workers build it (its workflow known to this process)."""
        saved = {k: os.environ.get(k) for k in ("FAST_DB", "FAST_DIR")}
        os.environ.update(FAST_DB=self.url, FAST_DIR=str(self.folder))
        try:
            spec = importlib.util.spec_from_file_location("fast_app", self.folder / "fast_app.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        app: perdure.App = module.app
        return app

    def entered(self, proc: subprocess.Popen[bytes]) -> int:
        mine = f"{proc.pid}-"
        return sum(1 for p in (self.folder / "entered").iterdir() if p.name.startswith(mine))

    def log(self, name: str) -> str:
        return (self.folder / f"worker-{name}.log").read_text(errors="replace")[-3000:]

    def reap(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with_cont(proc)
                proc.kill()
            proc.wait(timeout=30)


def with_cont(proc: subprocess.Popen[bytes]) -> None:
    """Let a stopped process run again (a SIGSTOPped one cannot die of SIGTERM)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


@pytest.fixture
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[Where], Setup]]:
    made: list[Setup] = []
    schemas: list[str] = []

    def make(where: Where) -> Setup:
        if where[0] == "sqlite":
            url = f"sqlite:///{tmp_path / 'fast.db'}"
        else:
            schema = f"fast_recovery_{secrets.token_hex(4)}"
            schemas.append(schema)
            url = f"{PG_URL}?schema={schema}"
        made.append(Setup(tmp_path, url))
        return made[-1]

    try:
        yield make
    finally:
        for s in made:
            s.reap()
        for schema in schemas:
            import psycopg

            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def recovered(app: perdure.App, run_id: str) -> list[tuple[float, str]]:
    """(when, from whom) of each takeover the run's journal records."""
    return [
        (e.at, json.loads(e.data or "{}").get("from", ""))
        for e in app.journal(run_id)
        if e.kind == "run.recovered"
    ]


def completed(app: perdure.App, most: int) -> int:
    return len(app.list_runs(statuses=["completed"], limit=most))


def lease_ends(app: perdure.App, ids: list[str]) -> dict[str, float]:
    ends = {}
    for run_id in ids:
        until = app.get_run(run_id).lease_until
        assert until is not None
        ends[run_id] = until
    return ends


def freeze(proc: subprocess.Popen[bytes], url: str) -> None:
    """SIGSTOP `proc` outside an SQLite write (a frozen commit would block every worker)."""
    if not url.startswith("sqlite:///"):
        os.kill(proc.pid, signal.SIGSTOP)
        return
    for _ in range(50):
        os.kill(proc.pid, signal.SIGSTOP)
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            conn.close()
    pytest.fail("could not freeze the worker outside a store transaction")


@pytest.mark.slow
@pytest.mark.parametrize("b_is", ["restarted", "live"])
@pytest.mark.parametrize("where", WHERE)
def test_kill_minus_nine_is_taken_over_at_once(
    where: Where, b_is: str, setup: Callable[[Where], Setup]
) -> None:
    """A (default lease) holds 100 runs inside a step and is killed -9; B, with default
    settings, started after the kill (restarted) or already running idle (live), finishes
    all 100 while A's leases still had more than 20 s to run, each run recovered from A."""
    s = setup(where)
    app = s.app()
    try:
        ids = [app.start("held", i, run_id=f"r{i}").id for i in range(RUNS)]
        a = s.worker("a", "--concurrency", "128", other_host=where[1] == "other")
        wait_for(
            "A to hold 100 runs",
            lambda: s.entered(a) == RUNS or a.poll() is not None,
            timeout=60,
            every=0.01,
        )
        assert a.poll() is None, s.log("a")
        ends = lease_ends(app, ids)
        if b_is == "live":
            b = s.worker("b")
            wait_for(
                "B",
                lambda: "ready worker=" in s.log("b") or b.poll() is not None,
                timeout=30,
                every=0.01,
            )
        a.send_signal(signal.SIGKILL)
        a.wait()
        killed = time.time()
        (s.folder / "go").write_text("")
        if b_is == "restarted":
            b = s.worker("b")
        done = 0
        while done < RUNS:
            assert time.time() < killed + LEASE - 10, f"not recovered in time:\n{s.log('b')}"
            assert b.poll() is None, s.log("b")
            done = completed(app, RUNS)
            time.sleep(0.02)
        finished = time.time()
        lefts = []
        for run_id in ids:
            takeovers = recovered(app, run_id)
            assert len(takeovers) == 1, (run_id, takeovers)
            at, source = takeovers[0]
            assert source.split(":")[1:2] == [str(a.pid)], source  # host:pid:random of A
            lefts.append(ends[run_id] - at)
        assert min(lefts) > 20.0, f"a takeover came only {min(lefts):.1f}s before the lease end"
        print(f"\n[{where[0]}, {where[1]} host, {b_is} B] kill -9 -> 100 runs done: "
              f"{finished - killed:.2f}s; A's lease still had {min(lefts):.1f}-"
              f"{max(lefts):.1f}s to run at the takeovers")  # fmt: skip
    finally:
        app.close()


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
def test_a_frozen_worker_keeps_its_runs_until_its_lease_ends(
    where: Where, setup: Callable[[Where], Setup]
) -> None:
    """A (lease 6 s) holds 5 runs and is SIGSTOPped: it is alive (its pid, its session), so
    B, with default settings, takes nothing before A's leases end, then takes all 5; A,
    continued, writes nothing more (the epoch fence)."""
    s = setup(where)
    app = s.app()
    try:
        ids = [app.start("held", i, run_id=f"f{i}").id for i in range(5)]
        a = s.worker("a", "--lease", "6", other_host=where[1] == "other")
        wait_for(
            "A to hold 5 runs",
            lambda: s.entered(a) == 5 or a.poll() is not None,
            timeout=60,
            every=0.01,
        )
        assert a.poll() is None, s.log("a")
        freeze(a, s.url)
        stopped = time.time()
        ends = lease_ends(app, ids)  # read after the freeze: A renews nothing more
        (s.folder / "go").write_text("")
        b = s.worker("b")
        wait_for(
            "B to finish A's runs after A's lease",
            lambda: completed(app, 5) == 5 or b.poll() is not None,
            timeout=60,
            every=0.01,
        )
        assert b.poll() is None, s.log("b")
        waited = []
        for run_id in ids:
            takeovers = recovered(app, run_id)
            assert len(takeovers) == 1, (run_id, takeovers)
            assert takeovers[0][0] >= ends[run_id], "a frozen worker's run was taken early"
            waited.append(takeovers[0][0] - stopped)
            assert app.handle(run_id).result(timeout=10) == b.pid
        with_cont(a)
        time.sleep(1.0)  # A wakes, finds its leases gone, and writes nothing
        for run_id in ids:
            assert app.handle(run_id).result(timeout=10) == b.pid
            assert len(recovered(app, run_id)) == 1
        print(f"\n[{where[0]}, {where[1]} host] SIGSTOPped worker: its runs taken "
              f"{min(waited):.1f}-{max(waited):.1f}s after the stop (lease 6 s), none before "
              "its lease ended")  # fmt: skip
    finally:
        app.close()
