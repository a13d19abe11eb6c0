"""`perdure pause --now` across processes: the CLI records the pause in the store, a real
worker subprocess holding the run notices it at its heartbeat and cuts off the model call it
is waiting on (a real OpenAI-compatible server on 127.0.0.1 that would take a minute). The
call is journaled aborted with its reservation as the estimate, `perdure usage` lists it,
resume calls the model again and finishes, and what the server served is what perdure
recorded plus what it aborted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from wire_servers import COUNTING_SPEC, CountingServer

import perdure
from extras_needed import require
from perdure.agent.budget_sql import Budgets
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli
from waits import wait_for

HERE = Path(__file__).parent
SLOW = 60.0  # seconds the server takes over the first call: far beyond any abort
BOUND = 20.0  # seconds the abort may take (a heartbeat is a second while busy)


@pytest.fixture
def server() -> Iterator[CountingServer]:
    """The billing server, SLOW to answer the first call; called through the openai SDK."""
    require("models", "openai")
    s = CountingServer(latency=SLOW).start()
    yield s
    s.hurry.set()
    s.stop()


def _api(app: perdure.App, path: str, body: dict[str, Any]) -> Any:
    """POST `body` to the app's HTTP API with an operate token; the JSON answer."""
    import warnings

    from perdure.server import create_app
    from perdure.server.access import create_token

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
        from starlette.testclient import TestClient

    _, token = app.runtime.sync(create_token(app, "ops", ["operate"]), "token")
    with TestClient(create_app(app)) as client:
        answer = client.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("store_url", "scope"),
    [("sqlite", "run"), ("postgres", "run"), ("sqlite", "workflow"), ("sqlite", "api")],
    indirect=["store_url"],
)
def test_pause_now_cuts_off_a_model_call_in_another_process(
    store_url: str, scope: str, tmp_path: Path, server: CountingServer
) -> None:
    """The model call is aborted within BOUND seconds and before the server answered it;
    the journal says aborted with the reservation's tokens; usage lists it apart; resumed,
    the run calls again and finishes; served == recorded + aborted."""
    spec = tmp_path / "slow.toml"
    spec.write_text(COUNTING_SPEC.format(name="slow", base=server.origin,
                                         key_env="PERDURE_TEST_COUNTING_KEY",
                                         budget="tokens_per_day = 1000000"))  # fmt: skip
    env = {**os.environ, "PERDURE_DB": store_url, "BUDGET_KILL_SPEC": str(spec),
           "PERDURE_TEST_COUNTING_KEY": "k", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("PERDURE_APP", None)
    app = perdure.App(store_url)
    runner = CliRunner()
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    args = [sys.executable, "-m", "perdure", "--app", "budget_kill_app:app", "worker",
            "--lease", "5", "--poll", "0.05"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        agent = Agent(app.runtime, load_spec(spec))
        handle = app.start(agent.workflow, {"prompt": "why?"}, run_id="n1")
        wait_for("the model call in flight", lambda: len(server.requests) == 1, timeout=60)
        target = ["--workflow", "agent:slow"] if scope == "workflow" else ["n1"]
        began = time.monotonic()
        if scope == "api":  # the HTTP API (and the dashboard's Pause now) call the same
            paused = _api(app, "/api/v1/runs/n1/pause", {"now": True})
            assert paused["status"] in ("running", "paused")  # paused by its worker
        else:
            done = runner.invoke(cli, ["--db", store_url, "pause", *target, "--now"])
            assert done.exit_code == 0, done.output

        def aborted() -> bool:
            journal = app.runtime.sync(app.runtime.store.journal("n1"), "journal")
            return any(e.kind == "step.stopped" for e in journal)

        wait_for("the call journaled aborted", aborted, timeout=BOUND)
        took = time.monotonic() - began
        assert took < BOUND
        assert server.served == []  # cut off before the server answered it
        [stopped] = [
            e
            for e in app.runtime.sync(app.runtime.store.journal("n1"), "j")
            if e.kind == "step.stopped"
        ]
        data = json.loads(stopped.data or "{}")
        assert data["aborted"] is True and data["effect"] == "keyed"
        [held] = app.runtime.sync(
            Budgets(app.runtime.store).reservations("slow", 0.0), "reservations"
        )
        assert held.state == "aborted"
        assert data["estimate"]["tokens"] == held.tokens and data["estimate"]["sent"] is True
        # the run's own pause is its row's status; a paused workflow's run shows `paused`
        # once its worker has handed it back (released), a moment after the abort
        wait_for("show saying paused", lambda: "status    paused" in runner.invoke(
            cli, ["--db", store_url, "show", "n1"]).output, timeout=60)  # fmt: skip
        explained = runner.invoke(cli, ["--db", store_url, "explain", "n1"])
        assert "aborted (pause --now)" in explained.output, explained.output
        usage = runner.invoke(cli, ["--db", store_url, "usage", "--by", "agent"])
        [line] = [x for x in usage.output.splitlines() if "aborted by pause --now" in x]
        assert line.split()[-3:-1] == ["1", str(held.tokens)]

        server.latency = 0.0  # the next call is answered at once
        if scope == "api":
            assert _api(app, "/api/v1/runs/n1/resume", {})["status"] == "pending"
        else:
            resumed = runner.invoke(cli, ["--db", store_url, "resume", *target])
            assert resumed.exit_code == 0, resumed.output
        assert handle.result(timeout=60)["status"] == "done"
        server.hurry.set()  # the aborted call's handler finishes (billed, its reply unread)
        wait_for("the aborted call billed", lambda: len(server.served) == 2, timeout=60)
        recorded = app.runtime.sync(Budgets(app.runtime.store).usage("slow", 0.0), "usage")
        still = app.runtime.sync(
            Budgets(app.runtime.store).reservations("slow", 0.0), "reservations"
        )
        assert len(server.requests) == len(server.served) == len(recorded) + len(still) == 2
        assert [r.state for r in still] == ["aborted"]
        assert recorded[0].input_tokens + recorded[0].output_tokens == server.served[-1].total
        assert still[0].tokens >= server.served[0].total  # the estimate errs high
        print(f"pause --now ({scope}): aborted {took:.2f}s after the command")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
        log.close()
        app.close()
