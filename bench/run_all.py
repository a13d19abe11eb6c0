"""Run every figure in one go and print them side by side with the machine they ran on.

`--pg` runs the PostgreSQL figures (pg_*.py) instead of the SQLite ones.
"""

from __future__ import annotations

import datetime
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable

from . import (
    core_path,
    idle,
    pg_latency,
    pg_recovery,
    pg_step_cost,
    pg_throughput,
    recovery,
    step_cost,
    throughput,
)
from .common import ROOT, Table, have_strace

FIGURES: list[tuple[str, Callable[[], list[Table]]]] = [
    ("core path", lambda: [core_path.figure(("sqlite",))]),
    ("step cost", step_cost.figures),
    ("throughput", lambda: [throughput.figure()]),
    ("recovery", lambda: [recovery.figure_defaults(), recovery.figure()]),
    ("idle", lambda: [idle.figure()]),
]
PG_FIGURES: list[tuple[str, Callable[[], list[Table]]]] = [
    ("pg core path", lambda: [core_path.figure(("pg",))]),
    ("core path", lambda: [core_path.figure(("sqlite",))]),
    ("pg step cost", pg_step_cost.figures),
    ("pg throughput", lambda: [pg_throughput.figure()]),
    ("pg latency", lambda: [pg_latency.figure()]),
    ("pg recovery", lambda: [pg_recovery.figure_defaults(), pg_recovery.figure()]),
]


def environment(pg: bool = False) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    if pg:
        from .pg_common import server_info

        floor = "psycopg 3, one INSERT+COMMIT per step"
        store = f"  server  {server_info()}"
    else:
        floor = "plain sqlite3, WAL, one INSERT+COMMIT per step"
        store = f"  strace  {'yes' if have_strace() else 'no (fsync counts print n/a)'}"
    return "\n".join(
        [
            f"perdure benchmarks vs the floor ({floor})",
            f"  when    {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%SZ}",
            f"  commit  {commit or '?'}{' (src/ has uncommitted changes)' if dirty else ''}",
            f"  python  {platform.python_version()} on {platform.platform()}",
            f"  sqlite  {sqlite3.sqlite_version}; cpus {os.cpu_count()}; load avg {load}",
            store,
        ]
    )


def main() -> None:
    pg = "--pg" in sys.argv[1:]
    print(environment(pg), end="\n\n", flush=True)
    began = time.monotonic()
    for name, make in PG_FIGURES if pg else FIGURES:
        start = time.monotonic()
        try:
            tables = make()
        except Exception as exc:  # one broken figure must not hide the others
            print(f"[{name}] FAILED: {exc}\n", flush=True)
            continue
        for table in tables:
            print(table.render(), end="\n\n", flush=True)
        print(f"[{name}: {time.monotonic() - start:.0f}s]\n", flush=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"all figures in {time.monotonic() - began:.0f}s; load avg now {load}", flush=True)


if __name__ == "__main__":
    main()
