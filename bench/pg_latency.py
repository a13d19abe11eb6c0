"""Figure P3: latency on PostgreSQL: idle worker picks up a new run; a waiting run gets an event.

A driver process takes the samples over LANES lanes, each a schema of its own
with an idle worker process: one sample at a time (they never overlap), each
lane's next one after a random pause (so it lands anywhere in that worker's
poll cycle) and only once that worker is idle again:

- pickup: time before `app.start()` -> the run's first step starts (the step
  body reads the clock; the workflow returns that time);
- event: time before `app.send_event()` -> the waiting (parked) run has resumed
  and its next step starts.

The lanes' worker processes run with the worker's default poll, then with
poll=0.05; times compare `time.time()` of two processes on one machine.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from .common import Config, Table, child_main, fmt, run_child, scratch, verdict
from .pg_common import (
    app_url,
    fresh_schema,
    log_tail,
    percentile,
    same_server,
    spawn,
    stop,
    wait_for,
)

MODULE = "bench.pg_latency"
SAMPLES = 200  # per kind and poll setting, over all lanes
LANES = 4
POLLS: tuple[float | None, ...] = (None, 0.05)  # None: the worker's default
MAX_PAUSE = 0.5  # seconds: the random pause before a sample is uniform in [0, min(poll, this)]
PHASE_LIMIT = 45.0  # seconds the driver may spend on one kind of sample
TARGET_P50_MS = 10.0
TARGET_P99_MS = 50.0


def build_app(url: str) -> tuple[Any, Any, Any]:
    import perdure

    app = perdure.App(url)

    @app.step(name="stamp", effect="read")
    def stamp() -> float:
        return time.time()

    @app.workflow(name="probe")
    async def probe() -> float:
        started: float = await stamp()
        return started

    @app.workflow(name="waiter")
    async def waiter() -> float:
        await perdure.wait_event("go")
        resumed: float = await stamp()
        return resumed

    return app, probe, waiter


# -- child side ---------------------------------------------------------------------------------


def child(cfg: Config) -> Config:
    if cfg["role"] == "worker":
        app, _, _ = build_app(app_url(cfg["schema"]))
        app.runtime.store.start()
        Path(cfg["ready"]).touch()
        options: dict[str, Any] = {"lease": 30.0}
        if cfg["poll"] is not None:
            options["poll"] = cfg["poll"]
        app.run_worker(**options)
        return {}
    return _drive(cfg)


class _Lane:
    """One schema: the driver's app on it and an idle worker process of its own."""

    def __init__(self, schema: str, folder: str, poll: float | None) -> None:
        self.app, self.probe, self.waiter = build_app(app_url(schema))
        self.app.runtime.store.start()  # creates the tables before the worker connects
        self.ready = os.path.join(folder, f"ready-{schema}")
        self.log = os.path.join(folder, f"worker-{schema}.log")
        cfg = {"role": "worker", "schema": schema, "poll": poll, "ready": self.ready}
        self.worker = spawn(MODULE, cfg, self.log)
        self.waiting: list[Any] = []

    def check(self) -> None:
        if self.worker.poll() is not None:
            raise RuntimeError(f"worker exited:\n{log_tail(self.log)}")

    def parked(self) -> bool:
        counts = self.app.runtime.sync(self.app.runtime.store.count_runs(), "count_runs")
        return bool(counts.get("waiting", 0) == len(self.waiting))

    def close(self) -> None:
        stop(self.worker, signal.SIGTERM)
        self.app.close()


def _drive(cfg: Config) -> Config:
    """All lanes from one thread, one sample at a time (samples never overlap)."""
    from perdure import WorkerOptions

    poll = cfg["poll"] if cfg["poll"] is not None else WorkerOptions().poll
    pause = min(poll, MAX_PAUSE)
    rng = random.Random(cfg["seed"])
    lanes: list[_Lane] = []
    try:
        for schema in cfg["schemas"]:
            lanes.append(_Lane(schema, cfg["folder"], cfg["poll"]))
        for lane in lanes:
            wait_for(lambda: os.path.exists(lane.ready), 60, "a worker to connect")  # noqa: B023
        time.sleep(0.5)  # let the workers reach their idle wait

        def pickup(lane: _Lane, i: int) -> float:
            sent = time.time()
            handle = lane.app.start(lane.probe, run_id=f"probe{i}")
            return float(handle.result(30)) - sent

        def event(lane: _Lane, i: int) -> float:
            handle = lane.waiting[i]
            sent = time.time()
            handle.send_event("go")
            return float(handle.result(30)) - sent

        per_lane = -(-cfg["samples"] // len(lanes))
        picked = _sample(lanes, pickup, per_lane, pause, rng)
        for lane in lanes:
            lane.waiting = [lane.app.start(lane.waiter, run_id=f"w{i}") for i in range(per_lane)]
        for lane in lanes:
            wait_for(lane.parked, 60, "the waiters to park", every=0.02)
        time.sleep(0.5)
        resumed = _sample(lanes, event, per_lane, pause, rng)
    finally:
        for lane in lanes:
            lane.close()
    return {"pickup": picked, "event": resumed, "poll": poll}


def _sample(
    lanes: list[_Lane], take: Any, per_lane: int, pause: float, rng: random.Random
) -> list[float]:
    """`per_lane` samples of each lane, one at a time, each lane's after a random pause."""
    due = [time.monotonic() + rng.uniform(0, pause) for _ in lanes]
    taken = [0] * len(lanes)
    out: list[float] = []
    limit = time.monotonic() + PHASE_LIMIT
    while time.monotonic() < limit:
        left = [n for n in range(len(lanes)) if taken[n] < per_lane]
        if not left:
            break
        n = min(left, key=due.__getitem__)
        time.sleep(max(0.0, due[n] - time.monotonic()))
        lanes[n].check()
        out.append(take(lanes[n], taken[n]))
        taken[n] += 1
        due[n] = time.monotonic() + rng.uniform(0, pause)
    return out


# -- parent side -----------------------------------------------------------------------------


def measure(poll: float | None) -> Config:
    return same_server(lambda: _measure(poll), f"P3 poll {poll}")


def _measure(poll: float | None) -> Config:
    """One driver process over LANES fresh schemas (dropped afterwards)."""
    folder = scratch("pg-latency")
    with contextlib.ExitStack() as stack:
        schemas = [stack.enter_context(fresh_schema("lat")) for _ in range(LANES)]
        cfg = {
            "role": "driver",
            "schemas": schemas,
            "poll": poll,
            "samples": SAMPLES,
            "folder": folder,
            "seed": 1,
        }
        return run_child(MODULE, cfg, timeout=150)


def figure() -> Table:
    table = Table(
        title="Figure P3. PostgreSQL latency: idle worker in another process "
        f"(target: p50 < {TARGET_P50_MS:g} ms, p99 < {TARGET_P99_MS:g} ms)",
        headers=[
            "what", "worker poll", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms",
            f"p50<{TARGET_P50_MS:g}", f"p99<{TARGET_P99_MS:g}",
        ],
    )  # fmt: skip
    for poll in POLLS:
        got = measure(poll)
        setting = f"{got['poll']:g} s ({'default' if poll is None else 'set'})"
        for kind, label in (("pickup", "pickup: start -> 1st step"), ("event", "event -> resumed")):
            ms = [x * 1000 for x in got[kind]]
            p50, p99 = percentile(ms, 50), percentile(ms, 99)
            table.rows.append(
                [
                    label,
                    setting,
                    str(len(ms)),
                    fmt(p50, 1),
                    fmt(percentile(ms, 90), 1),
                    fmt(p99, 1),
                    fmt(max(ms), 1),
                    verdict(p50 < TARGET_P50_MS),
                    verdict(p99 < TARGET_P99_MS),
                ]
            )
    table.notes = [
        f"One driver process, {LANES} lanes (a schema and an idle worker process each:",
        "app.run_worker, lease 30 s, default concurrency); one sample at a time, a lane's next",
        f"after a random pause in [0, min(poll, {MAX_PAUSE:g} s)] with its worker idle.",
        "pickup: from before app.start() (its commit included) to the first step's body.",
        "event: the run is parked in wait_event(); from before send_event() to the next step's",
        "body (claim, replay, consume the event). Percentiles: nearest rank.",
    ]
    return table


def main() -> None:
    print(figure().render(), end="\n\n", flush=True)


if __name__ == "__main__":
    child_main(main, child)
