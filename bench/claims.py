"""What a claim costs as the store's history grows: an idle worker's poll, and a claim
that takes one run, with 0 / 10,000 / 100,000 finished runs of the same workflow.

Every idle worker claims every `poll` seconds (0.5 by default), so an idle poll that
scans finished runs is CPU spent for nothing, forever, on every worker.

`python -m bench.claims` prints the table (SQLite and PostgreSQL); `--sqlite` / `--pg`
only one store; `--before DIR` also measures the perdure in source folder DIR (e.g. an
export of an older main's src/) in the same rounds; `--rounds N` (default 3).
"""

from __future__ import annotations

import asyncio
import sys
import time

from .common import (
    Config,
    Table,
    child_main,
    fmt,
    median,
    run_child_on_store,
    scratch,
    store_args,
)

MODULE = "bench.claims"
HISTORY = (0, 10_000, 100_000)
CLAIMS = 200  # timed claims per measurement
ROUNDS = 3


def child(cfg: Config) -> Config:
    return asyncio.run(_measure_child(cfg))


def _fill(cfg: Config, url: str, finished: int) -> None:
    """`finished` completed runs of workflow wf, written straight into the runs table."""
    if not finished:
        return
    if cfg["store"] == "pg":
        from .pg_common import connect

        with connect(cfg["schema"]) as conn:
            conn.execute(
                "INSERT INTO runs (id, workflow, status, input, created_at, updated_at) "
                "SELECT 'old' || n, 'wf', 'completed', '{}', n, n "
                "FROM generate_series(1, %s) AS n",
                (finished,),
            )
            conn.execute("ANALYZE runs")
        return
    import sqlite3

    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
        "INSERT INTO runs (id, workflow, status, input, created_at, updated_at) "
        "SELECT 'old' || i, 'wf', 'completed', '{}', i, i FROM n",
        (finished,),
    )
    conn.close()


async def _measure_child(cfg: Config) -> Config:
    from perdure.store import open_store
    from perdure.store.base import NewRun

    if cfg["store"] == "pg":
        from .pg_common import app_url

        url = app_url(cfg["schema"])
    else:
        url = f"sqlite:///{scratch('claims')}/claims.db"
    store = open_store(url)
    await store.open()
    _fill(cfg, url, cfg["finished"])
    now = time.time()
    for _ in range(10):  # warm-up
        await store.claim("w", now, 30.0, 1, ["wf"])
    idle = time.perf_counter()
    for _ in range(CLAIMS):
        assert not await store.claim("w", now, 30.0, 1, ["wf"])
    idle = time.perf_counter() - idle
    taking = 0.0
    for i in range(CLAIMS):
        await store.create_run(NewRun(f"new{i}", "wf", "{}", "v", now))
        started = time.perf_counter()
        assert len(await store.claim("w", now, 30.0, 1, ["wf"])) == 1
        taking += time.perf_counter() - started
    await store.close()
    return {"idle_us": idle / CLAIMS * 1e6, "take_us": taking / CLAIMS * 1e6}


def figure(stores: tuple[str, ...], before: str | None, rounds: int = ROUNDS) -> Table:
    sides: list[tuple[str, str | None]] = [("perdure", None)]
    if before:
        sides.append(("before", before))
    headers = ["store", "finished runs"]
    for side, _ in sides:
        headers += [f"idle poll us ({side})", f"claim of one us ({side})"]
    table = Table(title=f"Claim cost by history (median of {rounds} rounds)", headers=headers)
    plan = [(store, n) for store in stores for n in HISTORY]
    trials: dict[tuple[str, int, str], list[Config]] = {}
    for _ in range(rounds):
        for store, n in plan:
            for side, src in sides:
                got = run_child_on_store(MODULE, {"store": store, "finished": n}, "claims",
                                         src=src)  # fmt: skip
                trials.setdefault((store, n, side), []).append(got)
    for store, n in plan:
        cells = ["SQLite" if store == "sqlite" else "PostgreSQL", f"{n:,}"]
        for side, _ in sides:
            got = trials[(store, n, side)]
            cells += [fmt(median([g["idle_us"] for g in got])),
                      fmt(median([g["take_us"] for g in got]))]  # fmt: skip
        table.rows.append(cells)
    table.notes = [
        f"idle poll: a claim with nothing runnable, {CLAIMS} times; claim of one: a claim",
        "taking the one pending run just created; the store's own API, one process.",
    ]
    return table


if __name__ == "__main__":
    child_main(lambda: print(figure(*store_args(sys.argv[1:], ROUNDS)).render(), flush=True), child)
