"""kill -9 and a PostgreSQL restart: four workers on one PostgreSQL store keep every promise.

The SQLite chaos test's app, operator and checks (test_chaos.py), with the store on a
PostgreSQL server of the test's own (initdb in a temp dir, never the machine's server):
workers die by SIGKILL at random moments (a fresh one replaces each), some are frozen
past their lease, and the server itself is restarted once while runs are in flight.
Every run must still end as its plan says.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
from private_pg import PrivateServer, restart_postgres
from test_chaos import Chaos, verify

from perdure.errors import StoreError
from perdure.store.base import NEEDS_ATTENTION, TERMINAL

T = TypeVar("T")

N_RUNS = 500  # started up front; more are added if everything settles before enough kills
EXTRA_BATCH = 20
WORKERS = 4
CONCURRENCY = 8
LEASE = 1.0
MIN_KILLS = 40
MIN_BUSY_KILLS = 25  # kills of a worker that held at least one run
STRIKE_EVERY = (0.2, 1.0)  # seconds between chaos events
RESTART_AFTER = 0.25  # restart PostgreSQL once this share of the runs has settled
# Liveness is judged by progress, not by wall-clock speed (the machine may be loaded):
STALL_SECONDS = 60.0  # phase 1 fails if no run settles for this long
RESOLVE_STALL_SECONDS = 45.0  # phase 2 (resolve needs_attention) fails if no run ends this long
OUTAGE_SECONDS = 60.0  # the longest the test's own store calls retry around the restart


_START_REFUSED = "error: cannot connect to PostgreSQL"


def supervise(chaos: Chaos, restart: dict[str, Any], refused: list[int]) -> None:
    """Replace a worker that could not connect at start-up because the server was restarting.

    Like `perdure worker`, a worker fails fast (one line, exit 2) when its first connection
    fails; its supervisor starts another. Any other exit is an unexpected death.
    """
    for proc in chaos.pool.procs:
        if proc.pid in chaos.killed or proc.poll() is None:
            continue
        if restart and proc.returncode == 2 and _START_REFUSED in chaos.pool.log_text(proc):
            chaos.killed.add(proc.pid)  # accounted for here, not by check_no_unexpected_deaths
            refused.append(proc.pid)
            chaos.pool.spawn()
    chaos.check_no_unexpected_deaths()


def through_outage(fn: Callable[[], T]) -> T:
    """Call the test's own store; while the server restarts, retry until it answers."""
    deadline = time.monotonic() + OUTAGE_SECONDS
    while True:
        try:
            return fn()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)  # about 80 s here; the stall checks name a stall long before this
def test_kill_minus_nine_and_postgres_restart_chaos(
    pg_server: PrivateServer,
    pg_chaos_url: str,
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    chaos_seed: int,
) -> None:
    """Kills, freezes and one server restart never repeat a once, keyed or transactional effect."""
    seed, rng = chaos_seed, random.Random(chaos_seed)
    monkeypatch.setenv(chaos_app.STORE_URL_ENV, pg_chaos_url)  # this process and its workers
    workdir = tmp_path / "chaos"
    chaos_app.prepare(workdir)
    pool = worker_pool(workdir, concurrency=CONCURRENCY, lease=LEASE)
    chaos = Chaos(workdir, chaos_app, pool, rng)
    restart: dict[str, Any] = {}
    refused_start: list[int] = []  # workers that found the server down as they started
    witness: Any = None  # the worker spared from strikes until it reconnected
    t0 = time.monotonic()
    try:
        for _ in range(WORKERS):
            pool.spawn()
        chaos.start_runs(N_RUNS)
        for run_id in rng.sample(sorted(chaos.plans), 10):
            chaos.cancel_at[run_id] = rng.uniform(1.0, 20.0)

        # Phase 1: kill -9 (or freeze) a random worker at random moments until every run has
        # settled; restart PostgreSQL once, while a good part of the runs is still in flight.
        progress = (-1, time.monotonic())  # (runs settled, when that count last grew)
        while True:
            time.sleep(rng.uniform(*STRIKE_EVERY))
            supervise(chaos, restart, refused_start)
            chaos.thaw()
            elapsed = time.monotonic() - t0
            for run_id, when in list(chaos.cancel_at.items()):
                # A frozen worker may hold the run's row lock: the cancel would wait for it.
                if elapsed >= when and not chaos.frozen:
                    through_outage(lambda run_id=run_id: chaos.app.cancel(run_id))
                    chaos.cancelled.add(run_id)
                    del chaos.cancel_at[run_id]
            runs = through_outage(chaos.runs)
            done = sum(r.status in TERMINAL or r.status == NEEDS_ATTENTION for r in runs.values())
            if done > progress[0]:
                progress = (done, time.monotonic())
            if not restart and done >= RESTART_AFTER * len(runs):
                # A witness lives through the restart: strikes spare it until it has
                # reconnected, so that a worker seeing the outage does not depend on the
                # kills happening to miss every connected worker for long enough.
                witness = next((p for p in pool.alive() if p.pid not in chaos.frozen
                                and ": claiming" in pool.log_text(p)), None)  # fmt: skip
                if witness is None:  # every worker is starting up or frozen: next round
                    chaos.strike(runs)
                    continue
                chaos.spared.add(witness.pid)
                statuses = Counter(r.status for r in runs.values())
                restart["at_seconds"] = round(time.monotonic() - t0, 1)
                restart["runs_then"] = dict(statuses)
                restart["witness"] = witness.pid
                restart["seconds"] = round(restart_postgres(pg_server), 2)
                restart["done_at"] = time.monotonic()
                continue
            if witness is not None and witness.pid in chaos.spared:
                if ": reconnected" in pool.log_text(witness):
                    chaos.spared.discard(witness.pid)
                    restart["witness_reconnected_after"] = round(
                        time.monotonic() - restart["done_at"], 1
                    )
                elif time.monotonic() - restart["done_at"] > OUTAGE_SECONDS:
                    pytest.fail(
                        f"worker {witness.pid} lived through the restart but did not reconnect "
                        f"in {OUTAGE_SECONDS}s:\n" + pool.log_text(witness)[-4000:]
                    )
            settled = done == len(runs)
            if settled and chaos.frozen:
                # Wake the zombies and give them time to finish whatever step they were in
                # (and be refused) before declaring the runs settled.
                chaos.thaw(everyone=True)
                time.sleep(2 * LEASE)
                continue
            if settled and not chaos.cancel_at:
                enough = chaos.kills >= MIN_KILLS and chaos.busy_kills >= MIN_BUSY_KILLS
                if enough and restart and not chaos.spared:
                    break
                chaos.start_runs(EXTRA_BATCH)  # not enough kills yet: give them work to land in
                chaos.extra_runs += EXTRA_BATCH
                continue
            if time.monotonic() - progress[1] > STALL_SECONDS:
                pending = Counter(r.status for r in runs.values())
                pytest.fail(f"no run settled for {STALL_SECONDS}s under chaos: {pending}")
            chaos.strike(runs)
        t_chaos = time.monotonic() - t0

        attention_after_chaos = sorted(
            r.id for r in chaos.runs().values() if r.status == NEEDS_ATTENTION
        )

        # Phase 2: no more kills; the operator resolves every needs_attention run.
        t1 = time.monotonic()
        progress = (-1, t1)  # (runs ended, when that count last grew)
        while True:
            supervise(chaos, restart, refused_start)
            runs = through_outage(chaos.runs)
            ended = sum(r.status in TERMINAL for r in runs.values())
            if ended > progress[0]:
                progress = (ended, time.monotonic())
            for run in runs.values():
                if run.status == NEEDS_ATTENTION:  # its connections may predate the restart
                    through_outage(lambda run_id=run.id: chaos.resolve(run_id))
            if all(r.status in TERMINAL for r in runs.values()):
                break
            if time.monotonic() - progress[1] > RESOLVE_STALL_SECONDS:
                pending = {r.id: r.status for r in runs.values() if r.status not in TERMINAL}
                pytest.fail(f"no resolved run ended for {RESOLVE_STALL_SECONDS}s: {pending}")
            time.sleep(0.1)
        t_resolve = time.monotonic() - t1

        for proc in pool.alive():
            assert pool.stop(proc) == 0, pool.log_text(proc)[-4000:]
        lines = "\n".join(pool.log_text(p) for p in pool.procs).splitlines()
        bad = [line for line in lines if " ERROR " in line or "Traceback" in line]
        assert not bad, "worker logs show errors:\n" + "\n".join(bad[:20])

        report = verify(chaos, attention_after_chaos)
        report.update(
            seed=seed,
            store="postgresql",
            kills=chaos.kills,
            kills_of_busy_workers=chaos.busy_kills,
            freezes=chaos.freezes,
            worker_processes=len(pool.procs),
            extra_runs=chaos.extra_runs,
            resolved_with_value=chaos.resolved_value,
            resolved_by_retry=chaos.resolved_retry,
            lease_lost_warnings=sum("refused" in x or "lost the lease" in x for x in lines),
            pg_restart={k: v for k, v in restart.items() if k != "done_at"},
            pg_runs_stopped_by_outage=sum(" stopped: store " in x for x in lines),
            pg_reconnects=sum(": reconnected" in x for x in lines),
            pg_claim_retries=sum("cannot claim" in x for x in lines),
            pg_workers_refused_start=len(refused_start),
            pg_heartbeat_failures=sum("heartbeat failed" in x for x in lines),
            chaos_seconds=round(t_chaos, 1),
            resolve_seconds=round(t_resolve, 1),
        )
        summary = "chaos summary: " + json.dumps(report, sort_keys=True)
        print(summary)
        with capsys.disabled():
            print("\n" + summary)
        assert chaos.kills >= MIN_KILLS and chaos.busy_kills >= MIN_BUSY_KILLS, summary
        assert report["recoveries"] > 0, summary
        assert restart["runs_then"].get("running", 0) > 0, f"nothing ran at the restart: {summary}"
        assert report["pg_reconnects"] > 0, f"no worker saw the restart: {summary}"
        assert ": reconnected" in pool.log_text(witness), f"no witness reconnected: {summary}"
    except BaseException:
        # pytest shows this on failure: where the worker logs, ledger and server log are kept
        print(f"chaos failed after {time.monotonic() - t0:.1f}s; restart {restart}; "
              f"{len(pool.procs)} worker processes, {chaos.kills} kills; worker logs, ledger "
              f"in {workdir}, server log in {tmp_path / 'postgresql.log'}")  # fmt: skip
        raise
    finally:
        pool.reap()  # first: a frozen worker may hold row locks the test's own calls wait for
        chaos.app.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_a_worker_starting_as_the_server_restarts_runs_or_fails_fast(
    pg_server: PrivateServer,
    pg_chaos_url: str,
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    monkeypatch: pytest.MonkeyPatch,
    chaos_seed: int,
) -> None:
    """A restart landing while a worker connects and migrates: the worker runs on, or exits 2
    with the one `cannot connect` line its supervisor restarts on; never a traceback."""
    seed, rng = chaos_seed, random.Random(chaos_seed)
    monkeypatch.setenv(chaos_app.STORE_URL_ENV, pg_chaos_url)
    workdir = tmp_path / "chaos"
    chaos_app.prepare(workdir)
    pool = worker_pool(workdir, concurrency=2, lease=LEASE)
    outcomes: Counter[str] = Counter()
    for _ in range(12):
        proc = pool.spawn()
        deadline = time.monotonic() + OUTAGE_SECONDS
        while " starting" not in pool.log_text(proc) and proc.poll() is None:
            assert time.monotonic() < deadline, pool.log_text(proc)
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.06))  # the worker opens its store in these milliseconds
        restart_postgres(pg_server)
        while proc.poll() is None and ": claiming" not in pool.log_text(proc):
            assert time.monotonic() < deadline, f"seed {seed}: " + pool.log_text(proc)[-4000:]
            time.sleep(0.05)
        log = pool.log_text(proc)
        assert "Traceback" not in log, f"seed {seed}: {log[-4000:]}"
        if proc.poll() is None:
            assert pool.stop(proc) == 0, f"seed {seed}: {pool.log_text(proc)[-4000:]}"
            outcomes["ran"] += 1
        else:
            assert proc.returncode == 2 and _START_REFUSED in log, f"seed {seed}: {log[-4000:]}"
            outcomes["refused"] += 1
    print(f"seed {seed}: {dict(outcomes)}")
