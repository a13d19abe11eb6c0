"""Real processes: a worker is killed with SIGKILL while its agent's model call hangs on a
real local OpenAI-compatible server; a new worker calls the model again once it answers,
the run completes, and the call is billed once (one agent_usage row).

The agent is tests/chaos/agent_crash_app.py (an agent built from the spec the test
writes) in `perdure worker` processes on a SQLite store; the model server is
tests/agent/wire_servers.py's OpenAIServer in this process, told to hang the first
request (read it, never answer) and answer the next.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from extras_needed import require
from perdure.agent.budget_sql import Budgets
from waits import wait_for

HERE = Path(__file__).resolve().parent
WIRE = HERE.parent / "agent" / "wire_servers.py"
APP_FILE = HERE / "agent_crash_app.py"
KEY_ENV = "OUTAGE_CHAOS_KEY"
SPEC = """
name = "outage"
goal = "Say hello."

[models.fast]
provider = "openai"
model = "fake-model"
base_url = "{base_url}"
api_key_env = "{key_env}"
timeout = 60          # longer than the test: the kill, not the timeout, ends the hung call

[memory]
enabled = false
"""


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(120)
def test_kill_9_during_a_hung_model_call_calls_again_on_recovery_and_bills_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while the model call hangs: the hung call never answered, the new worker's
    call is answered, the run completes with one model outcome and one usage row."""
    require("models", "openai")
    wire = load(WIRE, "wire_servers")
    server = wire.OpenAIServer().start()
    server.hang_next()
    spec_path = tmp_path / "agent.toml"
    spec_path.write_text(SPEC.format(base_url=f"{server.origin}/v1", key_env=KEY_ENV))
    url = f"sqlite:///{tmp_path / 'outage.db'}"
    env = {
        "AGENT_CRASH_SPEC": str(spec_path),
        "AGENT_CRASH_LEDGER": str(tmp_path / "ledger.txt"),
        "AGENT_CRASH_MARKERS": str(tmp_path / "markers.txt"),
        KEY_ENV: "k",
        "PERDURE_DB": url,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app = load(APP_FILE, "agent_crash_app").app
    run_id = app.start("agent:outage", {"prompt": "hello"}, run_id="outage-1").id
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(n: int) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{n}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "perdure", "--app", "agent_crash_app:app", "worker",
                 "--lease", "30", "--poll", "0.1", "--grace", "2"],
                cwd=HERE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        procs.append(proc)
        return proc

    try:
        first = spawn(0)
        wait_for(
            "the hung model call",
            lambda: server.hung == 1 or first.poll() is not None,
            timeout=60,
            every=0.05,
        )
        assert first.poll() is None, (tmp_path / "worker-0.log").read_text()[-3000:]
        assert app.get_run(run_id).status == "running"
        first.send_signal(signal.SIGKILL)  # kill -9 mid-call: nothing flushed, no lease released
        first.wait()
        assert server.hung == 1 and len(server.requests) == 1
        # the same host, its pid gone: the new worker takes the run at once, not after 30 s
        second = spawn(1)
        wait_for("the recovered run", lambda: app.get_run(run_id).status in ("completed", "failed")
             or second.poll() is not None, timeout=60, every=0.05)  # fmt: skip
        log = (tmp_path / "worker-1.log").read_text(errors="replace")
        run = app.get_run(run_id)
        assert run.status == "completed", f"{run.status} {run.error}\n{log[-3000:]}"
        assert len(server.requests) == 2 and server.hung == 1  # called again, answered once
        journal = app.journal(run_id)
        model = [e for e in journal if e.kind == "step.outcome" and e.name.endswith(".model")]
        assert len(model) == 1
        assert any(e.kind == "run.recovered" for e in journal)
        usage = app.runtime.sync(Budgets(app.runtime.store).usage("outage", 0.0), "usage")
        assert [(u.run_id, u.input_tokens) for u in usage] == [(run_id, wire.INPUT_TOKENS)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        server.stop()
        app.close()
