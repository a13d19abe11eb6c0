"""kill -9 of a process whose worker runs the runs it starts itself (created claimed, with
no claim): at many points, a restarted worker finishes every run the killed process was
told it started, and no `once` effect ever ran twice."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest

import perdure

APP = textwrap.dedent(
    """
    import asyncio, os, sys
    import perdure

    app = perdure.App(os.environ["CC_DB"])
    MARKS = os.environ["CC_DIR"] + "/marks"

    @app.step(name="mark", effect="once")
    def mark(run_id: str, position: int) -> int:
        fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{run_id} {position}\\n".encode())
        os.close(fd)
        return position

    @app.workflow(name="three")
    async def three(run_id: str) -> int:
        for position in range(3):
            await mark(run_id, position)
        return 3

    async def main() -> None:
        worker = app.worker(concurrency=4)
        task = asyncio.create_task(worker.run())
        while not worker.nothing_runnable():  # its first claim found nothing: runs it starts
            await asyncio.sleep(0.01)         # from now on are created claimed by it
        started = open(os.environ["CC_DIR"] + "/started", "a", buffering=1)
        for i in range(10_000):
            run_id = f"r{i}"
            handle = await app.start_async(three, run_id, run_id=run_id)
            started.write(run_id + "\\n")  # acknowledged to the caller
            if i % 3:
                await handle.result_async(30)
        await task

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def _load(folder: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("cc_app", folder / "cc_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _finish(app: perdure.App, expected: set[str]) -> None:
    """A restarted worker, until every run is completed or parked for an operator."""
    worker = app.worker(concurrency=8, poll=0.05)
    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 60
    try:
        while True:
            rows = await app.client.list_runs(limit=100_000)
            if {r.id for r in rows} >= expected and all(
                r.status in ("completed", "needs_attention") for r in rows
            ):
                return
            assert time.monotonic() < deadline, sorted({r.status for r in rows})
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [1, 4, 9, 17, 30, 55])
def test_kill_minus_nine_of_a_process_running_its_own_runs(
    tmp_path: Path, kill_after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'cc.db'}"
    (tmp_path / "cc_app.py").write_text(APP)
    env = {**os.environ, "CC_DB": url, "CC_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("PERDURE_DB", None)
    started = tmp_path / "started"
    with open(tmp_path / "child.log", "wb") as log:
        child = subprocess.Popen([sys.executable, str(tmp_path / "cc_app.py")], env=env,
                                 stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not started.exists() or len(started.read_text().split()) < kill_after:
            assert child.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the child started too few runs"
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    acknowledged = set(started.read_text().split())
    monkeypatch.setenv("CC_DB", url)
    monkeypatch.setenv("CC_DIR", str(tmp_path))
    app: perdure.App = _load(tmp_path).app
    try:
        asyncio.run(_finish(app, acknowledged))
        marks = (
            (tmp_path / "marks").read_text().splitlines() if (tmp_path / "marks").exists() else []
        )
        twice = [m for m, n in collections.Counter(marks).items() if n > 1]
        assert twice == [], f"once effects ran twice: {twice}"
        rows = app.list_runs(limit=100_000)
        assert any(r.started_at == r.created_at for r in rows), "no run was created claimed"
        for row in rows:
            done = {int(m.split()[1]) for m in marks if m.split()[0] == row.id}
            if row.status == "completed":
                assert done == {0, 1, 2}, (row.id, done)
            else:  # a once step cut off mid-effect is never run again: left to an operator
                kinds = [e.kind for e in app.journal(row.id)]
                assert row.status == "needs_attention" and "step.needs_attention" in kinds
    finally:
        app.close()
