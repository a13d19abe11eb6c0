"""A worker of this host whose process is gone loses its leases at once; a live one never."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import perdure
from perdure.engine.peers import dead_owner, pid_gone

APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import perdure

    app = perdure.App(os.environ["PEERS_DB"])
    HERE = Path(os.environ["PEERS_DIR"])

    @app.step(effect="idempotent")
    def hold() -> int:
        (HERE / f"entered-{os.getpid()}").write_text("")
        while not (HERE / "go").exists():
            time.sleep(0.05)
        return os.getpid()

    @app.workflow()
    def held() -> int:
        return hold()
    """
)


def test_own_and_foreign_host_owners_are_never_dead() -> None:
    """This process, another host and a malformed owner are never treated as gone."""
    me = f"h:{os.getpid()}:abc"
    assert not pid_gone(os.getpid())
    assert not dead_owner(me, me, "h")
    assert not dead_owner(f"other:{2**22 + 7}:x", me, "h")
    assert not dead_owner("h:not-a-pid:x", me, "h")


def test_a_reaped_or_zombie_child_is_gone() -> None:
    """A finished child is gone once reaped, and already while it is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not pid_gone(child.pid):  # zombie until waited
        time.sleep(0.02)
    assert pid_gone(child.pid)
    child.wait()
    assert pid_gone(child.pid)


def _worker(workdir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "perdure", "--app", "peers_app:app", "worker",
               "--lease", "60", "--poll", "0.1"]  # fmt: skip
    log = open(workdir / "worker.log", "ab")  # noqa: SIM115 - the worker's log while it runs
    return subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=log)


@pytest.mark.slow
def test_kill_minus_nine_is_recovered_before_the_lease_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A is killed inside a step; B takes the run over long before A's 60 s lease."""
    (tmp_path / "peers_app.py").write_text(APP)
    db = f"sqlite:///{tmp_path / 'peers.db'}"
    env = {**os.environ, "PEERS_DB": db, "PEERS_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    for name in ("PEERS_DB", "PEERS_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.syspath_prepend(str(tmp_path))
    app: perdure.App = importlib.import_module("peers_app").app
    a = _worker(tmp_path, env)
    b: subprocess.Popen[bytes] | None = None
    try:
        app.start("held", run_id="r")
        deadline = time.monotonic() + 30
        while not (tmp_path / f"entered-{a.pid}").exists():
            assert time.monotonic() < deadline and a.poll() is None, tmp_path / "worker.log"
            time.sleep(0.05)
        lease_until = app.get_run("r").lease_until
        assert lease_until is not None
        a.send_signal(signal.SIGKILL)
        a.wait()
        b = _worker(tmp_path, env)
        while not (tmp_path / f"entered-{b.pid}").exists():
            assert time.monotonic() < deadline + 30 and b.poll() is None, "B never took over"
            time.sleep(0.05)
        (tmp_path / "go").write_text("")
        assert app.handle("r").result(timeout=30) == b.pid
        recovered = [e for e in app.journal("r") if e.kind == "run.recovered"]
        assert len(recovered) == 1
        assert json.loads(recovered[0].data or "{}")["from"].split(":")[1] == str(a.pid)
        assert recovered[0].at < lease_until  # taken over because A was gone, not expired
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
        app.close()
        sys.modules.pop("peers_app", None)


def test_a_chosen_id_is_found_dead_through_the_worker_registry() -> None:
    """An owner named by a chosen id is judged by the host and pid it registered: gone on
    this host means dead; alive, another host or unregistered means not."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    here = "h"
    registry = {
        "gone": (here, child.pid),
        "alive": (here, os.getppid()),
        "far": ("x", child.pid),
    }
    me = f"{here}:{os.getpid()}:me"
    assert dead_owner("gone", me, here, registry)
    assert not dead_owner("alive", me, here, registry)
    assert not dead_owner("far", me, here, registry)
    assert not dead_owner("unknown", me, here, registry)


def test_how_a_lost_holder_left_is_told_apart() -> None:
    """The needs_attention reason says what recovery can know of the intent's writer: its
    process gone (died), stopped, alive yet cut off (same host), reporting or silent
    (another host), never just "crashed"."""
    import asyncio
    import socket
    import tempfile

    from perdure.engine.peers import SILENT_AFTER, how_lost
    from perdure.store.workers_sql import WorkerRow

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = socket.gethostname()
    with tempfile.TemporaryDirectory() as folder:
        app = perdure.App(f"sqlite:///{folder}/peers.db")
        try:
            now = 10_000.0
            rows = [
                WorkerRow("stopper", host, os.getppid(), 1.0, now, 4, 0),
                WorkerRow("far-live", "elsewhere", 1234, 1.0, now - 5, 4, 1),
                WorkerRow("far-silent", "elsewhere", 1234, 1.0, now - 600, 4, 1),
            ]
            for row in rows:
                app.runtime.sync(app.runtime.store.worker_beat(row), "beat")
            stopped = WorkerRow("stopper", host, os.getppid(), 1.0, now, 4, 0, stopped_at=now - 5)
            app.runtime.sync(app.runtime.store.worker_beat(stopped), "stopped")

            def why(owner: str | None) -> str:
                return asyncio.run(how_lost(app.runtime.store, owner, now, SILENT_AFTER))

            assert why(f"{host}:{child.pid}:abc").endswith(f"died (process {child.pid} is gone)")
            assert "is alive but lost its lease" in why(f"{host}:{os.getppid()}:abc")
            assert why("stopper") == "its worker stopper stopped"
            assert "still reports but lost its lease" in why("far-live")
            assert "went silent" in why("far-silent")
            assert why("nobody-knows").startswith("its worker nobody-knows was lost")
            # a worker restarted with --id finds its own id on the intent: an earlier process
            store = app.runtime.store
            reused = asyncio.run(
                how_lost(store, "far-live", now, SILENT_AFTER, me="far-live", written_at=0.5)
            )
            assert "was restarted under the same id" in reused
            assert "still reports" not in reused
            # ... unless the intent is younger than the asker's start: it cut itself off
            itself = asyncio.run(
                how_lost(store, "far-live", now, SILENT_AFTER, me="far-live", written_at=now - 9)
            )
            assert "(this one) is alive but lost its lease" in itself
        finally:
            app.close()


def test_a_reused_pid_is_dead_and_a_stopped_process_is_not() -> None:
    """A registered process of this host is dead once its pid is gone or names a process
    that started at another time (reused); a SIGSTOPped one is alive; a worker recorded under
    another kernel boot (another machine of the same name) or another host cannot be judged."""
    import socket

    from perdure.engine.peers import process_dead, start_ticks, this_process
    from perdure.store.workers_sql import WorkerRow

    me = this_process()
    assert me is not None, "this process's identity comes from Linux /proc, which perdure needs"
    boot, _, rest = me.partition("/")
    namespace = rest.rpartition("/")[0]
    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = start_ticks(child.pid)
        assert started is not None

        def row(pid: int, start: str, *, on: str = host, booted: str = boot) -> WorkerRow:
            return WorkerRow("w", on, pid, 1.0, 1.0, 4, 0, proc=f"{booted}/{namespace}/{start}")

        assert not process_dead(row(child.pid, started), host)
        child.send_signal(signal.SIGSTOP)
        assert not process_dead(row(child.pid, started), host)  # frozen is alive
        child.send_signal(signal.SIGCONT)
        assert process_dead(row(child.pid, str(int(started) - 1)), host)  # pid reused
        assert not process_dead(row(child.pid, "1", booted="another-boot"), host)
        assert not process_dead(row(child.pid, "1", on="elsewhere"), host)
        assert not process_dead(row(os.getpid(), me.rpartition("/")[2]), host)  # this process
        assert process_dead(row(os.getpid(), "1"), host)  # an earlier life of this pid
    finally:
        child.kill()
        child.wait()
    assert process_dead(row(child.pid, started), host)


HOLDER = textwrap.dedent(
    """
    import asyncio, sys, time
    from perdure.store.postgres import PostgresStore
    from perdure.store.workers_sql import WorkerRow

    async def main() -> None:
        store = PostgresStore(sys.argv[1])
        await store.open()
        row = WorkerRow("holder", "elsewhere", 1, time.time(), time.time(), 1, 0)
        await store.worker_beat(row)
        await store.worker_session(row)
        print("locked", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_session_lock_proves_death_only_when_its_session_is_gone() -> None:
    """On PostgreSQL a worker of another host is proven dead by its free session lock: not
    while it lives, is SIGSTOPped, or re-takes its lock after the server cut its session; not
    for a lock taken before the server (re)started; only once its process is killed, then
    its run is handed back at once (two checks CONFIRM apart)."""
    import secrets

    import psycopg

    from perdure.engine.peers import CONFIRM, PeerWatch

    pg = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"peers_{secrets.token_hex(4)}"
    app = perdure.App(f"{pg}?schema={schema}")
    holder: subprocess.Popen[str] | None = None

    @app.workflow()
    def w() -> None:
        return None

    def registry(sql: str = "SELECT lock_key FROM workers WHERE id = 'holder'") -> object:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            row = conn.execute(sql).fetchone()
            return None if row is None else row[0]

    try:
        app.start(w, run_id="held")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, f"{pg}?schema={schema}"],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        name = app.get_run("held").workflow
        claimed = app.runtime.sync(
            app.runtime.store.claim("holder", time.time(), 60.0, 1, [name]), "claim"
        )
        assert [c.run.id for c in claimed] == ["held"]
        peers = PeerWatch(app.runtime.store, "me", sessions=True)

        def two_checks() -> int:
            released = app.runtime.sync(peers.check(time.time()), "check")
            time.sleep(CONFIRM + 0.05)
            return released + app.runtime.sync(peers.check(time.time()), "check")

        assert two_checks() == 0  # alive
        holder.send_signal(signal.SIGSTOP)
        assert two_checks() == 0  # frozen: its session stays open
        first_key = registry()
        registry("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                 f"WHERE application_name = 'perdure-lock:{schema}'")  # fmt: skip
        # the server cut the frozen worker's session: its lock is free, but only once so far
        assert app.runtime.sync(peers.check(time.time()), "check") == 0
        holder.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while registry() in (None, first_key):  # it takes a new lock as it wakes
            assert time.monotonic() < deadline, "the holder never took a new lock"
            time.sleep(0.02)
        time.sleep(CONFIRM)
        assert two_checks() == 0  # re-taken: a reconnect, not a death
        registry("UPDATE workers SET lock_server = lock_server - 1 RETURNING id")
        holder.kill()
        holder.wait()
        assert two_checks() == 0  # a lock taken under an earlier server life proves nothing
        assert (app.get_run("held").lease_until or 0) > time.time()
        registry("UPDATE workers SET lock_server = lock_server + 1 RETURNING id")
        assert two_checks() == 1  # its session is gone: its run is handed back
        assert app.get_run("held").lease_until == 0
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        app.close()
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
