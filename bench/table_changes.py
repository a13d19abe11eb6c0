"""Figure T1: what an `on_table_change` trigger costs the user's own writes on PostgreSQL.

The same INSERTs into three identical tables, one plain, one carrying perdure's
trigger (which writes the change into the outbox and NOTIFYs) and one carrying the
same trigger with `notify=False` (no NOTIFY: the two costs apart), in interleaved
rounds (their order rotated) from one connection: one row per transaction
(INSERT + COMMIT, the common case), the same with `synchronous_commit = off`
(no wait for the disk: the trigger's own work stands out of the fsync's noise),
and 100 rows per transaction (the per-row cost with the commit shared).
Each round starts from empty tables and an empty outbox; a perdure store in
another process LISTENs (as a worker's does) but nothing consumes meanwhile, so
only the write side is measured. Medians over the rounds. Then the
other side: how fast a backlog of changes becomes runs, and the time from a
change's write to its run's creation while a worker runs (p50, p99).

    .venv/bin/python -m bench.table_changes [--rows 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from perdure.triggers.table_changes import BATCH

from .pg_common import PG_URL, app_url, connect, drop_schema, new_schema

TABLE_SQL = "CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL, qty INT NOT NULL)"


LISTENER = """
import sys, perdure
app = perdure.App(sys.argv[1])
app.list_runs(limit=1)  # the store is open: its listener thread LISTENs
print("listening", flush=True)
sys.stdin.read()
app.close()
"""
TABLES = {"plain": "plain", "watched": "trigger", "silent": "notify=False"}
CASES = {  # rows per transaction, synchronous_commit
    "1 row/tx, fsync at commit": (1, "on"),
    "1 row/tx, synchronous_commit off": (1, "off"),
    "100 rows/tx, fsync at commit": (100, "on"),
}


def silent_trigger(conn: Any, schema: str) -> None:
    """perdure's trigger function for `silent` as `notify=False` makes it: the outbox write
    alone."""
    from perdure.triggers.changes_sql import TableTrigger, function_body

    body = function_body(schema, TableTrigger("silent", "silent", ("insert",), notify=False),
                         f"{schema}.silent", ["id"])  # fmt: skip
    conn.execute(
        f'CREATE FUNCTION "{schema}".silent_change() RETURNS trigger LANGUAGE plpgsql '
        f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b${body}$b$"
    )
    conn.execute(
        f'CREATE TRIGGER silent_change AFTER INSERT ON "{schema}".silent '
        f'FOR EACH ROW EXECUTE FUNCTION "{schema}".silent_change()'
    )


def insert_rows(conn: Any, table: str, rows: int, per_tx: int) -> float:
    """Seconds to insert `rows` rows into `table`, `per_tx` to a transaction."""
    sql = f"INSERT INTO {table} (item, qty) VALUES (%s, %s)"
    start = time.perf_counter()
    for i in range(0, rows, per_tx):
        with conn.transaction():
            for j in range(i, min(i + per_tx, rows)):
                conn.execute(sql, (f"item-{j}", j))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="inserts per round and case")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency", type=int, default=300, help="changes timed to their runs")
    args = parser.parse_args()

    import perdure

    schema = new_schema("tc")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"table-change trigger cost: PostgreSQL at {PG_URL.split('@')[-1]}, schema {schema}")
    print(f"load avg {load} on {os.cpu_count()} cpus; {args.rows} inserts per case, "
          f"{args.rounds} interleaved rounds")  # fmt: skip

    def make_app() -> tuple[perdure.App, Any]:
        app = perdure.App(app_url(schema))

        @app.workflow(name="bench_change")
        def bench_change(change: dict[str, Any]) -> None:
            return None

        service = app.on_table_change(f"{schema}.watched", bench_change, name="watched")
        return app, service

    app: perdure.App | None = None
    listener: subprocess.Popen[bytes] | None = None
    try:
        with connect() as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            for name in TABLES:
                conn.execute(TABLE_SQL.format(name=f'"{schema}".{name}'))
        app, service = make_app()
        app.runtime.sync(service.install(), "install")
        app.close()  # nothing of perdure's runs in this process while the writes are timed
        with connect() as conn:
            silent_trigger(conn, schema)
        # a worker's store LISTENing, as in production, in a process of its own
        listener = subprocess.Popen([sys.executable, "-c", LISTENER, app_url(schema)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert listener.stdout is not None and listener.stdout.readline() == b"listening\n"
        results: dict[tuple[str, int], list[float]] = {}
        conn = connect()
        try:
            for round_no in range(args.rounds):
                order = list(TABLES)[round_no % 3 :] + list(TABLES)[: round_no % 3]  # rotated
                for case, (per_tx, sync) in CASES.items():
                    conn.execute(f"SET synchronous_commit = {sync}")
                    for table in order:
                        names = ", ".join(f'"{schema}".{t}' for t in (*TABLES, "table_changes"))
                        conn.execute(f"TRUNCATE {names}")
                        seconds = insert_rows(conn, f'"{schema}".{table}', args.rows, per_tx)
                        results.setdefault((table, case), []).append(seconds)
                        outbox = conn.execute(
                            f'SELECT COUNT(*) FROM "{schema}".table_changes'
                        ).fetchone()
                        assert outbox[0] == (0 if table == "plain" else args.rows)  # each once
        finally:
            conn.close()
        print()
        print(f"{'case':<34}{'table':<14}{'inserts/s':>10}{'µs/insert':>11}"
              f"{'extra µs':>10}{'slower':>8}")  # fmt: skip
        for case in CASES:
            base = statistics.median(results[("plain", case)]) / args.rows * 1e6
            for table, label in TABLES.items():
                us = statistics.median(results[(table, case)]) / args.rows * 1e6
                extra = f"{us - base:+.0f}" if table != "plain" else ""
                slower = f"{us / base:.2f}x" if table != "plain" else ""
                print(f"{case:<34}{label:<14}{1e6 / us:>10.0f}{us:>11.0f}{extra:>10}"
                      f"{slower:>8}")  # fmt: skip
        listener.communicate(timeout=30)
        print()
        app, service = make_app()
        drain, latencies = changes_to_runs(app, service, schema, args.latency)
        print(f"changes to runs: a backlog of {args.latency} changes became runs at "
              f"{drain:.0f}/s (one worker's service, batches of {BATCH})")  # fmt: skip
        print(f"commit to run created, {len(latencies)} inserts ~10 ms apart, a worker "
              f"running: p50 {percentile(latencies, 50) * 1000:.1f} ms, "
              f"p99 {percentile(latencies, 99) * 1000:.1f} ms")  # fmt: skip
    finally:
        if listener is not None and listener.poll() is None:
            listener.kill()
        if app is not None:
            app.close()
        drop_schema(schema)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def changes_to_runs(app: Any, service: Any, schema: str, count: int) -> tuple[float, list[float]]:
    """(runs/s turning a backlog of `count` changes into runs; the seconds from each of
    `count` changes being written to its run being created, a worker running meanwhile)."""
    import asyncio
    import json

    from perdure.engine.worker import Worker, WorkerOptions

    with connect() as conn:
        conn.execute(f'TRUNCATE "{schema}".watched, "{schema}".table_changes')
        insert_rows(conn, f'"{schema}".watched', count, 100)

    async def drain() -> float:
        start = time.perf_counter()
        while await service.take():
            pass
        return count / (time.perf_counter() - start)

    rate = app.runtime.sync(drain(), "drain")
    backlog = {r.id for r in app.list_runs(workflow="bench_change", limit=100_000)}

    def trickle() -> None:
        with connect() as conn:
            for i in range(count):
                conn.execute(f'INSERT INTO "{schema}".watched (item, qty) VALUES (%s, 1)', (i,))
                time.sleep(0.01)

    async def live() -> None:
        worker = Worker(app.runtime, WorkerOptions(poll=0.5, gc_every=None))
        task = asyncio.create_task(worker.run())
        await asyncio.to_thread(trickle)
        while len(await app.client.list_runs(workflow="bench_change", limit=100_000)) < 2 * count:
            await asyncio.sleep(0.05)
        worker.stop()
        await task

    app.runtime.sync(live(), "live")
    runs = app.list_runs(workflow="bench_change", limit=100_000)
    latencies = []
    for run in runs:
        change = json.loads(run.input)["args"][0]
        if run.id not in backlog:
            latencies.append(run.created_at - change["at"])
    return rate, latencies


if __name__ == "__main__":
    main()
