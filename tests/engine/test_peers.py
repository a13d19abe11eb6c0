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
                app.sync(app.store.worker_beat(row), "beat")
            app.sync(app.store.worker_stopped("stopper", now - 5), "stopped")

            def why(owner: str | None) -> str:
                return asyncio.run(how_lost(app.store, owner, now, SILENT_AFTER))

            assert why(f"{host}:{child.pid}:abc").endswith(f"died (process {child.pid} is gone)")
            assert "is alive but lost its lease" in why(f"{host}:{os.getppid()}:abc")
            assert why("stopper") == "its worker stopper stopped"
            assert "still reports but lost its lease" in why("far-live")
            assert "went silent" in why("far-silent")
            assert why("nobody-knows").startswith("its worker nobody-knows was lost")
        finally:
            app.close()
