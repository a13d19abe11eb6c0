"""Usage reconciles with the provider's bill: a real worker killed with -9 before a call,
while the server is answering it, and right after its reply; then a fresh worker finishes.
Every request the counting server billed is in `perdure usage`, line by line: settled calls
with the very tokens billed, the calls cut off as "sent, outcome unknown" at an estimate no
lower than what was billed (a call cut off before its request left is such a call too: its
outcome is unknown to the worker that reserved it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_servers import CountingServer

import perdure
from extras_needed import require
from perdure.agent.budget_sql import Budgets
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli
from waits import wait_for

HERE = Path(__file__).parent
LEASE = 2.0

SPEC = """
name = "billed"
goal = "Answer the question"
instructions = "Answer in one line."

[models.fast]
provider = "openai"
model = "counting-1"
base_url = "{base}/v1"
api_key_env = "PERDURE_TEST_COUNTING_KEY"
context_tokens = 8000
max_tokens = 200

[tools]
grant = ["finish"]

[limits]
max_iterations = 1

[budget]
tokens_per_day = 1000000
"""


@pytest.fixture
def server() -> Iterator[CountingServer]:
    """The billing server, answering in 0.8 s; called through the openai SDK."""
    require("models", "openai")
    s = CountingServer(latency=0.8).start()
    yield s
    s.stop()


@pytest.mark.slow
def test_a_worker_killed_around_model_calls_leaves_every_billed_request_in_usage(
    tmp_path: Path, server: CountingServer
) -> None:
    """Four runs; worker 1 is killed as it starts, worker 2 while the server answers, worker 3
    right after a reply reached it (before it could record it), worker 4 finishes. Every
    served request is a settled usage row or a call recorded as cut off; each matches."""
    spec = tmp_path / "billed.toml"
    spec.write_text(SPEC.format(base=server.origin))
    db = f"sqlite:///{tmp_path}/k.db"
    env = {**os.environ, "PERDURE_DB": db, "BUDGET_KILL_SPEC": str(spec),
           "PERDURE_TEST_COUNTING_KEY": "k", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("PERDURE_APP", None)
    app = perdure.App(db)
    procs: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "perdure", "--app", "budget_kill_app:app", "worker",
                "--lease", str(LEASE), "--poll", "0.05", "--concurrency", "4"]  # fmt: skip
        log = open(tmp_path / f"worker-{len(procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(args, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    def kill(proc: subprocess.Popen[bytes]) -> None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    try:
        agent = Agent(app.runtime, load_spec(spec))
        first = spawn()  # killed before any call: nothing sent, nothing to record
        wait_for("worker 1 ready", lambda: b"ready" in (tmp_path / "worker-0.log").read_bytes())
        kill(first)
        handles = [app.start(agent.workflow, {"prompt": f"q{i}"}, run_id=f"k{i}") for i in range(4)]
        assert server.requests == []
        second = spawn()  # killed while the server is still answering its calls
        wait_for("calls in flight", lambda: len(server.requests) >= 2)
        kill(second)
        answered_before = len(server.requests)
        third = spawn()
        server.after_reply = lambda: os.kill(third.pid, signal.SIGKILL)  # at once after a reply
        wait_for("worker 3 killed after a reply", lambda: third.poll() is not None, timeout=60)
        assert len(server.requests) > answered_before
        spawn()
        for h in handles:
            assert h.result(timeout=90)["status"] == "done"
        time.sleep(1.0)  # calls cut off mid-answer finish billing on the server side

        usage = app.runtime.sync(Budgets(app.runtime.store).usage("billed", 0.0), "usage")
        held = app.runtime.sync(
            Budgets(app.runtime.store).reservations("billed", 0.0), "reservations"
        )
        billed = sorted(s.total for s in server.served)
        settled = sorted(u.input_tokens + u.output_tokens for u in usage)
        assert len(held) >= 2 and all(r.state == "unknown" for r in held)  # cut off twice or more
        remaining = list(billed)
        for total in settled:  # each settled call is a billed request, to the token
            remaining.remove(total)
        # every billed call not settled is one recorded as cut off, at an estimate no lower
        # than its bill; a call reserved and cut off before its request left is recorded so
        # too (unknown means unknown), at most the 4 calls in flight of each of the 2 kills
        # during calls (the kill after a reply cuts off the calls still in flight then)
        assert len(remaining) <= len(held) <= len(remaining) + 4 * 2, (billed, settled, held)
        estimates = sorted((r.tokens for r in held), reverse=True)[: len(remaining)]
        assert all(e >= b for e, b in zip(estimates, sorted(remaining, reverse=True), strict=True))
        shown = CliRunner().invoke(cli, ["--db", db, "usage", "--by", "agent"])
        assert shown.exit_code == 0, shown.output
        [line] = [x for x in shown.output.splitlines() if "sent, outcome unknown" in x]
        assert line.split()[-3:-1] == [str(len(held)), str(sum(r.tokens for r in held))]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
        app.close()
