"""Hops per journal write: Python calls and thread hand-offs from `store.append` to its answer.

One run's plain step writes (intent and outcome, fenced by its epoch), one at a
time, on each path a write can take: on the caller's thread (`inline`, a run
alone in its process), through the store thread (`queued`), and from a sync
workflow's thread, which drives the same `store.append` coroutine itself and
blocks while the write is queued (`sync thread`). A profiler counts, per
write, the Python function calls made in the store's machinery (how a write
travels: threaded, batching, methods and the two stores' hooks), in the store
package (its SQL modules too) and in all (asyncio, queue, threading and the
driver's Python side included). A queued write also crosses two threads and
wakes the caller's loop once. SQLite, and PostgreSQL with `--pg`.

`python -m bench.hops` prints the table; `--before DIR` also counts the perdure
in source folder DIR (e.g. an export of main's src/), each in its own interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

from .common import ROOT, Table

WRITES = 50  # counted writes per path
TIMED = 1000  # timed writes per path (no profiler)
ROUNDS = 3
PATHS = ("inline", "queued", "sync thread")


# the store's machinery (how a write travels), as opposed to the SQL it runs
MACHINERY = ("threaded.py", "batching.py", "methods.py", "sqlite.py", "postgres.py")


def _profile(counts: Counter[str]) -> Any:
    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            counts["all"] += 1
            path = frame.f_code.co_filename
            if "perdure/store/" in path:
                counts["store"] += 1
                if path.endswith(MACHINERY):
                    counts["machinery"] += 1
                    counts[f"fn:{frame.f_code.co_name}"] += 1

    return hook


async def _count(url: str) -> dict[str, Any]:
    from perdure.engine.context import drive
    from perdure.store import open_store
    from perdure.store.base import Append, Entry, NewRun

    store: Any = open_store(url)
    await store.open()
    try:
        await store.create_run(NewRun(id="r", workflow="wf", input="{}", code_version="", now=1.0))
        [claim] = await store.claim("w", 1.0, 3600.0, 1, ["wf"])
        epoch = claim.run.lease_epoch
        position = iter(range(1_000_000))

        def write(inline: bool) -> Append:
            p = next(position)
            entries = [
                Entry("step.intent", "s", p, at=1.0),
                Entry("step.outcome", "s", p, "1", final=True, at=1.0),
            ]
            return Append("r", epoch, entries, direct_ok=inline)

        loop = asyncio.get_running_loop()

        def from_thread(append: Append) -> Any:  # as a sync workflow's thread writes
            return drive(store.append(append), loop)

        out: dict[str, Any] = {}
        for path in PATHS:
            for _ in range(5):  # warm-up: connections opened, statements prepared
                if path == "sync thread":
                    await asyncio.to_thread(from_thread, write(True))
                else:
                    await store.append(write(path == "inline"))
            counts: Counter[str] = Counter()
            hook = _profile(counts)
            if path == "sync thread":

                def many(hook: Any = hook) -> None:
                    sys.setprofile(hook)
                    try:
                        for _ in range(WRITES):
                            from_thread(write(True))
                    finally:
                        sys.setprofile(None)

                threading.setprofile(hook)
                thread = threading.Thread(target=many)
                thread.start()
                await asyncio.to_thread(thread.join)
            else:
                threading.setprofile(hook)  # the store thread is already running: set it there
                store.submit(lambda c, hook=hook: sys.setprofile(hook), write=False).result()
                sys.setprofile(hook)
                for _ in range(WRITES):
                    await store.append(write(path == "inline"))
                sys.setprofile(None)
                store.submit(lambda c: sys.setprofile(None), write=False).result()
            threading.setprofile(None)
            wall, cpu = time.perf_counter(), time.process_time()
            if path == "sync thread":

                def timed() -> None:
                    for _ in range(TIMED):
                        from_thread(write(True))

                await asyncio.to_thread(timed)
            else:
                for _ in range(TIMED):
                    await store.append(write(path == "inline"))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            top = sorted(((n, k[3:]) for k, n in counts.items() if k[:3] == "fn:"), reverse=True)
            out[path] = {
                "wall_us": wall / TIMED * 1e6,
                "cpu_us": cpu / TIMED * 1e6,
                "machinery": counts["machinery"] / WRITES,
                "store": counts["store"] / WRITES,
                "all": counts["all"] / WRITES,
                "top": [f"{k} {n / WRITES:g}" for n, k in top[:12]],
            }
        out["commits"] = store.commits
        return out
    finally:
        await store.close()


def child(url: str) -> None:
    print(json.dumps(asyncio.run(_count(url))))


def _measure(url: str, src: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "bench.hops", "--child", url],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(args: list[str]) -> None:
    if "--child" in args:
        child(args[args.index("--child") + 1])
        return
    before = args[args.index("--before") + 1] if "--before" in args else None
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else ROUNDS
    sides = [("perdure", None), *([("before", before)] if before else [])]
    table = Table(
        f"Hops per journal write: Python calls per plain step write ({WRITES}, one at a time); "
        f"CPU and wall per write ({TIMED} writes, median of {rounds} interleaved rounds)",
        ["store", "path", *(f"{side}: calls (machinery/store/all), CPU us, wall us"
                            for side, _ in sides)],
    )  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    tops: list[str] = []
    stores = ["sqlite", *(["pg"] if "--pg" in args else [])]
    with tempfile.TemporaryDirectory() as tmp:
        for name in stores:
            got: dict[str, list[dict[str, Any]]] = {side: [] for side, _ in sides}
            for i in range(rounds):
                for side, src in sides:
                    if name == "sqlite":
                        url = f"sqlite:///{tmp}/{side}{i}.db?synchronous=NORMAL"
                        got[side].append(_measure(url, src))
                        continue
                    from .pg_common import app_url, fresh_schema

                    with fresh_schema("hops") as schema:
                        got[side].append(_measure(app_url(schema), src))
            for path in PATHS:
                cells = []
                for side, _ in sides:
                    first = got[side][0][path]
                    cpu = statistics.median(r[path]["cpu_us"] for r in got[side])
                    wall = statistics.median(r[path]["wall_us"] for r in got[side])
                    cells.append(
                        "{machinery:g} / {store:g} / {all:g}, ".format(**first)
                        + f"{cpu:.0f}, {wall:.0f}"
                    )
                table.rows.append([name, path, *cells])
                tops += [
                    f"{name} {path} {s}: " + ", ".join(got[s][0][path]["top"]) for s, _ in sides
                ]
    table.notes.append(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(table.render())
    print("\n".join(tops))


if __name__ == "__main__":
    main(sys.argv[1:])
