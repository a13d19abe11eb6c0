"""Issue 33 item 0: a step longer than the store's 60 s busy bound (66 s), in runs started
by the inbox, by `app.start` in the worker's own process and by the CLI: every one
completes (a start's 60 s store bound once leaked into the runs a worker of its process
took at once). SQLite, where the bound is, and PostgreSQL side by side, sharing the wait."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from live_workers import worker_task
from waits import wait_for_async

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
STEP = 66.0  # past the 60 s bound a start once leaked into the runs it began

Found = dict[str, tuple[str, object, float]]


def held_app(name: str, url: str, inbox: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tests/engine/held_app.py imported as module `name`, its app on `url`, its inbox
    watching `inbox` (both read from the environment when it is imported)."""
    monkeypatch.setenv("PERDURE_DB", url)
    monkeypatch.setenv("HELD_INBOX", str(inbox))
    spec = importlib.util.spec_from_file_location(name, HERE / "held_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def three_runs(module: ModuleType, url: str, inbox: Path, folder: Path) -> Found:
    """Start one run each way on `module`'s app and work them with one worker in this
    process: (status, value, seconds from created to last update) by run id."""
    app = module.app
    async with worker_task(app, poll=0.05, lease=30.0, stop_within=30.0) as worker:
        await wait_for_async("the worker idle", worker.nothing_runnable)
        began = time.monotonic()
        await app.start_async(module.held, "app.start", run_id="by-start")
        (inbox / "dropped.txt").write_text("dropped\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT / "src")]),
               "PERDURE_DB": url, "HELD_INBOX": str(inbox)}  # fmt: skip
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "perdure", "--db", url, "--app", "held_app:app", "start",
            "held", '["cli"]', "--id", "by-cli", env=env, cwd=folder,
        )  # fmt: skip
        assert await cli.wait() == 0

        async def ended() -> bool:
            runs = await app.client.list_runs(workflow="held")
            return len(runs) == 3 and all(r.status in ("completed", "failed") for r in runs)

        await wait_for_async("the three runs to end", ended, timeout=STEP * 3)
        assert time.monotonic() - began >= STEP
        runs = await app.client.list_runs(workflow="held")
        return {
            r.id: (r.status, await app.handle(r.id).result_async(5), r.updated_at - r.created_at)
            for r in runs
        }


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_a_step_past_the_60_s_bound_completes_however_its_run_was_started(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs of a 66 s step on each store, started at once by the inbox, by app.start
    and by `perdure start` (a process of its own), worked by one worker of each store in
    this process: all six complete with their step's value, each after at least 66 s."""
    monkeypatch.setenv("HELD_STEP", str(STEP))
    stores = {"sqlite": f"sqlite:///{tmp_path}/held.db", "postgres": pg_url}
    inboxes = {store: tmp_path / store / "inbox" for store in stores}
    for inbox in inboxes.values():
        inbox.mkdir(parents=True)
    modules = {store: held_app(f"held_app_{store}", url, inboxes[store], monkeypatch)
               for store, url in stores.items()}  # fmt: skip

    async def main() -> list[Found]:
        return await asyncio.gather(*(
            three_runs(modules[store], url, inboxes[store], tmp_path / store)
            for store, url in stores.items()
        ))  # fmt: skip

    try:
        found_by_store = dict(zip(stores, asyncio.run(main()), strict=True))
    finally:
        for module in modules.values():
            module.app.close()
    for store, found in found_by_store.items():
        named = {run_id for run_id in found if not run_id.startswith("inbox:")}
        assert named == {"by-start", "by-cli"}, store
        values = {str(value) for _, value, _ in found.values()}
        assert values == {"app.start", "cli", str(inboxes[store] / "dropped.txt")}, found
        assert {status for status, _, _ in found.values()} == {"completed"}, (store, found)
        assert all(took >= STEP for _, _, took in found.values()), (store, found)
