"""Shared bench plumbing: the SQLite floor, child processes, fsync counting, result tables."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MARK_DIR = "/nonexistent/perdure-bench-mark"
_FSYNC = re.compile(r"\b(?:fsync|fdatasync)\(\d+<([^>]*)>")
_MARK = re.compile(re.escape(MARK_DIR) + r"/(\w+)")

Config = dict[str, Any]


# -- the floor -----------------------------------------------------------------------


class Floor:
    """Plain sqlite3 in WAL mode: one small JSON row INSERTed and COMMITted per step."""

    def __init__(self, path: str, synchronous: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS rows "
            "(run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT, PRIMARY KEY (run_id, seq))"
        )

    def step(self, run_id: str, seq: int, value: Any) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(
            "INSERT INTO rows (run_id, seq, data) VALUES (?, ?, ?)",
            (run_id, seq, json.dumps(value)),
        )
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


# -- child processes -------------------------------------------------------------------


def mark(name: str) -> None:
    """A syscall strace sees (access of a path that cannot exist): brackets the measured part."""
    os.access(f"{MARK_DIR}/{name}", os.F_OK)


def have_strace() -> bool:
    return shutil.which("strace") is not None


def scratch(prefix: str) -> str:
    """A fresh temporary folder for one measurement's files, removed when this process exits."""
    folder = tempfile.mkdtemp(prefix=f"perdure-bench-{prefix}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def child_command(module: str, config: Config) -> list[str]:
    return [PYTHON, "-m", module, "--child", json.dumps(config)]


def run_child(
    module: str, config: Config, *, timeout: float = 120.0, src: str | None = None
) -> Config:
    """Run `module --child config` in a fresh interpreter; its last stdout line is JSON.
    `src`: import perdure from that source folder instead (a before/after)."""
    env = None if src is None else {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        child_command(module, config), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env=env,
    )  # fmt: skip
    return _result(proc)


@dataclass(frozen=True)
class Fsyncs:
    """fsync + fdatasync calls of all threads between a child's start and end marks."""

    total: int
    checkpoint: int  # syncs of the main database file: one per WAL checkpoint


def count_fsyncs(module: str, config: Config, *, timeout: float = 120.0) -> Fsyncs | None:
    """Run the child under `strace -f` and count its syncs; None without strace (or ptrace)."""
    if not have_strace():
        return None
    with tempfile.TemporaryDirectory(prefix="perdure-bench-strace-") as tmp:
        out = os.path.join(tmp, "trace.txt")
        cmd = [
            "strace", "-f", "-qq", "-y", "--seccomp-bpf", "-o", out,
            "-e", "trace=fsync,fdatasync,access,faccessat,faccessat2",
            *child_command(module, config),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if proc.returncode != 0 or not os.path.exists(out):
            return None
        _result(proc)
        return _count_between_marks(Path(out).read_text())


def _count_between_marks(trace: str) -> Fsyncs | None:
    inside, seen_end, total, checkpoint = False, False, 0, 0
    for line in trace.splitlines():
        found = _MARK.search(line)
        if found:
            inside = found.group(1) == "start"
            seen_end = seen_end or found.group(1) == "end"
            continue
        sync = _FSYNC.search(line)
        if inside and sync:
            total += 1
            checkpoint += sync.group(1).endswith(".db")
    return Fsyncs(total, checkpoint) if seen_end else None


def _result(proc: subprocess.CompletedProcess[str]) -> Config:
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"bench child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: Config = json.loads(lines[-1])
    return result


def run_child_on_store(
    module: str, config: Config, tag: str, *, timeout: float = 300.0, src: str | None = None
) -> Config:
    """`run_child` on a fresh store of `config["store"]`: a PostgreSQL child is given a
    fresh schema (`config["schema"]`), dropped afterwards; SQLite children make their file."""
    if config["store"] != "pg":
        return run_child(module, config, timeout=timeout, src=src)
    from .pg_common import fresh_schema

    with fresh_schema(tag) as schema:
        return run_child(module, {**config, "schema": schema}, timeout=timeout, src=src)


def store_args(args: Sequence[str], rounds: int) -> tuple[tuple[str, ...], str | None, int]:
    """The side-by-side benches' arguments: `--sqlite` / `--pg` (default both stores),
    `--before DIR` (another perdure source folder measured in the same rounds), `--rounds N`."""
    stores = ("sqlite",) if "--sqlite" in args else ("pg",) if "--pg" in args else ("sqlite", "pg")
    before = os.path.abspath(args[args.index("--before") + 1]) if "--before" in args else None
    if "--rounds" in args:
        rounds = int(args[args.index("--rounds") + 1])
    return stores, before, rounds


def child_main(main: Callable[[], None], child: Callable[[Config], Config]) -> None:
    """`python -m bench.X` runs the figure; `--child JSON` runs one measurement and prints JSON."""
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        result = child(json.loads(sys.argv[2]))
        print(json.dumps(result), flush=True)
        return
    main()


# -- process state ---------------------------------------------------------------------


def proc_status() -> dict[str, int]:
    """This process's VmRSS / VmHWM (bytes) and thread count, from /proc/self/status."""
    wanted = {"VmRSS": "rss", "VmHWM": "hwm", "Threads": "threads"}
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            parts = value.split()
            out[wanted[key]] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user+system) of each live thread of this process, by native thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_groups() -> dict[int, str]:
    """Native thread id -> a group name from the Python thread name (`perdure-step_3` -> step)."""
    groups = {"MainThread": "loop", "perdure-sqlite": "store", "perdure-portal": "portal"}
    prefixes = {"perdure-step": "step pool", "perdure-wf": "wf threads"}
    out: dict[int, str] = {}
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        name = groups.get(thread.name)
        if name is None:
            prefix = thread.name.partition("_")[0]
            name = prefixes.get(prefix, "other")
        out[thread.native_id] = name
    return out


def cpu_by_group(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """CPU seconds spent between two `thread_cpu()` snapshots, summed by thread group."""
    groups = thread_groups()
    out: dict[str, float] = {}
    for tid, seconds in after.items():
        name = groups.get(tid, "other")
        out[name] = out.get(name, 0.0) + seconds - before.get(tid, 0.0)
    return out


# -- numbers and tables ------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, floor: float | None) -> str:
    if value is None or not floor:
        return "n/a"
    return f"{value / floor:.2f}x"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "NO")


@dataclass
class Table:
    """One figure: a titled table plus notes, printed as aligned text."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest]).rstrip()

        rule = "-" * len(line(self.headers))
        out = [self.title, rule, line(self.headers), rule, *map(line, self.rows), rule]
        out.extend(f"  {note}" for note in self.notes)
        return "\n".join(out)
