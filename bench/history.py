"""Figure H: what waking a run costs as its journal grows (1k, 10k, 50k, 100k entries).

A run of N/2 keyed steps (N journal entries: an intent and an outcome each), then
`wait_event("go")`, then one more step. Its journal is seeded with the N entries
the steps would have written (`NewRun.entries`, as `fork` does: the same rows a
live run writes, made in a second instead of minutes), so the worker's first
replay reaches the wait and parks the run. Then, in the same worker process, the
event is sent and the time from `send_event` to the run's completion is measured,
with the worker's RSS growth meanwhile (peak RSS, reset just before, minus RSS
before). That is the wake-up a persistent agent pays every time: the issue's
"resume after an event". Each size runs in a fresh interpreter on a fresh
database (SQLite in a temporary folder; PostgreSQL in a schema of its own,
dropped afterwards). `--pg` adds the PostgreSQL rows; `--sizes 1000,10000`
picks the sizes; `--mode sync` measures a `def` workflow instead.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from .common import Config, Table, child_main, fmt, proc_status, run_child, scratch

MODULE = "bench.history"
SIZES = (1_000, 10_000, 50_000, 100_000)
REPS = 3  # wake-ups measured per size (each a fresh run; the median is shown)


def build_app(url: str, mode: str) -> tuple[Any, Any]:
    import perdure

    app = perdure.App(url)

    @app.step(name="work", effect="keyed")
    def work(i: int) -> int:
        return i

    if mode == "async":

        @app.workflow(name="history")
        async def history_async(steps: int) -> int:
            total = 0
            for i in range(steps):
                total += await work(i)
            await perdure.wait_event("go")
            return total + await work(-1)

        return app, history_async

    @app.workflow(name="history")
    def history_sync(steps: int) -> int:
        total = 0
        for i in range(steps):
            total += work(i)
        perdure.wait_event("go")
        return total + work(-1)

    return app, history_sync


async def seed(app: Any, run_id: str, steps: int) -> None:
    """Create the run with the journal its `steps` keyed steps would have written."""
    from perdure.engine.client import encode_input
    from perdure.store.base import Entry, NewRun

    now = time.time()
    entries: list[Entry] = []
    for pos in range(steps):
        entries.append(
            Entry(
                kind="step.intent",
                name="work",
                position=pos,
                attempt=1,
                at=now,
                data=f'{{"effect":"keyed","key":"{run_id}:{pos}"}}',
            )
        )
        entries.append(
            Entry(
                kind="step.outcome",
                name="work",
                position=pos,
                attempt=1,
                final=True,
                at=now,
                data=f'{{"value":{pos},"ms":0.002}}',
            )
        )
    new = NewRun(
        id=run_id,
        workflow="history",
        input=encode_input("history", [steps], {}),
        code_version="",
        now=now,
        entries=entries,
    )
    await app.runtime.open_store()
    await app.runtime.store.create_run(new)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def child(cfg: Config) -> Config:
    app, _ = build_app(cfg["url"], cfg["mode"])
    return asyncio.run(_measure(app, cfg["entries"] // 2))


async def _measure(app: Any, steps: int) -> Config:
    for rep in range(REPS):
        await seed(app, f"h{rep}", steps)
    worker = app.worker(concurrency=4, lease=60.0, poll=0.01)
    task = asyncio.create_task(worker.run())
    walls: list[float] = []
    grew: list[int] = []
    for rep in range(REPS):
        run_id = f"h{rep}"
        while (await app.runtime.store.get_run(run_id)).status != "waiting":
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # the worker is idle again
        before = proc_status()["rss"]
        _reset_peak()
        began = time.perf_counter()
        handle = app.handle(run_id)
        await app.client.send_event(run_id, "go", None)
        result = await handle.result_async(120)
        walls.append(time.perf_counter() - began)
        grew.append(proc_status()["hwm"] - before)
        expected = steps * (steps - 1) // 2 - 1
        if result != expected:
            raise RuntimeError(f"run {run_id}: result {result}, expected {expected}")
    worker.stop()
    await asyncio.wait_for(task, 60)
    from perdure.engine import sticky

    kept = sticky.cache_of(app)
    walls.sort()
    grew.sort()
    return {
        "resume_ms": walls[len(walls) // 2] * 1000,
        "rss_mib": grew[len(grew) // 2] / 2**20,
        "rss_total_mib": proc_status()["rss"] / 2**20,
        "from_memory": kept.resumed,
    }


def measure_sqlite(entries: int, mode: str) -> Config:
    folder = scratch("history")
    url = f"sqlite:///{folder}/perdure.db"
    return run_child(MODULE, {"url": url, "entries": entries, "mode": mode}, timeout=900)


def measure_pg(entries: int, mode: str) -> Config:
    from .pg_common import app_url, fresh_schema

    with fresh_schema("history") as schema:
        cfg = {"url": app_url(schema), "entries": entries, "mode": mode}
        return run_child(MODULE, cfg, timeout=900)


def figure(sizes: tuple[int, ...], mode: str, pg: bool) -> Table:
    table = Table(
        title=f"Figure H. Waking a run as its journal grows ({mode} workflow; "
        "target: < 50 ms and < 5 MiB at 50,000 entries)",
        headers=["store", "entries", "resume ms", "RSS growth MiB", "worker RSS MiB", "in memory"],
    )
    stores = [("sqlite", measure_sqlite)] + ([("postgres", measure_pg)] if pg else [])
    for name, measure in stores:
        for entries in sizes:
            got = measure(entries, mode)
            table.rows.append(
                [
                    name,
                    f"{entries:,}",
                    fmt(got["resume_ms"], 1),
                    fmt(got["rss_mib"], 1),
                    fmt(got["rss_total_mib"], 0),
                    f"{got['from_memory']}/{REPS}",
                ]
            )
    table.notes.append(
        "resume: send_event to result, median of "
        f"{REPS} runs in one worker process; RSS growth: peak RSS during it minus RSS before"
    )
    table.notes.append(f"worker RSS: the worker process's RSS at the end ({REPS} runs parked once)")
    table.notes.append("in memory: wake-ups that went on from where the run parked (no replay)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.history")
    parser.add_argument("--pg", action="store_true", help="also PostgreSQL (127.0.0.1:5432)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(figure(sizes, args.mode, args.pg).render())


if __name__ == "__main__":
    child_main(main, child)
