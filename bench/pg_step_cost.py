"""Figure P1: the cost of one step on PostgreSQL (wall, CPU, write transactions, round trips).

A 200-step async workflow run by an in-process worker (concurrency 1) that is
already running, against the floor: psycopg 3 doing one INSERT of a small JSON
row plus COMMIT per step. Each configuration runs in a fresh interpreter on a
fresh schema (dropped afterwards); the floor is measured before and after the
perdure rows and the faster of the two is used.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from .common import (
    Config,
    Table,
    child_main,
    fmt,
    median,
    ratio,
    run_child,
    thread_cpu,
    verdict,
)
from .pg_common import (
    PgFloor,
    app_url,
    connect,
    count_sql,
    fresh_schema,
    next_xid,
    same_server,
    sent,
)

MODULE = "bench.pg_step_cost"
STEPS = 200
REPS = 7  # measured runs per child (the median is reported)
ROUNDS = 3  # floor, once, keyed in turn, each round a fresh child; the median trial is shown
TARGET = 1.5  # wall time per step, at most this times the floor's
PER_RUN_COMMITS = 4  # a run's start, claim and completion, and a heartbeat (one a second)
EFFECTS = ("once", "keyed")
THREAD_GROUPS = ("loop", "store", "step pool", "listener", "other")
_GROUPS = {"MainThread": "loop", "perdure-postgres": "store", "perdure-pg-listen": "listener"}


@dataclass
class Measured:
    wall_us: float
    cpu_us: float
    commits: float  # write transactions sent per step (COMMITs + autocommit writes)
    statements: float  # statements (round trips) sent per step
    xids: float  # transaction ids the server assigned per step (cluster-wide)
    threads_us: dict[str, float]  # CPU per step by thread group


# -- child side ------------------------------------------------------------------------


def child(cfg: Config) -> Config:
    count_sql()
    if cfg["kind"] == "floor":
        return _floor(cfg)
    return asyncio.run(_perdure(cfg))


class _Meter:
    """Times each measured run and counts what the process sent and the server assigned."""

    def __init__(self) -> None:
        self.watch = connect()
        self.walls: list[float] = []
        self.cpus: list[float] = []

    def begin(self) -> None:
        self.xid0 = next_xid(self.watch)
        self.sent0 = sent()
        self.threads0 = thread_cpu()

    def lap(self, wall: float, cpu: float) -> None:
        self.walls.append(time.perf_counter() - wall)
        self.cpus.append(time.process_time() - cpu)

    def end(self) -> Config:
        threads = _by_group(self.threads0, thread_cpu())
        statements, commits = (b - a for a, b in zip(self.sent0, sent(), strict=True))
        xids = next_xid(self.watch) - self.xid0
        self.watch.close()
        return {
            "walls": self.walls,
            "cpus": self.cpus,
            "statements": statements,
            "commits": commits,
            "xids": xids,
            "threads": threads,
        }


def _by_group(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds between two `thread_cpu()` snapshots, by thread group (the meter's own
    connection runs on the loop thread, outside the measured part)."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, "")
        group = _GROUPS.get(name, "step pool" if name.startswith("perdure-step") else "other")
        out[group] = out.get(group, 0.0) + seconds - before.get(tid, 0.0)
    return out


def _floor(cfg: Config) -> Config:
    floor = PgFloor(cfg["schema"])
    for i in range(STEPS):  # warm-up
        floor.step("warm", i, {"i": i})
    meter = _Meter()
    meter.begin()
    for rep in range(cfg["reps"]):
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(STEPS):
            floor.step(f"r{rep}", i, {"i": i})
        meter.lap(wall, cpu)
    result = meter.end()
    floor.close()
    return result


async def _perdure(cfg: Config) -> Config:
    import perdure

    app = perdure.App(app_url(cfg["schema"]))

    @app.step(name="work", effect=cfg["effect"])
    def work(i: int) -> dict[str, int]:
        return {"i": i}

    @app.workflow(name="steps")
    async def steps(n: int) -> int:
        for i in range(n):
            await work(i)
        return n

    worker = app.worker(concurrency=1, lease=30.0)
    task = asyncio.create_task(worker.run())
    await (await app.start_async(steps, STEPS, run_id="warm")).result_async(60)
    meter = _Meter()
    meter.begin()
    for rep in range(cfg["reps"]):
        wall, cpu = time.perf_counter(), time.process_time()
        handle = await app.start_async(steps, STEPS, run_id=f"r{rep}")
        await handle.result_async(60)
        meter.lap(wall, cpu)
    result = meter.end()
    worker.stop()
    await asyncio.wait_for(task, 30)
    await app.runtime.store.close()
    return result


# -- parent side -----------------------------------------------------------------------


def measure(cfg: Config) -> Measured:
    def once() -> Config:
        with fresh_schema("step") as schema:
            return run_child(MODULE, {**cfg, "schema": schema, "reps": REPS})

    got = same_server(once, f"P1 {cfg['kind']}")
    per_step = 1 / (REPS * STEPS)
    return Measured(
        wall_us=median(got["walls"]) / STEPS * 1e6,
        cpu_us=median(got["cpus"]) / STEPS * 1e6,
        commits=got["commits"] * per_step,
        statements=got["statements"] * per_step,
        xids=got["xids"] * per_step,
        threads_us={k: v * per_step * 1e6 for k, v in got["threads"].items()},
    )


def figures() -> list[Table]:
    table = Table(
        title=f"Figure P1. PostgreSQL per-step cost, {STEPS}-step async workflow vs the floor "
        f"(median of {ROUNDS}x{REPS} runs; targets: wall <= {TARGET:g}x floor, 1 write tx/step)",
        headers=[
            "config", "wall us/step", "CPU us/step", "write tx/step", "xids/step", "stmts/step",
            "wall/floor", "CPU/floor", f"<={TARGET:g}x", "1 tx/step",
        ],
    )  # fmt: skip
    # Rounds interleave the configurations, so that changing load on a shared machine
    # hits the floor and perdure alike.
    configs = {"floor (psycopg INSERT+COMMIT)": {"kind": "floor"}}
    for effect in EFFECTS:
        configs[f"perdure async wf, {effect} step"] = {"kind": "perdure", "effect": effect}
    trials: dict[str, list[Measured]] = {name: [] for name in configs}
    for _ in range(ROUNDS):
        for name, cfg in configs.items():
            trials[name].append(measure(cfg))
    shown = {name: sorted(t, key=lambda m: m.wall_us)[len(t) // 2] for name, t in trials.items()}
    floor = shown["floor (psycopg INSERT+COMMIT)"]
    split = Table(
        title="Figure P1b. Where the CPU goes: CPU us/step by thread (sum over the measured runs)",
        headers=["config", *THREAD_GROUPS, "total"],
    )
    for name, measured in shown.items():
        table.rows.append(_row(name, measured, floor))
        cells = [fmt(measured.threads_us.get(group, 0.0)) for group in THREAD_GROUPS]
        split.rows.append([name, *cells, fmt(sum(measured.threads_us.values()))])
    split.notes = [
        "loop: the asyncio thread (workflow + engine); store: the store thread (all SQL, one",
        "connection); step pool: `def` step bodies; listener: LISTEN/NOTIFY; from /proc (10 ms",
        "ticks). The floor runs everything on its main thread (shown as loop).",
    ]
    table.notes = [
        "wall/CPU: start_async() to the run's result / 200 steps; CPU: time.process_time() of",
        "the whole process (all threads). Worker: concurrency 1, in process, already running.",
        "write tx/step: COMMITs the process sent, plus writing statements sent outside a",
        "transaction (autocommit: each its own transaction), counted by wrapping psycopg;",
        "1 tx/step: at most 1 per step + 4 per run (start, claim, completion, a heartbeat).",
        "xids/step: transaction ids the server assigned meanwhile (pg_current_snapshot), i.e.",
        "writing transactions plus savepoints that wrote, of the whole cluster (other sessions",
        "count too). stmts/step: statements sent, each a round trip to the server (for the",
        "floor, psycopg's own BEGIN included).",
        f"{ROUNDS} rounds, each config a fresh process and schema per round; the round with the",
        "median wall time is shown. Wall us/step of each round:",
        *(f"  {name}: {', '.join(fmt(m.wall_us) for m in t)}" for name, t in trials.items()),
    ]
    return [table, split]


def _row(name: str, got: Measured, floor: Measured) -> list[str]:
    return [
        name,
        fmt(got.wall_us),
        fmt(got.cpu_us),
        fmt(got.commits, 3),
        fmt(got.xids, 3),
        fmt(got.statements, 2),
        ratio(got.wall_us, floor.wall_us),
        ratio(got.cpu_us, floor.cpu_us),
        verdict(got.wall_us <= TARGET * floor.wall_us),
        verdict(round(got.commits, 3) <= 1 + PER_RUN_COMMITS / STEPS),
    ]


def main() -> None:
    for table in figures():
        print(table.render(), end="\n\n", flush=True)


if __name__ == "__main__":
    child_main(main, child)
