"""Real time: three worker processes share an every-second schedule; one is killed mid-way.

Three `perdure worker` processes run `schedule_app.py` on one store (a SQLite file, or a
fresh PostgreSQL schema). For about 20 s the schedule `tick` fires every second; each
tick's run appends one line to a ledger file and holds its step for 2 s, so ticks
overlap and are spread over the workers. Around t=9 s the worker holding the most runs
is killed with SIGKILL and NOT restarted: the two survivors must keep firing every tick
and recover the killed worker's runs. Then the test pauses the schedule, waits for every
run to finish, stops the survivors with SIGTERM and checks from the store and the ledger:

- every whole second from the schedule's first tick to the pause has exactly one tick,
  status "fired", and exactly one run `sched:tick:{UTC time}Z`, and that run completed;
  no tick is missed, skipped or queued, none fired after the pause;
- no tick was fired twice (its tick row and its run were written by the same step);
- each tick's body ran, and more than once only when the killed worker ran it first and
  died before its outcome was written (an idempotent step re-run by recovery).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import perdure
from perdure.store.base import COMPLETED, TERMINAL
from perdure.triggers.schedules import run_id_for
from waits import wait_for

HERE = Path(__file__).resolve().parent
APP_FILE = HERE / "schedule_app.py"
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

WORKERS = 3
RUN_SECONDS = 20.0  # from the first fired tick to the pause
KILL_WINDOW = (8.0, 10.0)  # seconds after the first tick: kill one worker in this window
HOLD = 2.0  # seconds each tick's step takes: ticks overlap, a kill lands mid-step
LEASE = 2.0
LATENESS = 1.0  # a tick due this long before the pause must have fired by then
SETTLE_SECONDS = 30.0  # after the pause, every run must finish within this


def _load_app(url: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """schedule_app.py, loaded by path with its App on `url` (PERDURE_DB)."""
    monkeypatch.setenv("PERDURE_DB", url)
    spec = importlib.util.spec_from_file_location(f"schedule_app_{uuid.uuid4().hex}", APP_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A SQLite file in tmp_path, or a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'perdure.db'}"
        return
    import psycopg

    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:  # the PostgreSQL suites run in CI too: fail, loudly
        pytest.fail(f"no PostgreSQL at {PG_URL} ({exc}): start it (see .ci/run)")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SET lock_timeout = '20s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class Workers:
    """`perdure worker` processes on one store; any still alive is killed at the end."""

    def __init__(self, workdir: Path, url: str, ledger: Path) -> None:
        self.workdir = workdir
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PERDURE_DB": url,
            "SCHEDULE_LEDGER": str(ledger),
            "SCHEDULE_HOLD": str(HOLD),
        }
        self.env.pop("PERDURE_APP", None)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def spawn(self) -> subprocess.Popen[bytes]:
        args = [
            sys.executable,
            "-m",
            "perdure",
            "--app",
            "schedule_app:app",
            "worker",
            "--concurrency",
            "8",
            "--lease",
            str(LEASE),
            "--poll",
            "0.1",
            "--grace",
            "5",
        ]
        log = self.workdir / f"worker-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=HERE,  # the CLI imports schedule_app from the working directory
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def log_text(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def reap(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def _sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "store_url",
    [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
def test_every_second_schedule_three_workers_one_killed(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each second fires exactly once, and its body runs, although a worker dies mid-way."""
    mod = _load_app(store_url, monkeypatch)
    app: perdure.App = mod.app
    ledger_path = tmp_path / "ledger.jsonl"
    workers = Workers(tmp_path, store_url, ledger_path)
    name = mod.SCHEDULE
    try:
        app.list_runs(limit=1)  # create and migrate the store before the workers race for it
        for _ in range(WORKERS):
            workers.spawn()

        def check_alive(exempt: frozenset[int] = frozenset()) -> None:
            for proc in workers.procs:
                if proc.pid not in exempt and proc.poll() is not None:
                    pytest.fail(
                        f"worker {proc.pid} exited by itself with {proc.returncode}:\n"
                        + workers.log_text(proc)[-4000:]
                    )

        def unfinished() -> list[Any]:
            runs = app.list_runs(workflow=name, limit=100_000)
            return [r for r in runs if r.status not in TERMINAL]

        def holding() -> dict[int, int]:
            """Unfinished runs leased by each live worker (lease owner host:pid:nonce), by pid."""
            owners: Counter[int] = Counter()
            for run in unfinished():
                parts = (run.lease_owner or "").split(":")
                if len(parts) == 3:
                    owners[int(parts[1])] += 1
            return {p.pid: owners[p.pid] for p in workers.procs if p.poll() is None}

        # -- the schedule is stored by the first worker and fires its first tick ------------
        schedule = wait_for(
            "a worker to store the schedule",
            lambda: next((s for s in app.schedules() if s.name == name), None),
            timeout=30,
            every=0.1,
        )
        assert schedule.every == 1.0 and schedule.overlap == "allow", schedule
        first_fired = wait_for(
            "the first fired tick",
            lambda: [t for t in app.schedule_ticks(name, limit=10) if t.status == "fired"],
            timeout=15,
            every=0.1,
        )
        t0 = min(t.fire_at for t in first_fired)
        check_alive()

        # -- kill -9 the worker holding the most runs, some time in the kill window --------
        _sleep_until(t0 + KILL_WINDOW[0])
        held: dict[int, int] = {}
        while True:
            check_alive()
            held = holding()
            if max(held.values()) > 0 or time.time() >= t0 + KILL_WINDOW[1]:
                break
            time.sleep(0.05)
        victim_pid = max(held, key=lambda pid: held[pid])
        victim = next(p for p in workers.procs if p.pid == victim_pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kill_at = time.time()
        victim_held = held[victim_pid]
        assert victim_held > 0, (
            f"no worker held a tick's run between t0+{KILL_WINDOW[0]}s and "
            f"t0+{KILL_WINDOW[1]}s (held: {held}): the kill would test nothing"
        )

        # -- let the two survivors run on, then pause the schedule ---------------------------
        while time.time() < t0 + RUN_SECONDS:
            check_alive(frozenset({victim_pid}))
            time.sleep(0.2)
        pause_at = time.time()
        paused = app.pause_schedule(name)
        paused_done = time.time()
        assert paused.paused

        # -- the survivors finish every run, including the ones the killed worker held ------
        def settled() -> bool:
            check_alive(frozenset({victim_pid}))
            return not unfinished()

        wait_for("every tick's run to finish", settled, timeout=SETTLE_SECONDS, every=0.1)
        settled_at = time.time()
        survivors = [p for p in workers.procs if p.pid != victim_pid]
        for proc in survivors:
            proc.send_signal(signal.SIGTERM)
        codes = {proc.pid: proc.wait(timeout=30) for proc in survivors}
        assert all(code == 0 for code in codes.values()), (
            f"survivors did not stop cleanly on SIGTERM: {codes}\n"
            + "\n".join(workers.log_text(p)[-2000:] for p in survivors)
        )

        # -- the store: one fired tick and one completed run per second, nothing else -------
        ticks = app.schedule_ticks(name, limit=100_000)
        by_status = Counter(t.status for t in ticks)
        assert set(by_status) == {"fired"}, (
            f"ticks not fired: {[t for t in ticks if t.status != 'fired']}"
        )
        fired = sorted(t.fire_at for t in ticks)
        assert len(fired) == len(set(fired)), f"a tick recorded twice: {Counter(fired)}"
        assert all(t == int(t) for t in fired), f"ticks off the whole second: {fired}"
        first, last = fired[0], fired[-1]
        assert first == t0
        # The first tick is the first whole second after the schedule was stored.
        stored = next(s for s in app.schedules() if s.name == name)
        head = [float(T) for T in range(int(stored.created_at) + 1, int(first))]
        assert first == float(int(stored.created_at) + 1), (
            f"the schedule was stored at {stored.created_at}, its first fired tick is {first}: "
            f"ticks {head} were lost without a tick row"
        )
        expected = [float(T) for T in range(int(first), int(pause_at - LATENESS) + 1)]
        missing = sorted(set(expected) - set(fired))
        assert not missing, f"ticks lost: {missing} (fired {first}..{last}, paused {pause_at})"
        gaps = sorted(set(range(int(first), int(last))) - {int(t) for t in fired})
        assert not gaps, f"ticks lost between {first} and {last}: {gaps}"
        assert last <= paused_done, f"tick {last} fired after the pause ({paused_done})"
        assert last - first >= RUN_SECONDS - 3, f"only {first}..{last} fired in {RUN_SECONDS}s"

        runs = {r.id: r for r in app.list_runs(workflow=name, limit=100_000)}
        want = {run_id_for(name, T): T for T in fired}
        assert set(runs) == set(want), (
            f"runs without a tick: {sorted(set(runs) - set(want))}; "
            f"ticks without a run: {sorted(set(want) - set(runs))}"
        )
        not_done = {rid: r.status for rid, r in runs.items() if r.status != COMPLETED}
        assert not not_done, f"runs that did not complete: {not_done}"
        for t in ticks:
            assert t.run_id == run_id_for(name, t.fire_at), t
            # A tick fired twice would overwrite its row's time, not the run's creation time.
            assert t.at == runs[t.run_id].created_at, (
                f"tick {t.fire_at} recorded at {t.at}, its run created at "
                f"{runs[t.run_id].created_at}: fired twice?"
            )
            assert t.at >= t.fire_at, f"tick {t.fire_at} fired early, at {t.at}"

        # -- the ledger: every tick's body ran; twice only where the killed worker died ------
        lines = mod.read_ledger(ledger_path)
        execs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for line in lines:
            execs[line["run"]].append(line)
        assert set(execs) == set(runs), (
            f"bodies that never ran: {sorted(set(runs) - set(execs))}; "
            f"bodies of unknown runs: {sorted(set(execs) - set(runs))}"
        )
        re_executed: dict[str, list[int]] = {}
        for run_id, found in execs.items():
            by_others = [e for e in found if e["pid"] != victim_pid]
            assert len(by_others) <= 1, f"{run_id}'s body ran twice in live workers: {found}"
            if len(found) > 1:
                assert [e["pid"] for e in found[:-1]] == [victim_pid] * (len(found) - 1), found
                re_executed[run_id] = [e["pid"] for e in found]
                kinds = [e.kind for e in app.journal(run_id)]
                assert "run.recovered" in kinds, f"{run_id} re-ran without a recovery: {kinds}"
        assert len(re_executed) <= victim_held, (
            f"{len(re_executed)} bodies re-ran, the killed worker held only {victim_held} runs"
        )
        recovered = [
            rid for rid in runs if any(e.kind == "run.recovered" for e in app.journal(rid))
        ]
        assert recovered, "no run was recovered from the killed worker"
        by_pid = Counter(e["pid"] for e in lines)
        re_runs = sum(len(v) - 1 for v in re_executed.values())

        print(
            f"\n[{store_url.split(':')[0]}] workers={WORKERS} (1 killed, not restarted) "
            f"ticks fired={len(fired)} ({first:.0f}..{last:.0f}) "
            f"runs completed={len(runs) - len(not_done)} missed/skipped/queued=0 "
            f"kill at t0+{kill_at - t0:.1f}s (victim pid {victim_pid} held {victim_held} runs) "
            f"runs recovered={len(recovered)} re-executions={re_runs} "
            f"(ticks {sorted(re_executed)}) "
            f"bodies by pid={dict(by_pid)} pause at t0+{pause_at - t0:.1f}s "
            f"settled {settled_at - pause_at:.1f}s after"
        )
    finally:
        workers.reap()
        app.close()
