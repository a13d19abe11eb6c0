"""`perdure top`: workers from their leases, queues with their limits, running runs with their
current step, from the store alone."""

from __future__ import annotations

import re
import sys

import pytest

from extras_needed import needs

pytest.importorskip("rich", reason=needs("observe"))

from click.testing import CliRunner
from rich.console import Console

import perdure
from perdure.cli.main import cli
from perdure.observe.top import render, snapshot
from perdure.testing import SimulatedCrash, TestWorker


def running_store(app: perdure.App) -> tuple[str, str]:
    """A run held by a worker that died inside step `charge` (still `running`, its lease not
    yet expired) and a pending run in queue `mail`; returns (run id, worker id)."""
    app.queue("mail", concurrency=2, rate=(10, 60))

    @app.step(name="lookup", effect="read")
    def lookup() -> int:
        return 1

    @app.step(name="charge", effect="keyed")
    def charge(n: int) -> int:
        return n

    @app.workflow(name="pay")
    def pay() -> int:
        return charge(lookup())

    @app.workflow(name="notify", queue="mail")
    def notify() -> None:
        return None

    handle = app.start(pay, run_id="pay-7")
    dying = TestWorker(app, lease=30.0)
    dying.crash_after_intent("charge")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.start(notify, run_id="notify-1")
    assert dying.worker is not None and handle.status() == "running"
    return handle.id, dying.worker.id


def text_of(renderable: object) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_a_frame_shows_workers_queues_and_running_runs(app: perdure.App) -> None:
    """The holder of a lease is a worker; each queue counts its running and pending runs and
    shows its declared limits; a running run shows its workflow, worker and current step."""
    run_id, worker_id = running_store(app)
    frame = app.runtime.sync(snapshot(app.runtime), "top")
    assert [(w.id, w.runs) for w in frame.workers] == [(worker_id, 1)]
    assert 0 < frame.workers[0].lease_left <= 30
    assert [(q.name, q.running, q.pending, q.limits) for q in frame.queues] == [
        ("default", 1, 0, "-"),
        ("mail", 0, 1, "2 at once, 10/60s"),
    ]
    [run] = frame.runs
    assert (run.id, run.workflow, run.worker, run.step) == (run_id, "pay", worker_id, "charge #1")
    text = text_of(render(frame))
    pattern = rf"{re.escape(worker_id)}\s+not registered\s+1\s+expires in \d+s"
    assert re.search(pattern, text)  # a TestWorker holds leases without registering
    assert re.search(r"mail\s+0\s+1\s+2 at once, 10/60s", text)
    assert re.search(rf"{run_id}\s+pay\s+default\s+{re.escape(worker_id)}\s+\d+s\s+charge #1", text)
    assert "pending 1" in text and "running 1" in text


def test_perdure_top_once_prints_one_frame(app: perdure.App, db_url: str) -> None:
    """`perdure top --once` reads any store and prints one frame: the worker, the queues,
    the running run; a store that does not exist is one clear error."""
    run_id, worker_id = running_store(app)
    result = CliRunner().invoke(cli, ["--db", db_url, "top", "--once"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert worker_id in out and "expired" in out  # the real clock is past the test clock's lease
    assert re.search(r"default\s+1\s+0", out) and re.search(r"mail\s+0\s+1", out)
    assert re.search(rf"{run_id}\s+pay\s+default\s+{re.escape(worker_id)}", out)
    assert "charge #1" in out
    missing = CliRunner().invoke(cli, ["--db", "sqlite:////nonexistent/x.db", "top", "--once"])
    assert missing.exit_code == 2 and "no perdure store" in missing.output


def test_without_rich_top_says_what_to_install(
    app: perdure.App, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the observe extra, `perdure top` is one line naming the extra, exit 2."""
    monkeypatch.setitem(sys.modules, "rich", None)
    result = CliRunner().invoke(cli, ["--db", db_url, "top", "--once"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: perdure top needs the observe extra (rich is missing): "
        "pip install 'perdure[observe]'"
    )


def test_an_idle_worker_shows_from_the_registry_with_its_heartbeat(app: perdure.App) -> None:
    """A worker holding no run still appears (from the worker registry), with how long ago it
    last said it was alive; a stopped one does not."""
    from perdure.observe.top import snapshot
    from perdure.store.workers_sql import WorkerRow

    now = app.clock.now()
    idle = WorkerRow("box:7:aaa", "box", 7, now - 100, now - 4, 8, 0)
    gone = WorkerRow("box:8:bbb", "box", 8, now - 100, now - 50, 8, 0)
    app.runtime.sync(app.runtime.store.worker_beat(idle), "beat")
    app.runtime.sync(app.runtime.store.worker_beat(gone), "beat")
    stopped = WorkerRow("box:8:bbb", "box", 8, now - 100, now - 50, 8, 0, stopped_at=now - 40)
    app.runtime.sync(app.runtime.store.worker_beat(stopped), "stop")
    frame = app.runtime.sync(snapshot(app.runtime), "top")
    [line] = frame.workers
    assert (line.id, line.runs, line.lease_left) == ("box:7:aaa", 0, None)
    assert line.heartbeat_ago == 4
    assert line.state == "alive (idle)"


def test_top_states_each_worker_as_perdure_workers_does(app: perdure.App) -> None:
    """Each worker line carries the one judgement of its state: a worker of this host whose
    process is gone is dead with the proof, one not heard of for a minute is silent."""
    import socket
    import subprocess

    from perdure.engine.peers import worker_state
    from perdure.observe.top import snapshot
    from perdure.store.workers_sql import WorkerRow

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    now = app.clock.now()
    host = socket.gethostname()
    dead = WorkerRow("dead-1", host, gone.pid, now - 100, now - 2, 8, 0)
    quiet = WorkerRow("quiet-1", "elsewhere", 9, now - 100, now - 60, 8, 0)
    for row in (dead, quiet):
        app.runtime.sync(app.runtime.store.worker_beat(row), "beat")
    frame = app.runtime.sync(snapshot(app.runtime), "top")
    states = {w.id: w.state for w in frame.workers}
    assert states == {
        "dead-1": f"dead: process {gone.pid} is gone on this host ({host})",
        "quiet-1": "silent: no heartbeat for 60s (crashed, frozen or cut off)",
    }
    assert {k: worker_state(r, now).label for k, r in (("dead-1", dead), ("quiet-1", quiet))} == (
        states
    )
    text = text_of(render(frame))
    assert f"dead: process {gone.pid} is gone" in text
