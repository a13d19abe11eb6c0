"""Clock skew: two workers on one PostgreSQL store, one of them on a host whose clock is 90 s
ahead (or behind), made so with libfaketime. Every time the hosts must agree on (lease
expiry, timers, journal times) is the database server's: no live worker's run is taken
over, no sleep wakes early, no once body runs twice, and the skewed worker says so.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import skew_app

import perdure

HERE = Path(__file__).resolve().parent
QUICK, SLEEPERS, SLEEP = 200, 20, 6.0
LEASE = 5.0  # far below the skew: a worker reading its own clock would see every lease expired
SKEW = 90
# Debian's faketime package, on whichever architecture
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "libfaketime.so.1")


def worker(workdir: Path, env: dict[str, str], name: str, skew: int) -> subprocess.Popen[bytes]:
    """`perdure worker` in a process of its own, its clock `skew` seconds off (libfaketime
    preloaded into the worker itself: the `faketime` wrapper would stand between it and
    our signals)."""
    command = [sys.executable, "-m", "perdure", "--app", "skew_app:app", "worker",
               "--id", name, "--lease", str(LEASE), "--poll", "0.1",
               "--concurrency", "8"]  # fmt: skip
    log = (workdir / f"{name}.log").open("wb")
    if skew:
        env = {**env, "LD_PRELOAD": LIBFAKETIME, "FAKETIME": f"{skew:+d}s",
               "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
    return subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_a_skewed_host_steals_no_lease_and_cuts_no_sleep_short(
    pg_chaos_url: str, tmp_path: Path, skew: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert os.path.exists(LIBFAKETIME), "needs libfaketime: apt-get install faketime (.ci/run does)"
    env = {**os.environ, "PERDURE_DB": pg_chaos_url, "SKEW_DIR": str(tmp_path),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    client = skew_app.register(perdure.App(pg_chaos_url))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        client.runtime.sync(client.runtime.open_store(), "open")
        for i in range(SLEEPERS):
            client.start("sleeper", f"s{i}", SLEEP, run_id=f"s{i}")
        procs = [worker(tmp_path, env, "straight", 0), worker(tmp_path, env, "skewed", skew)]
        for i in range(QUICK):
            client.start("quick", f"q{i}", run_id=f"q{i}")
        asleep: dict[str, float] = {}  # when this process first saw each sleeper asleep
        woke: dict[str, float] = {}
        deadline = time.monotonic() + 120
        while True:
            runs = {r.id: r for r in client.list_runs(limit=10_000)}
            now = time.monotonic()
            for run_id, run in runs.items():
                if run_id.startswith("s") and run.status == "sleeping":
                    asleep.setdefault(run_id, now)
                if run_id.startswith("s") and run.status == "completed":
                    woke.setdefault(run_id, now)
            if all(r.status == "completed" for r in runs.values()):
                break
            for proc in procs:
                assert proc.poll() is None, (tmp_path / "skewed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, Counter(r.status for r in runs.values())
            time.sleep(0.05)
        recovered = [(r.id, e.data) for r in runs.values() for e in client.journal(r.id)
                     if e.kind == "run.recovered"]  # fmt: skip
        slept = {run_id: woke[run_id] - at for run_id, at in asleep.items() if run_id in woke}
        early = {run_id: round(s, 2) for run_id, s in slept.items() if s < SLEEP / 2}
        lines = [json.loads(x) for f in tmp_path.glob("ledger-*.jsonl")
                 for x in f.read_text().splitlines()]  # fmt: skip
        bodies = Counter((x["run"], x["step"]) for x in lines if x["step"] == "charge")
        twice = {k: n for k, n in bodies.items() if n > 1}
        by_worker = Counter(r.lease_owner for r in runs.values())
        workers = {
            w.id: w.clock_offset
            for w in client.runtime.sync(client.runtime.store.list_workers(0), "w")
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        client.close()
    skewed_log = (tmp_path / "skewed.log").read_text()
    ran = Counter(x["pid"] for x in lines)
    summary = {"skew": skew, "takeovers": len(recovered), "early_wakeups": len(early),
               "once_twice": len(twice), "sleepers_timed": len(slept),
               "shortest_sleep": round(min(slept.values()), 2) if slept else None,
               "bodies_per_worker": sorted(ran.values()), "offsets": workers}  # fmt: skip
    with capsys.disabled():
        print(f"\nclock skew summary: {json.dumps(summary, sort_keys=True, default=str)}")
    assert recovered == [], f"live workers' runs taken over: {recovered[:5]} {summary}"
    assert early == {}, f"sleeps cut short: {early} {summary}"
    assert twice == {}, f"once bodies run twice: {twice}"
    assert len(slept) >= SLEEPERS // 2, summary  # most sleepers were seen asleep and awake
    assert len(ran) == 2, f"both workers ran steps: {summary}"
    assert abs(abs(workers["skewed"] or 0) - SKEW) < 5, workers  # the offset it measured
    direction = "ahead of" if skew > 0 else "behind"
    assert "this host's clock is" in skewed_log and direction in skewed_log, skewed_log[-2000:]
    assert "Traceback" not in skewed_log
    del by_worker
