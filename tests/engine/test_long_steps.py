"""Issue 33 item 0: a step longer than the store's 60 s busy bound (66 s), in runs started
by the inbox, by `app.start` in the worker's own process and by the CLI, on both stores:
every one completes (a start's 60 s store bound once leaked into the runs a worker of its
process took at once)."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import time
from pathlib import Path

import pytest

from live_workers import worker_task
from waits import wait_for_async

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
STEP = 66.0  # past the 60 s bound a start once leaked into the runs it began


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_step_past_the_60_s_bound_completes_however_its_run_was_started(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs of a 66 s step, started at once by the inbox, by app.start and by
    `perdure start` (a process of its own), worked by one worker in this process: all three
    complete with their step's value, each after at least 66 s."""
    url = f"sqlite:///{tmp_path}/held.db"
    if store == "postgres":
        url = request.getfixturevalue("pg_url")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    monkeypatch.setenv("PERDURE_DB", url)
    monkeypatch.setenv("HELD_INBOX", str(inbox))
    monkeypatch.setenv("HELD_STEP", str(STEP))
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("held_app", None)
    module = importlib.import_module("held_app")
    app = module.app

    async def main() -> dict[str, tuple[str, object, float]]:
        async with worker_task(app, poll=0.05, lease=30.0, stop_within=30.0) as worker:
            await wait_for_async("the worker idle", worker.nothing_runnable)
            began = time.monotonic()
            await app.start_async(module.held, "app.start", run_id="by-start")
            (inbox / "dropped.txt").write_text("dropped\n")
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")])}
            cli = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "perdure", "--db", url, "--app", "held_app:app", "start",
                "held", '["cli"]', "--id", "by-cli", env=env, cwd=tmp_path,
            )  # fmt: skip
            assert await cli.wait() == 0

            async def ended() -> bool:
                runs = await app.client.list_runs(workflow="held")
                return len(runs) == 3 and all(r.status in ("completed", "failed") for r in runs)

            await wait_for_async("the three runs to end", ended, timeout=STEP * 3)
            assert time.monotonic() - began >= STEP
            runs = await app.client.list_runs(workflow="held")
            return {
                r.id: (r.status, await app.handle(r.id).result_async(5),
                       r.updated_at - r.created_at)
                for r in runs
            }  # fmt: skip

    try:
        found = asyncio.run(main())
    finally:
        app.close()
    assert {run_id for run_id in found if not run_id.startswith("inbox:")} == {"by-start", "by-cli"}
    values = {str(value) for _, value, _ in found.values()}
    assert values == {"app.start", "cli", str(inbox / "dropped.txt")}, found
    assert {status for status, _, _ in found.values()} == {"completed"}
    assert all(took >= STEP for _, _, took in found.values()), found  # created to completed
