"""Figure 1: the durability cost of one step (wall, CPU, fsyncs) for a 200-step workflow.

Each configuration runs in its own interpreter, twice: once plain for the timings
and once under strace for the fsync count (timing under strace would be skewed).
A perdure measurement is one run, from `start_async` to its result, with an
in-process worker already running; a warm-up run comes first and is not counted.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .common import (
    Config,
    Floor,
    Table,
    child_main,
    count_fsyncs,
    cpu_by_group,
    fmt,
    mark,
    median,
    ratio,
    run_child,
    scratch,
    thread_cpu,
    verdict,
)

MODULE = "bench.step_cost"
STEPS = 200
REPS = 7  # measured runs per configuration (the median is reported)
STRACE_REPS = 2
SYNCHRONOUS = ("FULL", "NORMAL")
PER_RUN_SYNCS = 4  # start, claim and completion commits, and a WAL-restart header sync
THREAD_GROUPS = ("loop", "store", "step pool", "wf threads", "portal", "other")


@dataclass(frozen=True)
class Variant:
    mode: str  # the workflow: "async" (async def) or "sync" (def, on a thread)
    effect: str
    async_step: bool = False  # the step body is `async def` (no step-pool thread hop)

    @property
    def label(self) -> str:
        body = "async def" if self.async_step else "def"
        return f"perdure {self.mode} wf, {self.effect} step ({body})"


VARIANTS = (
    Variant("async", "once"),
    Variant("async", "keyed"),
    Variant("async", "read"),
    Variant("async", "once", async_step=True),
    Variant("async", "read", async_step=True),
    Variant("sync", "once"),
    Variant("sync", "keyed"),
    Variant("sync", "read"),
)


@dataclass
class Measured:
    wall_us: float
    cpu_us: float
    fsyncs: float | None
    checkpoint_fsyncs: float | None
    threads_us: dict[str, float] = field(default_factory=dict)


# -- child side ------------------------------------------------------------------------


def child(cfg: Config) -> Config:
    folder = scratch("step")
    if cfg["kind"] == "floor":
        return _floor(folder, cfg)
    return asyncio.run(_perdure(folder, cfg))


def _floor(folder: str, cfg: Config) -> Config:
    floor = Floor(os.path.join(folder, "floor.db"), cfg["synchronous"])
    for i in range(STEPS):  # warm-up
        floor.step("warm", i, {"i": i})
    walls: list[float] = []
    cpus: list[float] = []
    threads = thread_cpu()
    mark("start")
    for rep in range(cfg["reps"]):
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(STEPS):
            floor.step(f"r{rep}", i, {"i": i})
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    mark("end")
    by_thread = cpu_by_group(threads, thread_cpu())
    floor.close()
    return {"walls": walls, "cpus": cpus, "threads": by_thread}


async def _perdure(folder: str, cfg: Config) -> Config:
    import perdure

    app = perdure.App(f"sqlite:///{folder}/perdure.db?synchronous={cfg['synchronous']}")
    effect = cfg["effect"]

    if cfg["async_step"]:

        @app.step(name="work", effect=effect)
        async def work_async(i: int) -> dict[str, int]:
            return {"i": i}

        work: Any = work_async
    else:

        @app.step(name="work", effect=effect)
        def work_sync(i: int) -> dict[str, int]:
            return {"i": i}

        work = work_sync

    if cfg["mode"] == "async":

        @app.workflow(name="steps")
        async def steps_async(n: int) -> int:
            for i in range(n):
                await work(i)
            return n

        workflow: Any = steps_async
    else:

        @app.workflow(name="steps")
        def steps_sync(n: int) -> int:
            for i in range(n):
                work(i)
            return n

        workflow = steps_sync

    worker = app.worker(concurrency=1, lease=30.0, poll=0.01)
    task = asyncio.create_task(worker.run())
    await (await app.start_async(workflow, STEPS, run_id="warm")).result_async(60)
    walls: list[float] = []
    cpus: list[float] = []
    threads = thread_cpu()
    mark("start")
    for rep in range(cfg["reps"]):
        wall, cpu = time.perf_counter(), time.process_time()
        handle = await app.start_async(workflow, STEPS, run_id=f"r{rep}")
        await handle.result_async(60)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    mark("end")
    by_thread = cpu_by_group(threads, thread_cpu())
    worker.stop()
    await asyncio.wait_for(task, 30)
    return {"walls": walls, "cpus": cpus, "threads": by_thread}


# -- parent side -----------------------------------------------------------------------


def measure(cfg: Config) -> Measured:
    timed = run_child(MODULE, {**cfg, "reps": REPS})
    fsyncs = count_fsyncs(MODULE, {**cfg, "reps": STRACE_REPS})
    per_step = 1e6 / (REPS * STEPS)
    return Measured(
        wall_us=median(timed["walls"]) / STEPS * 1e6,
        cpu_us=median(timed["cpus"]) / STEPS * 1e6,
        fsyncs=None if fsyncs is None else fsyncs.total / (STRACE_REPS * STEPS),
        checkpoint_fsyncs=None if fsyncs is None else fsyncs.checkpoint / (STRACE_REPS * STEPS),
        threads_us={k: v * per_step for k, v in timed["threads"].items()},
    )


def commit_fsyncs(got: Measured) -> float | None:
    """fsyncs per step not caused by WAL checkpoints (each syncs the WAL and the db file)."""
    if got.fsyncs is None or got.checkpoint_fsyncs is None:
        return None
    return got.fsyncs - 2 * got.checkpoint_fsyncs


def figures() -> list[Table]:
    costs = Table(
        title=f"Figure 1. Per-step durability cost, {STEPS}-step workflow vs the floor "
        f"(median of {REPS} runs; targets: <= 1 fsync/step, CPU <= 3x floor)",
        headers=[
            "config", "sync", "wall us/step", "CPU us/step", "fsyncs/step", "ckpt", "wall/floor",
            "CPU/floor", "<=1 fsync", "CPU<=3x",
        ],
    )  # fmt: skip
    split = Table(
        title="Figure 1b. Where the CPU goes: CPU us/step by thread (sum over the measured runs)",
        headers=["config", "sync", *THREAD_GROUPS, "total"],
    )
    for synchronous in SYNCHRONOUS:
        floor = measure({"kind": "floor", "synchronous": synchronous})
        name = "floor (sqlite3 INSERT+COMMIT)"
        costs.rows.append(_row(name, synchronous, floor, floor))
        split.rows.append(_split_row(name, synchronous, floor))
        for variant in VARIANTS:
            cfg = {
                "kind": "perdure",
                "synchronous": synchronous,
                "mode": variant.mode,
                "effect": variant.effect,
                "async_step": variant.async_step,
            }
            got = measure(cfg)
            costs.rows.append(_row(variant.label, synchronous, got, floor))
            split.rows.append(_split_row(variant.label, synchronous, got))
    costs.notes = [
        "wall/CPU: from start_async() to the run's result, divided by the step count; CPU is",
        "time.process_time() of the whole process (all threads, user+system).",
        "fsyncs: fsync+fdatasync syscalls of all threads (strace -f) per step; n/a without strace.",
        "ckpt: of those, syncs of the main .db file, i.e. WAL checkpoints (each also syncs the",
        "WAL once). '<=1 fsync' judges fsyncs - 2*ckpt, the syncs of commits themselves;",
        "yes+run: one per step plus at most 4 per run (a run's start, claim and completion",
        "commit, and SQLite's WAL-restart header sync): 1 + 4/200 = 1.02 per step here.",
        "Steps return a small dict; worker concurrency 1 in the same process, already running.",
    ]
    split.notes = [
        "loop: the asyncio thread (workflow + engine); store: the SQLite thread (SQL, commits);",
        "step pool: sync step bodies; wf threads: sync workflow bodies; from /proc (10 ms ticks).",
    ]
    return [costs, split]


def _row(name: str, synchronous: str, got: Measured, floor: Measured) -> list[str]:
    commits = commit_fsyncs(got)
    return [
        name,
        synchronous,
        fmt(got.wall_us),
        fmt(got.cpu_us),
        fmt(got.fsyncs, 2),
        fmt(got.checkpoint_fsyncs, 3),
        ratio(got.wall_us, floor.wall_us),
        ratio(got.cpu_us, floor.cpu_us),
        _fsync_verdict(commits),
        verdict(got.cpu_us <= 3 * floor.cpu_us),
    ]


def _fsync_verdict(commits: float | None) -> str:
    """yes: at most one commit fsync per step; yes+run: that plus a few per run (see notes)."""
    if commits is None:
        return "n/a"
    if round(commits, 3) <= 1.0:
        return "yes"
    return "yes+run" if commits <= 1.0 + PER_RUN_SYNCS / STEPS else "NO"


def _split_row(name: str, synchronous: str, got: Measured) -> list[str]:
    cells = [fmt(got.threads_us.get(group, 0.0)) for group in THREAD_GROUPS]
    return [name, synchronous, *cells, fmt(sum(got.threads_us.values()))]


def main() -> None:
    for table in figures():
        print(table.render(), end="\n\n", flush=True)


if __name__ == "__main__":
    child_main(main, child)
