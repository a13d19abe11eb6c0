"""Figure T1: what an `on_table_change` trigger costs the user's own writes on PostgreSQL.

The same INSERTs into three identical tables, one plain, one carrying perdure's
trigger (which writes the change into the outbox and NOTIFYs) and one carrying the
same trigger without its NOTIFY (to tell the two costs apart), in interleaved
rounds (their order rotated) from one connection: one row per transaction
(INSERT + COMMIT, the common case) and 100 rows per transaction (the per-row
cost with the commit shared).
Each round starts from empty tables and an empty outbox; no worker consumes
meanwhile, so only the write side is measured. Medians over the rounds.

    .venv/bin/python -m bench.table_changes [--rows 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from .pg_common import PG_URL, app_url, connect, drop_schema, new_schema

TABLE_SQL = "CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, item TEXT NOT NULL, qty INT NOT NULL)"


TABLES = {"plain": "plain", "watched": "trigger", "silent": "no NOTIFY"}


def silent_trigger(conn: Any, schema: str) -> None:
    """perdure's trigger function for `silent`, minus its NOTIFY: the outbox write alone."""
    from perdure.store.changes_sql import TableTrigger, function_body

    body = function_body(schema, TableTrigger("silent", "silent", ("insert",)),
                         f"{schema}.silent", ["id"])  # fmt: skip
    body = "\n".join(line for line in body.splitlines() if "pg_notify" not in line)
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
    parser.add_argument("--rows", type=int, default=2000, help="inserts per round and case")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import perdure

    schema = new_schema("tc")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"table-change trigger cost: PostgreSQL at {PG_URL.split('@')[-1]}, schema {schema}")
    print(f"load avg {load} on {os.cpu_count()} cpus; {args.rows} inserts per case, "
          f"{args.rounds} interleaved rounds")  # fmt: skip
    app = perdure.App(app_url(schema))

    @app.workflow(name="bench_change")
    def bench_change(change: dict[str, Any]) -> None:
        return None

    try:
        with connect() as conn:
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            for name in TABLES:
                conn.execute(TABLE_SQL.format(name=f'"{schema}".{name}'))
        app.on_table_change(f"{schema}.watched", bench_change, name="watched")
        (service,) = [s for s in app.services if s.name == "table:watched"]
        app.sync(service.install(), "install")  # type: ignore[attr-defined]
        with connect() as conn:
            silent_trigger(conn, schema)
        results: dict[tuple[str, int], list[float]] = {}
        conn = connect()
        try:
            for round_no in range(args.rounds):
                order = list(TABLES)[round_no % 3 :] + list(TABLES)[: round_no % 3]  # rotated
                for per_tx in (1, 100):
                    for table in order:
                        names = ", ".join(f'"{schema}".{t}' for t in (*TABLES, "table_changes"))
                        conn.execute(f"TRUNCATE {names}")
                        seconds = insert_rows(conn, f'"{schema}".{table}', args.rows, per_tx)
                        results.setdefault((table, per_tx), []).append(seconds)
            outbox = conn.execute(f'SELECT COUNT(*) FROM "{schema}".table_changes').fetchone()
        finally:
            conn.close()
        assert outbox is not None and outbox[0] == args.rows  # the last case's changes, each once
        print()
        print(f"{'rows per transaction':<22}{'table':<10}{'inserts/s':>11}{'µs/insert':>11}"
              f"{'extra µs':>10}{'slower':>8}")  # fmt: skip
        for per_tx in (1, 100):
            base = statistics.median(results[("plain", per_tx)]) / args.rows * 1e6
            for table, label in TABLES.items():
                us = statistics.median(results[(table, per_tx)]) / args.rows * 1e6
                extra = f"{us - base:+.0f}" if table != "plain" else ""
                slower = f"{us / base:.2f}x" if table != "plain" else ""
                print(f"{per_tx:<22}{label:<10}{1e6 / us:>11.0f}{us:>11.0f}{extra:>10}"
                      f"{slower:>8}")  # fmt: skip
    finally:
        app.close()
        drop_schema(schema)


if __name__ == "__main__":
    main()
