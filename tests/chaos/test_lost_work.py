"""kill -9 loses at most the step that was executing: each re-runnable step whose body ran
longer than the engine's linger has its outcome on disk before the next one starts."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fresh_stores import fresh_store_url
from perdure.store.base import TERMINAL

RUNS = 8
STEPS = 40  # more than four kills' worth of steps on a loaded machine
KILLS = 4


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill_minus_nine_reruns_at_most_the_executing_step(
    kind: str,
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    chaos_seed: int,
    wait_until: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight runs of 20 ms `keyed` steps in one worker (a 30 s lease: the dead worker's runs
    are taken over by proof of death), killed at random moments: after each kill, at most
    one step of each run runs again, and every run completes."""
    rng = random.Random(chaos_seed)
    workdir = tmp_path / "lost"
    with fresh_store_url(kind, tmp_path) as url:
        if kind == "postgres":
            monkeypatch.setenv(chaos_app.STORE_URL_ENV, url)
        chaos_app.prepare(workdir)
        pool = worker_pool(workdir, concurrency=RUNS, lease=30.0)
        app = chaos_app.build_app(workdir)
        runs = [f"l{i}" for i in range(RUNS)]
        try:
            for run_id in runs:
                app.start("slow_keys", STEPS, run_id=run_id)
            killed: list[int] = []
            for _ in range(KILLS):
                seen = len(chaos_app.read_ledger(workdir))
                proc = pool.spawn()

                def ran(seen: int = seen) -> bool:
                    """The worker ran a step per run, or (a slow machine) every run ended."""
                    if len(chaos_app.read_ledger(workdir)) >= seen + RUNS:
                        return True
                    return all(app.get_run(r).status in TERMINAL for r in runs)

                wait_until(ran, 60, "the worker to run steps")
                if all(app.get_run(r).status in TERMINAL for r in runs):
                    pool.kill(proc)
                    break
                time.sleep(rng.uniform(0.0, 0.1))
                pool.kill(proc)
                killed.append(proc.pid)
            assert killed, "every run ended before the first kill"
            proc = pool.spawn()
            deadline = time.monotonic() + 120
            while not all(app.get_run(r).status in TERMINAL for r in runs):
                assert time.monotonic() < deadline, {r: app.get_run(r).status for r in runs}
                time.sleep(0.1)
            pool.kill(proc)
            assert {app.get_run(r).status for r in runs} == {"completed"}
            ledger = [r for r in chaos_app.read_ledger(workdir) if r["step"] == "slow_keyed"]
            ran = Counter((r["run"], r["pos"]) for r in ledger)
            assert set(ran) == {(r, p) for r in runs for p in range(STEPS)}
            # every execution of a step but its last was lost by the worker that ran it (one
            # that was killed); per kill and run, that is one execution at most
            by_step: dict[tuple[str, int], list[int]] = {}
            for r in ledger:  # in the order they ran
                by_step.setdefault((r["run"], r["pos"]), []).append(r["pid"])
            lost = Counter((pid, run) for (run, _), pids in by_step.items() for pid in pids[:-1])
            assert set(pid for pid, _ in lost) <= set(killed), lost
            assert all(n <= 1 for n in lost.values()), lost
            print(f"{sum(ran.values()) - len(ran)} re-runs after {len(killed)} kills")
        finally:
            app.close()
