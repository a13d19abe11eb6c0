"""Pause tells the truth: a run handed back because its workflow was paused (as an agent's
run is, at the step after its model call) shows `paused` in `perdure ls`, `show` and
`explain`, and `perdure stuck` does not list it however long it stays; resumed, it finishes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import perdure
from perdure.cli.main import cli
from perdure.testing import TestClock, TestWorker


def test_a_paused_run_shows_paused_and_is_never_stuck(tmp_path: Path) -> None:
    """Paused during its first step (a model call, say), the run is handed back at the next;
    two hours later it is still `paused`, not `running`, and not stuck."""
    db = f"sqlite:///{tmp_path}/p.db"
    clock = TestClock()
    app = perdure.App(db, clock=clock)
    try:

        @app.step(name="call_model")
        async def call_model() -> int:
            await app.client.set_pause("workflow", "agent:slow", True)  # the operator pauses
            return 1

        @app.step(name="use_answer")
        async def use_answer(n: int) -> int:
            return n + 1

        @app.workflow(name="agent:slow")
        async def slow() -> int:
            return await use_answer(await call_model())

        handle = app.start(slow, run_id="p1")
        TestWorker(app).run_until_idle()
        assert app.get_run("p1").status == "running"  # the row: handed back, lease released
        clock.advance(7200)
        runner = CliRunner()
        listed = runner.invoke(cli, ["--db", db, "ls"])
        assert listed.exit_code == 0 and "paused" in listed.output
        assert "running" not in listed.output
        shown = runner.invoke(cli, ["--db", db, "show", "p1"])
        assert "status    paused" in shown.output and "resume --workflow" in shown.output
        explained = runner.invoke(cli, ["--db", db, "explain", "p1"])
        assert "status    paused" in explained.output
        stuck = app.runtime.sync(app.client.stuck(60.0), "stuck")
        assert stuck == []
        app.runtime.sync(app.client.set_pause("workflow", "agent:slow", False), "resume")
        TestWorker(app).run_until_idle()
        assert handle.result(timeout=5) == 2
    finally:
        app.close()
