"""Lost work after kill -9: how many re-runnable steps run again, and what bounding it costs.

Worker A (its own process) runs RUNS runs at once, each STEPS `keyed` steps whose `def`
body takes BODY_MS and records its execution in a ledger (a file of its own, committed
before the body returns). A is SIGKILLed at a random moment mid-way; worker B (a new
process) finishes every run. *re-run per in-flight run* counts, for each run A had not
finished, the executions beyond the first of each of its steps: recovery re-runs the
step that was executing (its outcome never written); anything more is lost work. The
floor does the same with plain SQL: a thread per run, each step's body then an
INSERT + COMMIT of its outcome, resuming after the last committed step.

*commits per step* is the price: RUNS_FAST runs of FAST_STEPS keyed steps with bodies
of ~0 ms, at once in one worker (in process), store transactions per step (SQLite
counts each one; with `synchronous=FULL` each is an fsync). Group commit keeps it low.

`python -m bench.lost_work` (both stores; `--sqlite` / `--pg` for one), `--rounds N`
(kills per row, default 3; every kill's figure is listed).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import sys
import threading
import time
from typing import Any

from .common import Config, Table, child_main, fmt, median, run_child_on_store, scratch, store_args
from .pg_common import app_url, connect, fresh_schema, log_tail, spawn, stop, wait_for

MODULE = "bench.lost_work"
RUNS, STEPS, BODY_MS = 10, 10, 20
RUNS_FAST, FAST_STEPS = 8, 200
ROUNDS = 3


# -- the ledger: one row per body execution ---------------------------------------------------


def ledger(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS ran (run TEXT, pos INTEGER, pid INTEGER)")
    return conn


def executions(path: str) -> list[tuple[str, int]]:
    return [(r, p) for r, p in ledger(path).execute("SELECT run, pos FROM ran")]


# -- child side: perdure's worker, the floor's process, the commit count ---------------------


def build_app(url: str, ledger_path: str) -> Any:
    import perdure

    app = perdure.App(url)
    local = threading.local()

    @app.step(effect="keyed")
    def work(pos: int) -> int:
        conn = getattr(local, "conn", None) or ledger(ledger_path)
        local.conn = conn
        conn.execute("INSERT INTO ran VALUES (?, ?, ?)",
                     (perdure.current_step().run_id, pos, os.getpid()))  # fmt: skip
        time.sleep(BODY_MS / 1000)
        return pos

    @app.workflow(name="steps")
    async def steps(n: int) -> int:
        for pos in range(n):
            await work(pos)
        return n

    return app, steps


def _floor(cfg: Config) -> None:
    """A thread per unfinished run: body, then its outcome INSERTed and COMMITted."""
    path = cfg["ledger"]

    def run(run_id: str) -> None:
        mine = ledger(path)
        outcomes = _outcomes(cfg)
        first = outcomes.next_pos(run_id)
        for pos in range(first, STEPS):
            mine.execute("INSERT INTO ran VALUES (?, ?, ?)", (run_id, pos, os.getpid()))
            time.sleep(BODY_MS / 1000)
            outcomes.commit(run_id, pos)

    threads = [threading.Thread(target=run, args=(f"r{i}",)) for i in range(RUNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class _SqliteOutcomes:
    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")

    def create(self) -> None:
        self.conn.execute("CREATE TABLE outcome (run TEXT, pos INTEGER)")

    def next_pos(self, run_id: str) -> int:
        row = self.conn.execute("SELECT MAX(pos) FROM outcome WHERE run = ?", (run_id,)).fetchone()
        return 0 if row[0] is None else int(row[0]) + 1

    def commit(self, run_id: str, pos: int) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO outcome VALUES (?, ?)", (run_id, pos))
        self.conn.execute("COMMIT")


class _PgOutcomes:
    def __init__(self, schema: str) -> None:
        self.conn = connect(schema, autocommit=False)
        self.schema = schema

    def create(self) -> None:
        with self.conn.transaction():
            self.conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            self.conn.execute("CREATE TABLE outcome (run TEXT, pos INTEGER)")

    def next_pos(self, run_id: str) -> int:
        with self.conn.transaction():
            row = self.conn.execute(
                "SELECT MAX(pos) FROM outcome WHERE run = %s", (run_id,)
            ).fetchone()
        return 0 if row[0] is None else int(row[0]) + 1

    def commit(self, run_id: str, pos: int) -> None:
        with self.conn.transaction():
            self.conn.execute("INSERT INTO outcome VALUES (%s, %s)", (run_id, pos))


def _outcomes(cfg: Config) -> Any:
    if cfg["store"] == "pg":
        return _PgOutcomes(cfg["schema"])
    return _SqliteOutcomes(cfg["floor_db"])


def _commits(cfg: Config) -> Config:
    """Fast keyed steps, RUNS_FAST runs at once in one worker: store commits per step."""
    import asyncio

    import perdure

    async def main() -> Config:
        app = perdure.App(app_url(cfg["schema"]) if cfg["store"] == "pg" else cfg["url"])

        @app.step(effect="keyed")
        def quick(pos: int) -> int:
            return pos

        @app.workflow(name="quick")
        async def many(n: int) -> int:
            for pos in range(n):
                await quick(pos)
            return n

        worker = app.worker(concurrency=RUNS_FAST, lease=30.0)
        task = asyncio.create_task(worker.run())
        await (await app.start_async(many, FAST_STEPS, run_id="warm")).result_async(60)
        store: Any = app.runtime.store
        before = store.commits
        handles = [
            await app.start_async(many, FAST_STEPS, run_id=f"r{i}") for i in range(RUNS_FAST)
        ]
        for handle in handles:
            await handle.result_async(120)
        commits = store.commits - before
        worker.stop()
        await asyncio.wait_for(task, 30)
        await app.runtime.store.close()
        return {"commits": commits, "steps": RUNS_FAST * FAST_STEPS}

    return asyncio.run(main())


def child(cfg: Config) -> Config:
    if cfg["role"] == "commits":
        return _commits(cfg)
    if cfg["role"] == "floor":
        _floor(cfg)
        return {}
    app, _ = build_app(cfg["url"], cfg["ledger"])
    app.run_worker(concurrency=RUNS, **({"lease": cfg["lease"]} if cfg["lease"] else {}))
    return {}


# -- parent side ------------------------------------------------------------------------------


def _url(store: str, folder: str, schema: str | None) -> str:
    return app_url(schema) if store == "pg" and schema else f"sqlite:///{folder}/perdure.db"


def _reruns(path: str, finished: set[str]) -> list[int]:
    """Executions beyond the first of each step, per run not finished at the kill."""
    counts: dict[tuple[str, int], int] = {}
    for key in executions(path):
        counts[key] = counts.get(key, 0) + 1
    per_run = {f"r{i}": 0 for i in range(RUNS)}
    for (run, _), n in counts.items():
        per_run[run] += n - 1
    return [n for run, n in per_run.items() if run not in finished]


def trial(side: str, store: str, lease: float | None, rng: random.Random) -> list[int]:
    """One kill and recovery: the re-runs of each run in flight at the kill."""
    folder = scratch("lost")
    with fresh_schema("lost") if store == "pg" else _no_schema() as schema:
        cfg = {"role": side, "store": store, "schema": schema, "lease": lease,
               "ledger": f"{folder}/ledger.db", "floor_db": f"{folder}/floor.db",
               "url": _url(store, folder, schema)}  # fmt: skip
        ledger(cfg["ledger"]).close()
        if side == "floor":
            _outcomes(cfg).create()
        else:
            app, steps = build_app(cfg["url"], cfg["ledger"])
            for i in range(RUNS):
                app.start(steps, STEPS, run_id=f"r{i}")
            app.close()
        total = RUNS * STEPS
        kill_at = rng.randint(total // 5, total * 3 // 5)
        first = spawn(MODULE, cfg, f"{folder}/a.log")
        wait_for(lambda: len(executions(cfg["ledger"])) >= kill_at, 120, "executions before kill")
        time.sleep(rng.uniform(0, BODY_MS / 1000))
        stop(first, signal.SIGKILL)
        finished = _finished(side, cfg)
        second = spawn(MODULE, cfg, f"{folder}/b.log")
        try:
            wait_for(lambda: _all_done(side, cfg), 120, "every run to finish")
        except RuntimeError:
            raise RuntimeError(log_tail(f"{folder}/b.log")) from None
        finally:
            stop(second, signal.SIGTERM)
        return _reruns(cfg["ledger"], finished)


class _no_schema:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _finished(side: str, cfg: Config) -> set[str]:
    """The runs finished by now, read from the database."""
    if side == "floor":
        outcomes = _outcomes(cfg)
        return {f"r{i}" for i in range(RUNS) if outcomes.next_pos(f"r{i}") >= STEPS}
    query = "SELECT id FROM runs WHERE status = 'completed'"
    if cfg["store"] == "pg":
        with connect(cfg["schema"]) as conn:
            return {row[0] for row in conn.execute(query)}
    db = cfg["url"].removeprefix("sqlite:///")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as conn:
        return {row[0] for row in conn.execute(query)}


def _all_done(side: str, cfg: Config) -> bool:
    return len(_finished(side, cfg)) == RUNS


def figure(stores: tuple[str, ...], rounds: int) -> Table:
    rng = random.Random(int(os.environ.get("PERDURE_BENCH_SEED", "7")))
    table = Table(
        f"Lost work after kill -9: {RUNS} runs of {STEPS} keyed steps of {BODY_MS} ms; "
        f"{rounds} kills per row",
        ["side", "store", "lease", "re-run per in-flight run: mean", "max", "every kill",
         "commits/step"],
    )  # fmt: skip
    for store in stores:
        label = "SQLite" if store == "sqlite" else "PostgreSQL"
        commits = run_child_on_store(MODULE, {"role": "commits", "store": store,
                                              "url": _commit_url(store)}, "lostc")  # fmt: skip
        per_step = fmt(commits["commits"] / commits["steps"], 3)
        for side, lease in (("floor", None), ("perdure", None), ("perdure", 5.0)):
            got = [trial(side, store, lease, rng) for _ in range(rounds)]
            flat = [n for kill in got for n in kill]
            table.rows.append([
                side, label, "-" if side == "floor" else f"{lease or 30:g} s",
                fmt(median([sum(k) / max(len(k), 1) for k in got]), 2), str(max(flat, default=0)),
                " / ".join(str(sum(k)) + f" in {len(k)}" for k in got),
                per_step if side == "perdure" and lease is None else "-",
            ])  # fmt: skip
    table.notes = [
        "re-run: executions of a step beyond its first, per run A had not finished; the "
        "step executing at the kill is one",
        f"commits/step: {RUNS_FAST} runs of {FAST_STEPS} keyed ~0 ms steps at once, one "
        "worker; store transactions per step",
    ]
    return table


def _commit_url(store: str) -> str:
    return "" if store == "pg" else f"sqlite:///{scratch('lostc')}/perdure.db"


def main() -> None:
    stores, _before, rounds = store_args(sys.argv[1:], ROUNDS)
    print(figure(stores, rounds).render())


if __name__ == "__main__":
    child_main(main, child)
