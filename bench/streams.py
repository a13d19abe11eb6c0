"""Run streams (`perdure.stream`): emit-to-reader latency from another process, the cost of
streaming a 1,000-token step against the same step unstreamed, chunks per second into one
run, and what 100 readers of one run and 1,000 live streams cost (memory, threads).

    python -m bench.streams            # SQLite, then PostgreSQL if it answers
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import perdure

HERE = Path(__file__).resolve().parent
PG = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def client(url: str) -> perdure.App:
    sys.path.insert(0, str(HERE))
    import stream_app

    app = perdure.App(url)
    for name, definition in stream_app.app.runtime.workflows.items():
        app.runtime.workflows[name] = definition
    return app


def worker(url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PERDURE_DB": url, "PYTHONPATH": str(HERE)}
    return subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "stream_app:app", "worker", "--poll", "0.02"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(app: perdure.App) -> tuple[float, float]:
    """p50 and p99 ms from a chunk's write (in the worker) to this process reading it."""
    handle = app.start("emits", 400, 0.004, run_id=f"lat-{uuid.uuid4().hex[:6]}")
    delays = [(time.time() - c.data["t"]) * 1000 for c in handle.stream() if c.kind == "chunk"]
    return pct(delays, 0.5), pct(delays, 0.99)


def streamed_cost(app: perdure.App) -> tuple[float, float]:
    """Median seconds of a 1,000-token step, streamed and not (3 rounds, interleaved)."""
    plain, streamed = [], []
    for _ in range(3):
        for flag, into in ((False, plain), (True, streamed)):
            began = time.monotonic()
            app.start("speaks", 1000, flag).result(timeout=120)
            into.append(time.monotonic() - began)
    return statistics.median(plain), statistics.median(streamed)


def chunk_rate(app: perdure.App, n: int = 50_000) -> float:
    """Chunks per second pushed into one run's stream until all are stored."""
    began = time.monotonic()
    app.start("floods", n).result(timeout=300)
    return n / (time.monotonic() - began)


def readers(app: perdure.App, url: str) -> dict[str, float]:
    """100 async readers of one live run, then 1,000 live streams: RSS and threads each."""
    handle = app.start("emits", 50, 0.02, run_id=f"many-{uuid.uuid4().hex[:6]}")
    threads0 = threading.active_count()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def read(run_id: str) -> int:
        return sum([1 async for _ in app.handle(run_id).astream()])

    async def many(run_ids: list[str]) -> list[int]:
        return await asyncio.gather(*(read(r) for r in run_ids))

    counts = app.runtime.sync(many([handle.id] * 100), "readers")
    threads1 = threading.active_count()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    runs = [app.start("emits", 3, 0.5).id for _ in range(1000)]
    counts2 = app.runtime.sync(many(runs), "streams")
    rss2 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert set(counts) == {51} and set(counts2) == {4}, (set(counts), set(counts2))
    return {
        "kib_per_reader_100": (rss1 - rss0) / 100,
        "threads_added_100": threads1 - threads0,
        "kib_per_stream_1000": (rss2 - rss1) / 1000,
        "threads_added_1000": threading.active_count() - threads0,
    }


def figures(url: str, label: str) -> None:
    app = client(url)
    procs = [worker(url) for _ in range(2 if "postgres" in url else 1)]
    try:
        app.start("emits", 1, 0.0).result(timeout=60)  # workers are up
        p50, p99 = latency(app)
        plain, streamed = streamed_cost(app)
        rate = chunk_rate(app)
        many = readers(app, url)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        app.close()
    print(f"\n{label}")
    print(f"  emit -> reader in another process  p50 {p50:6.1f} ms   p99 {p99:6.1f} ms")
    print(f"  1,000-token step  unstreamed {plain:6.3f} s   streamed {streamed:6.3f} s   "
          f"(+{(streamed / plain - 1) * 100:4.1f}%)")  # fmt: skip
    print(f"  chunks/s into one run  {rate:,.0f}")
    print(f"  100 readers of one run: {many['kib_per_reader_100']:.1f} KiB and "
          f"{many['threads_added_100']} thread(s) added; 1,000 live streams: "
          f"{many['kib_per_stream_1000']:.1f} KiB each, "
          f"{many['threads_added_1000']} thread(s) added")  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        figures(f"sqlite:///{folder}/streams.db", "SQLite (one file, worker in another process)")
    try:
        import psycopg

        psycopg.connect(PG, connect_timeout=3).close()
    except Exception as exc:
        print(f"\nPostgreSQL: not measured ({exc})")
        return
    schema = f"bench_streams_{uuid.uuid4().hex[:8]}"
    try:
        figures(f"{PG}?schema={schema}", "PostgreSQL (LISTEN/NOTIFY, 2 workers)")
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
