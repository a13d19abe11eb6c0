"""Run every figure in one go and print them side by side with the machine they ran on."""

from __future__ import annotations

import datetime
import os
import platform
import sqlite3
import subprocess
import time
from collections.abc import Callable

from . import idle, recovery, step_cost, throughput
from .common import ROOT, Table, have_strace

FIGURES: list[tuple[str, Callable[[], list[Table]]]] = [
    ("step cost", step_cost.figures),
    ("throughput", lambda: [throughput.figure()]),
    ("recovery", lambda: [recovery.figure()]),
    ("idle", lambda: [idle.figure()]),
]


def environment() -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            "perdure benchmarks vs the floor (plain sqlite3, WAL, one INSERT+COMMIT per step)",
            f"  when    {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%SZ}",
            f"  commit  {commit or '?'}{' (src/ has uncommitted changes)' if dirty else ''}",
            f"  python  {platform.python_version()} on {platform.platform()}",
            f"  sqlite  {sqlite3.sqlite_version}; cpus {os.cpu_count()}; load avg {load}",
            f"  strace  {'yes' if have_strace() else 'no (fsync counts print n/a)'}",
        ]
    )


def main() -> None:
    print(environment(), end="\n\n", flush=True)
    began = time.monotonic()
    for name, make in FIGURES:
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
