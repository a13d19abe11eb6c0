"""Figure P4: recovery on PostgreSQL: 100 runs in flight, their worker SIGKILLed, a new one started.

The same experiment as figure 3 (`recovery.py`, whose workflow and worker
processes are reused) on a fresh PostgreSQL schema per trial: half the runs
blocked inside a `keyed` step, half between two steps; worker A (lease 1 s) is
SIGKILLed, worker B (a new process) recovers them with the blocking condition
gone. The parent watches the database.

engine time = last completion - max(B ready, last lease expiry); the lease
wait is the price of the lease length chosen, not of the engine.

Figure P4b: figure 3b on PostgreSQL: restart after kill -9 with default
settings, perdure beside the floor (A's leases handed back by hand).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import recovery
from .common import Config, Table, child_main, fmt, scratch, verdict
from .pg_common import (
    app_url,
    connect,
    count_sql,
    fresh_schema,
    last_json,
    log_tail,
    same_server,
    sent,
    spawn,
    stop,
    wait_for,
)
from .recovery import DONE, LEASE, RUNNING, RUNS, Recovery, build_app

MODULE = "bench.pg_recovery"
B_CONCURRENCY = (16, 128)
TRIALS = 3  # per row; the trial with the median engine time is shown
TARGET = 0.5  # seconds of engine time


@dataclass
class Trial:
    got: Recovery
    statements: int | None  # sent by worker B, start-up included
    commits: int | None


# -- child side: worker A or B (figure 3's, counting what it sends) ---------------------------


def child(cfg: Config) -> Config:
    count_sql()
    recovery.child(cfg)  # until SIGTERM (B) or SIGKILL (A)
    statements, commits = sent()
    return {"statements": statements, "commits": commits}


# -- parent side ------------------------------------------------------------------------------


def trial(b_concurrency: int, *, defaults: bool = False, by_hand: bool = False) -> Trial:
    def once() -> Trial:
        folder = scratch("pg-recovery")
        with fresh_schema("rec") as schema:
            return _trial(schema, folder, b_concurrency, defaults=defaults, by_hand=by_hand)

    return same_server(once, f"P4 concurrency {b_concurrency}")


def _trial(
    schema: str, folder: str, b_concurrency: int, *, defaults: bool = False, by_hand: bool = False
) -> Trial:
    paths = {
        "url": app_url(schema),
        "gate": os.path.join(folder, "gate"),
        "reached": os.path.join(folder, "reached"),
        "ready": os.path.join(folder, "b-ready"),
    }
    os.makedirs(paths["reached"])
    app, inflight = build_app(paths["url"], paths["gate"], paths["reached"])
    for i in range(RUNS):
        app.start(inflight, i, run_id=f"run{i}")
    app.close()

    log_a = os.path.join(folder, "worker-a.log")
    a_cfg = {**paths, "role": "A", "concurrency": 128, "defaults": defaults}
    worker_a = spawn(MODULE, a_cfg, log_a)
    try:
        _wait_for_blocked(paths["reached"], worker_a, log_a)
        time.sleep(0.2)  # let buffered entries and a heartbeat land, as in a real process
    finally:
        worker_a.send_signal(signal.SIGKILL)
        killed = time.time()
        worker_a.wait()

    with connect(schema) as watch:
        row = watch.execute(
            "SELECT MAX(lease_until) FROM runs WHERE status IN ('running', 'cancelling')"
        ).fetchone()
        expiry = float(row[0]) if row and row[0] is not None else killed
        if by_hand:  # the floor: nothing left to prove
            watch.execute(f"UPDATE runs SET lease_until = 0 WHERE status IN {RUNNING}")
        Path(paths["gate"]).touch()
        spawned = time.time()
        log_b = os.path.join(folder, "worker-b.log")
        b_cfg = {**paths, "role": "B", "concurrency": b_concurrency, "defaults": defaults}
        worker_b = spawn(MODULE, b_cfg, log_b)
        try:
            finished = "SELECT COUNT(*), MAX(updated_at) FROM runs WHERE status = ANY(%s)"

            def all_done() -> bool:
                if worker_b.poll() is not None:
                    raise RuntimeError(f"worker B exited:\n{log_tail(log_b)}")
                return int(watch.execute(finished, (list(DONE),)).fetchone()[0]) >= RUNS

            wait_for(all_done, 60, "runs to finish after recovery", every=0.02)
            done = float(watch.execute(finished, (list(DONE),)).fetchone()[1])
        finally:
            stop(worker_b, signal.SIGTERM)
        ready = float(Path(paths["ready"]).read_text())
        statuses = dict(watch.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))
        recovered = watch.execute("SELECT COUNT(*) FROM runs WHERE recoveries > 0").fetchone()[0]
    got = Recovery(
        total_s=done - killed,
        lease_wait_s=max(0.0, expiry - killed),
        b_startup_s=ready - spawned,
        engine_s=done - max(ready, expiry),
        statuses=statuses,
        recovered=int(recovered),
        after_ready_s=done - ready,
    )
    counts = last_json(log_b)
    return Trial(got, counts.get("statements"), counts.get("commits"))


def _wait_for_blocked(reached: str, worker: subprocess.Popen[bytes], log: str) -> None:
    def blocked() -> bool:
        if worker.poll() is not None:
            raise RuntimeError(f"worker A exited:\n{log_tail(log)}")
        return len(os.listdir(reached)) >= RUNS

    wait_for(blocked, 60, "runs to block")


def figure() -> Table:
    table = Table(
        title=f"Figure P4. PostgreSQL recovery: {RUNS} runs in flight, worker SIGKILLed, new "
        f"worker started (lease {LEASE:g}s; median of {TRIALS} trials; "
        f"target: engine < {TARGET:g}s)",
        headers=[
            "new worker", "kill->all done s", "lease wait s", "B startup s", "engine s",
            "engine trials s", "B stmts/run", "B commits/run", "recovered", "final statuses",
            f"<{TARGET:g}s",
        ],
    )  # fmt: skip
    for concurrency in B_CONCURRENCY:
        trials = sorted((trial(concurrency) for _ in range(TRIALS)), key=lambda t: t.got.engine_s)
        middle = trials[len(trials) // 2]
        got = middle.got
        table.rows.append(
            [
                f"concurrency {concurrency}",
                fmt(got.total_s, 2),
                fmt(got.lease_wait_s, 2),
                fmt(got.b_startup_s, 2),
                fmt(got.engine_s, 3),
                ", ".join(fmt(t.got.engine_s, 2) for t in trials),
                fmt(None if middle.statements is None else middle.statements / RUNS, 1),
                fmt(None if middle.commits is None else middle.commits / RUNS, 2),
                str(got.recovered),
                json.dumps(got.statuses, sort_keys=True),
                verdict(got.engine_s < TARGET),
            ]
        )
    table.notes = [
        "Worker A: concurrency 128, 50 runs blocked in a keyed step, 50 between steps (after a",
        "`once` step). kill->all done: from SIGKILL of A to the last of the 100 runs finishing,",
        "as recorded in the database. lease wait: last lease expiry - kill. B startup: spawn to",
        "App built (interpreter + imports). engine: last completion - max(B ready, last lease",
        "expiry): connect, claim, replay, re-run, complete. B runs with the default poll.",
        "B stmts/run, B commits/run: statements (round trips) and COMMITs worker B sent, per",
        "run (its start-up included), counted in B.",
    ]
    return table


def figure_defaults() -> Table:
    """Figure P4b: kill -9 and restart with default settings on PostgreSQL, beside the floor."""

    def trial_of(b_concurrency: int, *, defaults: bool, by_hand: bool) -> Recovery:
        return trial(b_concurrency, defaults=defaults, by_hand=by_hand).got

    table = recovery.figure_defaults(trial_of, "PostgreSQL")
    table.title = table.title.replace("Figure 3b", "Figure P4b")
    return table


def main() -> None:
    print(figure_defaults().render(), end="\n\n", flush=True)
    print(figure().render(), end="\n\n", flush=True)


if __name__ == "__main__":
    child_main(main, child)
