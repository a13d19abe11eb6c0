"""A PostgreSQL outage is not a crash: live workers keep what they hold and record it when
the server is back, so no run needs an operator because of the outage.

Three workers on a server of the test's own (never the machine's) run 500 runs of the
chaos app (once, keyed, idempotent and transactional steps, sleeps, planned failures)
while the server is restarted with `-m immediate` (no checkpoint, crash recovery) at
least five times and its postmaster is killed with SIGKILL once, each aimed at a moment
when runs are executing, so writes are in flight: inside pipelines, transactions,
`executemany` and LISTEN. No worker is killed, and the lease outlasts every outage:
every needs_attention would be the outage's doing, and there must be none.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from private_pg import PrivateServer, wait_pg_up
from test_chaos import Chaos, verify
from test_chaos_postgres import through_outage

from perdure.store.base import NEEDS_ATTENTION, TERMINAL

N_RUNS = 500
WORKERS = 3
CONCURRENCY = 8
LEASE = 20.0  # longer than any outage here: a live holder must never be taken over
RESTARTS = 5  # immediate restarts, then one kill -9 of the postmaster
BUSY = 4  # an outage waits until at least this many runs are executing
STALL_SECONDS = 90.0


def outage(server: PrivateServer, kind: str) -> float:
    """One outage of `kind` (immediate restart or postmaster kill); seconds until it answers."""
    began = time.monotonic()
    if kind == "kill -9 postmaster":
        server.kill_postmaster()
    else:
        server.restart("immediate")
    wait_pg_up(server.url, 60)
    return time.monotonic() - began


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(900)
def test_postgres_outages_park_nothing_and_lose_nothing(
    pg_server: PrivateServer,
    pg_chaos_url: str,
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    chaos_seed: int,
) -> None:
    seed, rng = chaos_seed, random.Random(chaos_seed)
    monkeypatch.setenv(chaos_app.STORE_URL_ENV, pg_chaos_url)
    workdir = tmp_path / "chaos"
    chaos_app.prepare(workdir)
    pool = worker_pool(workdir, concurrency=CONCURRENCY, lease=LEASE)
    chaos = Chaos(workdir, chaos_app, pool, rng)
    plan = ["immediate restart"] * RESTARTS + ["kill -9 postmaster"]
    rng.shuffle(plan)
    outages: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for _ in range(WORKERS):
            pool.spawn()
        chaos.start_runs(N_RUNS)
        progress = (-1, time.monotonic())
        while True:
            time.sleep(rng.uniform(0.05, 0.3))
            chaos.check_no_unexpected_deaths()
            runs = through_outage(chaos.runs)
            executing = sum(r.status == "running" for r in runs.values())
            done = sum(r.status in TERMINAL or r.status == NEEDS_ATTENTION for r in runs.values())
            if done > progress[0]:
                progress = (done, time.monotonic())
            if plan and executing >= BUSY:
                kind = plan.pop()
                seconds = outage(pg_server, kind)
                outages.append({"kind": kind, "executing": executing, "done": done,
                                "seconds": round(seconds, 2)})  # fmt: skip
                progress = (done, time.monotonic())
                continue
            if done == len(runs):
                if not plan:
                    break
                chaos.start_runs(40)  # the outages still to come need work in flight
                chaos.extra_runs += 40
            if time.monotonic() - progress[1] > STALL_SECONDS:
                pending = Counter(r.status for r in runs.values())
                pytest.fail(f"no run settled for {STALL_SECONDS}s around outages: {pending}")
        seconds = time.monotonic() - t0
        runs = chaos.runs()
        attention = sorted(r.id for r in runs.values() if r.status == NEEDS_ATTENTION)
        for proc in pool.alive():
            assert pool.stop(proc) == 0, pool.log_text(proc)[-4000:]
        lines = "\n".join(pool.log_text(p) for p in pool.procs).splitlines()
        bad = [line for line in lines if " ERROR " in line or "Traceback" in line]
        report = verify(chaos, attention)
        report.update(
            seed=seed,
            outages=outages,
            held_through_outage=sum("holding them until it is back" in x for x in lines),
            recorded_after_outage=sum("recorded what it held" in x for x in lines),
            reconnects=sum(": reconnected" in x for x in lines),
            lease_takeovers=sum(r.recoveries for r in runs.values()),
            taken_over={
                r.id: [
                    (e.seq, e.kind, e.worker, e.at, (e.data or "")[:80])
                    for e in chaos.app.journal(r.id)
                ]
                for r in runs.values()
                if r.recoveries
            },
            extra_runs=chaos.extra_runs,
            seconds=round(seconds, 1),
        )
        summary = "outage summary: " + json.dumps(report, sort_keys=True)
        print(summary)
        with capsys.disabled():
            print("\n" + summary)
        assert not bad, "worker logs show errors:\n" + "\n".join(bad[:20])
        assert len(outages) == RESTARTS + 1, summary
        assert attention == [], f"needs_attention caused by the outages: {attention}\n{summary}"
        assert report["lease_takeovers"] == 0, f"a live worker's run was taken: {summary}"
        assert report["reconnects"] > 0 and report["held_through_outage"] > 0, summary
    except BaseException:
        print(f"outage test failed after {time.monotonic() - t0:.1f}s; outages {outages}; "
              f"worker logs in {workdir}, server log in {tmp_path / 'postgresql.log'}")  # fmt: skip
        raise
    finally:
        pool.reap()
        chaos.app.close()
