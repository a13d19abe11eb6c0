"""The SQL of one `once` step's commit, without the engine: perdure's write beside the floor's.

What part of a step's cost is the journal's shape, before any of the engine's Python?
Each child runs one way of committing a step COMMITS times in a tight loop, on a
fresh SQLite file (WAL, `synchronous=NORMAL`: no fsync, so the figure is CPU):

- floor: BEGIN IMMEDIATE, one small INSERT, COMMIT (bench/common.py's Floor);
- perdure SQL: BEGIN IMMEDIATE, `sqlops.append` of what a `once` step writes (the last
  step's outcome and this step's intent, fenced by the run's lease epoch), COMMIT, on a
  plain connection to a perdure store;
- perdure SQL, intent only: the same with one row (what one row per step would cost);
- store path: `store.append` of the same write, as a run alone in its worker commits it
  on its own thread (the store's transaction, its write-lock record and checkpoint count).

Rounds interleave the ways; medians. `python -m bench.step_sql`; `--rounds N` (default 5).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .common import Config, Floor, Table, child_main, fmt, median, run_child, scratch

MODULE = "bench.step_sql"
COMMITS = 3000  # measured commits per child (after WARM)
WARM = 200
ROUNDS = 5
WAYS = {
    "floor": "floor: one INSERT + COMMIT",
    "sql": "perdure SQL: outcome + intent, fenced",
    "sql_one": "perdure SQL: intent only, fenced",
    "store": "store path: append on the caller's thread (outcome + intent)",
}
RUN = "bench-run"

if TYPE_CHECKING:
    from perdure.store.base import Append


def child(cfg: Config) -> Config:
    folder = scratch("stepsql")
    if cfg["way"] == "floor":
        floor = Floor(os.path.join(folder, "floor.db"), "NORMAL")
        return _timed(lambda i: floor.step(RUN, i, {"i": i}), floor.close)
    return asyncio.run(_perdure(cfg["way"], os.path.join(folder, "perdure.db")))


def _timed(commit: Callable[[int], None], close: Callable[[], None]) -> Config:
    for i in range(WARM):
        commit(i)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(WARM, WARM + COMMITS):
        commit(i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    close()
    return {"wall_us": wall / COMMITS * 1e6, "cpu_us": cpu / COMMITS * 1e6}


async def _perdure(way: str, path: str) -> Config:
    from perdure.store.base import Append, Entry, NewRun
    from perdure.store.sqlite import SQLiteStore

    store = SQLiteStore(path, synchronous="NORMAL")
    await store.open()
    run, _ = await store.create_run(
        NewRun(
            id=RUN,
            workflow="bench",
            input="{}",
            code_version="",
            now=time.time(),
            lease=("w", 1e12),
        )
    )
    epoch = run.lease_epoch
    keys = itertools.count()

    def write(i: int) -> Append:
        intent = Entry("step.intent", "work", 2 * i + 1, '{"effect":"once","key":"k"}', 1)
        outcome = Entry("step.outcome", "work", 2 * i, '{"value":{"i":1},"ms":0.01}', 1, True)
        entries = [intent] if way == "sql_one" else [outcome, intent]
        for e in entries:
            e.at, e.worker = time.time(), "w"
        return Append(RUN, epoch, entries, fields={"updated_at": time.time()},
                      key=f"bench:{next(keys):x}", direct_ok=True)  # fmt: skip

    if way == "store":

        def commit(i: int) -> None:
            writing = store.append(write(i))
            try:
                writing.send(None)  # done at once: committed on this thread
            except StopIteration:
                return
            writing.close()
            raise RuntimeError("the store thread was busy: nothing else should use it")

        result = _timed(commit, lambda: None)
        await store.close()
        return result
    await store.close()
    return _raw(path, write)


def _raw(path: str, write: Callable[[int], Append]) -> Config:
    """perdure's append on a plain connection: BEGIN IMMEDIATE, sqlops.append, COMMIT."""
    from perdure.store import sqlops
    from perdure.store.dialect import Db

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    db = Db(conn)

    def commit(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        sqlops.append(db, write(i))
        conn.execute("COMMIT")

    return _timed(commit, conn.close)


def figure(rounds: int = ROUNDS) -> Table:
    trials: dict[str, list[Config]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            trials[way].append(run_child(MODULE, {"way": way}))
    table = Table(
        title=f"One once step's commit, no engine (SQLite, NORMAL; median of {rounds} rounds)",
        headers=["way", "µs wall", "µs CPU", "CPU / floor"],
    )
    floor_cpu = median([t["cpu_us"] for t in trials["floor"]])
    for way, label in WAYS.items():
        wall = median([t["wall_us"] for t in trials[way]])
        cpu = median([t["cpu_us"] for t in trials[way]])
        table.rows.append([label, fmt(wall), fmt(cpu), f"{cpu / floor_cpu:.2f}x"])
    table.notes = [
        f"{COMMITS} commits per child after {WARM} unmeasured, each way in a fresh process",
        "and file; CPU is the process's (all threads). bench.core_path measures the whole step.",
    ]
    return table


def main() -> None:
    args = sys.argv[1:]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else ROUNDS
    print(figure(rounds).render(), flush=True)


if __name__ == "__main__":
    child_main(main, child)
