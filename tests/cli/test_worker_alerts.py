"""`perdure worker --alert-url URL` (or PERDURE_ALERT_URL): a real worker process that parks
a run for a person POSTs it once, as JSON, to a real local HTTP server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perdure.cli.main import cli
from perdure.testing import SimulatedCrash, TestWorker
from process_stops import stop_processes
from waits import wait_for

HERE = Path(__file__).parent


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "env"])
def test_a_worker_process_posts_a_parked_run_once(
    env: dict[str, str], receiver: tuple[str, list[dict[str, Any]]], tmp_path: Path, how: str
) -> None:
    """A once step cut off by a crash: the worker process that recovers the run parks it and
    POSTs one alert naming the run, its cause, the full reason and the fix; nothing more is
    sent while it goes on polling."""
    url, bodies = receiver
    app = sys.modules["cli_app"].app
    app.start("checkout", "o1", run_id="al1")
    TestWorker(app).run_until_idle()
    app.send_event("al1", "approved", True)
    dying = TestWorker(app)
    dying.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    held = app.get_run("al1")
    app.runtime.sync(app.runtime.store.release(held.lease_owner or "", ["al1"]), "release")
    command = [sys.executable, "-m", "perdure", "worker", "--poll", "0.1"]
    child_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    if how == "option":
        command += ["--alert-url", url]
    else:
        child_env["PERDURE_ALERT_URL"] = url
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, env=child_env, stdout=out, stderr=out)
    try:
        wait_for("the alert", lambda: bool(bodies) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log.read_text()
        time.sleep(1.0)  # a few more polls: still one alert
        [body] = bodies
        assert (body["run_id"], body["status"], body["cause"]) == (
            "al1", "needs_attention", "interrupted",
        )  # fmt: skip
        assert "between intent and outcome of a once step" in body["reason"]
        assert body["fix"] == "perdure resolve al1 2 --value JSON | --retry | --fail"
        assert app.get_run("al1").status == "needs_attention"
    finally:
        stop_processes([proc], grace=30)


def test_an_alert_url_that_is_not_http_is_one_line(env: dict[str, str]) -> None:
    """`--alert-url mailto:...` is refused in one line, exit 2, before the worker starts."""
    result = CliRunner().invoke(cli, ["worker", "--alert-url", "mailto:ops@example.com"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: alert URL 'mailto:ops@example.com': give an http:// or https:// URL"
    )
