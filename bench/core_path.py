"""The core-path table (issue 14): per-step cost and runs one after another, both stores.

Every row is measured floor and perdure side by side in one invocation: each
configuration runs in a fresh interpreter on a fresh database (PostgreSQL: a
fresh schema, dropped afterwards), rounds interleave the configurations so that
load from other users of the machine hits both sides alike, and the median of
the rounds is shown.

- per step: a 200-step async workflow of `once` steps (a sync `def` body), run
  by an in-process worker (concurrency 1) already running, from `start_async`
  to the result; the floor is one INSERT + COMMIT per step.
- runs one after another: 5-step runs started with `start_async` and awaited
  one at a time; the floor is 6 INSERT + COMMITs per run (the start and 5 steps).
- eight at a time: the same 5-step runs from 8 callers at once (each starts a run and
  awaits it, then the next), worker concurrency 8; the floor is 8 threads, each with its
  own connection, doing a run's 6 INSERT + COMMITs one after another.
- CPU per run: `time.process_time()` (all threads) over those runs, per run.

`python -m bench.core_path` prints the table; `--sqlite` / `--pg` only one store;
`--before DIR` also measures the perdure in source folder DIR (e.g. an export of
main's src/) in the same rounds, for a before/after; `--rounds N` (default 3).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable

from .common import (
    Config,
    Floor,
    Table,
    child_main,
    fmt,
    median,
    run_child_on_store,
    scratch,
    store_args,
)

MODULE = "bench.core_path"
STEPS = 200  # per-step figure: steps per run
REPS = 5  # per-step figure: measured runs per child
RUN_STEPS = 5  # runs-one-after-another figure: steps per run
RUNS = 200  # runs-one-after-another figure: measured runs per child
CALLERS = 8  # eight-at-a-time figure: callers (floor: threads) at once
ROUNDS = 3

# -- child side ------------------------------------------------------------------------


def child(cfg: Config) -> Config:
    if cfg["kind"] == "floor":
        return _floor(cfg)
    return asyncio.run(_perdure(cfg))


def _floor_steps(cfg: Config) -> tuple[Callable[[str, int], None], Callable[[], None]]:
    if cfg["store"] == "pg":
        from .pg_common import PgFloor

        pg = PgFloor(cfg["schema"])
        return (lambda run, seq: pg.step(run, seq, {"i": seq})), pg.conn.close
    floor = Floor(os.path.join(scratch("core"), "floor.db"), cfg["synchronous"])
    return (lambda run, seq: floor.step(run, seq, {"i": seq})), floor.close


def _floor(cfg: Config) -> Config:
    if cfg["shape"] == "runs8":
        return _floor_callers(cfg)
    step, close = _floor_steps(cfg)
    steps, runs = (STEPS, REPS) if cfg["shape"] == "steps" else (RUN_STEPS + 1, RUNS)
    for i in range(steps):  # warm-up
        step("warm", i)
    wall, cpu = time.perf_counter(), time.process_time()
    for run in range(runs):
        for i in range(steps):
            step(f"r{run}", i)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    close()
    return {"wall": wall, "cpu": cpu, "runs": runs, "steps": steps}


def _floor_callers(cfg: Config) -> Config:
    """CALLERS threads, each its own connection to one file, RUNS // CALLERS runs of 6
    commits each (SQLite only)."""
    path = os.path.join(scratch("core"), "floor.db")
    Floor(path, cfg["synchronous"]).close()  # the table, before the threads race for it
    per = RUNS // CALLERS
    ready = threading.Barrier(CALLERS + 1)

    def caller(n: int) -> None:
        floor = Floor(path, cfg["synchronous"])
        floor.step(f"warm{n}", 0, {"i": 0})
        ready.wait()
        for run in range(per):
            for i in range(RUN_STEPS + 1):
                floor.step(f"c{n}r{run}", i, {"i": i})
        floor.close()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(CALLERS)]
    for t in threads:
        t.start()
    ready.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall": wall, "cpu": cpu, "runs": per * CALLERS, "steps": RUN_STEPS + 1}


async def _perdure(cfg: Config) -> Config:
    import perdure

    if cfg["store"] == "pg":
        from .pg_common import app_url

        url = app_url(cfg["schema"])
    else:
        url = f"sqlite:///{scratch('core')}/perdure.db?synchronous={cfg['synchronous']}"
    app = perdure.App(url)

    @app.step(name="work", effect=cfg["effect"])
    def work(i: int) -> dict[str, int]:
        return {"i": i}

    @app.workflow(name="steps")
    async def steps_wf(n: int) -> int:
        for i in range(n):
            await work(i)
        return n

    steps, runs = (STEPS, REPS) if cfg["shape"] == "steps" else (RUN_STEPS, RUNS)
    callers = CALLERS if cfg["shape"] == "runs8" else 1
    worker = app.worker(concurrency=callers, lease=30.0, poll=0.01)
    task = asyncio.create_task(worker.run())
    await (await app.start_async(steps_wf, steps, run_id="warm")).result_async(60)

    async def caller(n: int) -> None:
        for run in range(runs // callers):
            handle = await app.start_async(steps_wf, steps, run_id=f"c{n}r{run}")
            await handle.result_async(60)

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(caller(n) for n in range(callers)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    runs = runs // callers * callers
    worker.stop()
    await asyncio.wait_for(task, 30)
    await app.runtime.store.close()
    return {"wall": wall, "cpu": cpu, "runs": runs, "steps": steps}


# -- parent side -----------------------------------------------------------------------


# (row label, floor config, perdure config, what the row shows)
Row = tuple[str, Config, Config, str]


def rows(stores: tuple[str, ...]) -> list[Row]:
    out: list[Row] = []
    if "sqlite" in stores:
        for sync, label in (("FULL", "fsync on"), ("NORMAL", "synchronous=NORMAL")):
            base = {"store": "sqlite", "synchronous": sync, "shape": "steps"}
            out.append(
                (f"SQLite us per once step, {label}", {**base, "kind": "floor"},
                 {**base, "kind": "perdure", "effect": "once"}, "step_us")
            )  # fmt: skip
        for sync, effect in (("FULL", "once"), ("NORMAL", "keyed")):
            base = {"store": "sqlite", "synchronous": sync, "shape": "runs"}
            out.append(
                (f"SQLite 5-step runs/s one after another, {effect}, {sync}",
                 {**base, "kind": "floor"}, {**base, "kind": "perdure", "effect": effect},
                 "runs_s")
            )  # fmt: skip
        base = {"store": "sqlite", "synchronous": "FULL", "shape": "runs8"}
        out.append(
            (f"SQLite 5-step runs/s, {CALLERS} at a time, once, FULL",
             {**base, "kind": "floor"}, {**base, "kind": "perdure", "effect": "once"}, "runs_s")
        )  # fmt: skip
    if "pg" in stores:
        out.append(
            ("PostgreSQL us per once step", {"store": "pg", "shape": "steps", "kind": "floor"},
             {"store": "pg", "shape": "steps", "kind": "perdure", "effect": "once"}, "step_us")
        )  # fmt: skip
        base = {"store": "pg", "shape": "runs"}
        out.append(
            ("PostgreSQL 5-step runs/s one after another, keyed", {**base, "kind": "floor"},
             {**base, "kind": "perdure", "effect": "keyed"}, "runs_s")
        )  # fmt: skip
    return out


def _value(got: Config, what: str) -> float:
    if what == "step_us":
        return float(got["wall"]) / (got["runs"] * got["steps"]) * 1e6
    if what == "runs_s":
        return float(got["runs"]) / got["wall"]
    return float(got["cpu"]) / got["runs"] * 1e3  # cpu_ms per run


def _share(got: dict[str, float], side: str, what: str) -> str:
    """A side's figure relative to the floor: x for times, % for rates."""
    ratio = got[side] / got["floor"]
    return f"{ratio:.2f}x" if what == "step_us" else f"{ratio:.0%}"


def figure(
    stores: tuple[str, ...] = ("sqlite", "pg"), before: str | None = None, rounds: int = ROUNDS
) -> Table:
    """The table; `before`: a perdure source folder (e.g. main's src/) measured in the same
    interleaved rounds, shown in its own columns."""
    extra = ["before", "before/floor"] if before else []
    table = Table(
        title=f"Core path vs the floor (median of {rounds} interleaved rounds, fresh process each)",
        headers=["figure", "floor", "perdure", "perdure/floor", *extra, "CPU ms/run: floor",
                 "perdure", *(["before"] if before else [])],
    )  # fmt: skip
    plan = rows(stores)
    sides: list[tuple[str, str | None]] = [("floor", None), ("perdure", None)]
    if before:
        sides.append(("before", before))
    trials: dict[tuple[int, str], list[Config]] = {}
    for _ in range(rounds):
        for i, (_label, floor_cfg, perdure_cfg, _what) in enumerate(plan):
            for side, src in sides:
                cfg = floor_cfg if side == "floor" else perdure_cfg
                got = run_child_on_store(MODULE, cfg, "core", src=src)
                trials.setdefault((i, side), []).append(got)
    for i, (label, _f, _p, what) in enumerate(plan):
        got = {side: median([_value(t, what) for t in trials[(i, side)]]) for side, _ in sides}
        cpu = {side: median([_value(t, "cpu") for t in trials[(i, side)]]) for side, _ in sides}
        runs = what == "runs_s"

        cells = [label, fmt(got["floor"]), fmt(got["perdure"]), _share(got, "perdure", what)]
        if before:
            cells += [fmt(got["before"]), _share(got, "before", what)]
        for side, _ in sides:
            cells.append(fmt(cpu[side], 2) if runs else "-")
        table.rows.append(cells)
    table.notes = [
        f"per step: a {STEPS}-step async workflow, worker concurrency 1, from start_async to",
        "the result / steps; the floor is one INSERT+COMMIT per step (same synchronous).",
        f"runs/s: {RUNS} runs of {RUN_STEPS} steps started and awaited one at a time; the floor",
        f"does {RUN_STEPS + 1} INSERT+COMMITs per run. CPU ms/run: process CPU (all threads)"
        " per run.",
        "SQLite runs/s once uses synchronous=FULL (fsync on), keyed uses NORMAL.",
        f"{CALLERS} at a time: {CALLERS} callers each start a run and await it, then the next;"
        f" the floor: {CALLERS} threads with a connection each.",
    ]
    return table


if __name__ == "__main__":
    child_main(lambda: print(figure(*store_args(sys.argv[1:], ROUNDS)).render(), flush=True), child)
