"""Steering across kill -9: a message sent to a spec agent whose worker is then killed is
in the next model request once; killing the workers while the request that carries it is
in flight, and again after it was journaled, never adds it twice or drops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import perdure
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli
from process_stops import stop_processes
from waits import wait_for

HERE = Path(__file__).parent
SPEC = """
name = "steered"
goal = "Answer"

[models.fast]
provider = "scripted"

[tools]
grant = ["recall"]
"""
TEXT = "answer in French"


def requests(folder: Path) -> list[dict[str, Any]]:
    """The requests the gated model got so far, in order (see steer_kill_app)."""
    path = folder / "requests.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_steer_survives_kill_9_and_is_applied_once(store_url: str, tmp_path: Path) -> None:
    """Steered (by the CLI) during model call 0, the worker killed: the next worker's call 1
    carries the message; killed during call 1 (the message journaled) and during call 2 (call
    1 journaled), the workers after replay it: calls 1 and 2 carry it once each, call 0
    never, the journal holds it once and its event is consumed."""
    spec = tmp_path / "steered.toml"
    spec.write_text(SPEC)
    env = {**os.environ, "PERDURE_DB": store_url, "STEER_KILL_SPEC": str(spec),
           "STEER_KILL_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("PERDURE_APP", None)
    app = perdure.App(store_url)
    log_path = tmp_path / "workers.log"
    log = open(log_path, "ab")  # noqa: SIM115
    procs: list[subprocess.Popen[bytes]] = []

    def start_worker() -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "perdure", "--app", "steer_kill_app:app", "worker",
                "--lease", "5", "--poll", "0.05"]  # fmt: skip
        proc = subprocess.Popen(args, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    def killed_in_call(turn: int, proc: subprocess.Popen[bytes]) -> None:
        """Wait until `proc`'s model call `turn` is in flight, then kill -9 it."""
        wait_for(f"model call {turn} in worker {proc.pid}",
                 lambda: any(r["turn"] == turn and r["pid"] == proc.pid
                             for r in requests(tmp_path)), log_path, timeout=60)  # fmt: skip
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    try:
        agent = Agent(app.runtime, load_spec(spec))
        handle = app.start(agent.workflow, {"prompt": "say hello"}, run_id="s1")
        first = start_worker()
        wait_for("model call 0", lambda: requests(tmp_path), log_path, timeout=60)
        steered = CliRunner().invoke(cli, ["--db", store_url, "steer", "s1", TEXT])
        assert steered.exit_code == 0, steered.output
        assert steered.output.startswith("steered s1")
        killed_in_call(0, first)  # between the steer and the call that takes it
        (tmp_path / "go-0").touch()
        killed_in_call(1, start_worker())  # the message journaled, its call in flight
        (tmp_path / "go-1").touch()
        killed_in_call(2, start_worker())  # the call that carried it journaled
        (tmp_path / "go-2").touch()
        start_worker()
        assert handle.result(timeout=60)["answer"] == "done"
        seen = requests(tmp_path)
        carried = {(r["turn"], sum(TEXT in m for m in r["messages"])) for r in seen}
        assert carried == {(0, 0), (1, 1), (2, 1)}, seen
        assert sum(r["turn"] == 1 for r in seen) == 2  # call 1 made again after its kill
        journal = app.journal("s1")
        assert sum(e.kind == "steer.received" for e in journal) == 1
        assert app.runtime.sync(app.runtime.store.next_event("s1", "steer"), "event") is None
        shown = CliRunner().invoke(cli, ["--db", store_url, "show", "s1", "--wide"])
        assert "steer.received" in shown.output and TEXT in shown.output
    finally:
        stop_processes(procs, grace=15)
        log.close()
        app.close()
