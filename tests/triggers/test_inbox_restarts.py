"""1,000 files, worker processes kill -9'd twice mid-way: every file is processed exactly once.

Real worker processes run tests/triggers/inbox_app.py, whose `once` step appends one
ledger line per execution. Both generations of workers are SIGKILLed while runs are
in flight; new ones rescan the folder, re-hash every file and start nothing twice.
A `once` step cut by a kill parks its run as needs_attention (never re-executed);
the test resolves those as an operator would, from the ledger.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fresh_stores import fresh_store_url
from module_files import load_file
from perdure.store.base import COMPLETED, NEEDS_ATTENTION
from process_stops import stop_processes
from waits import wait_for

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "inbox_app.py"
FILES = 1000
WORKERS = 2
SETTLE_SECONDS = 60.0


def load_app_module() -> ModuleType:
    return load_file("perdure_inbox_app", SCRIPT)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment naming the store: SQLite in the workdir, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield {}
        return
    with fresh_store_url("postgres", tmp_path) as url:
        yield {"INBOX_STORE_URL": url}


class Workers:
    """Worker processes on one workdir; every one is killed at the end."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.env.pop("PERDURE_DB", None)
        self.procs: list[subprocess.Popen[bytes]] = []
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def spawn(self, count: int) -> None:
        for _ in range(count):
            log = self.workdir / "logs" / f"worker-{len(self.procs)}.log"
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(SCRIPT), str(self.workdir)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=self.env,
                        start_new_session=True,
                    )
                )

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill_all(self) -> int:
        """kill -9 every live worker: no drain, no lease release. Returns how many."""
        alive = self.alive()
        assert len(alive) == WORKERS, "a worker died by itself:\n" + self.logs()
        for proc in alive:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return len(alive)

    def stop_all(self) -> None:
        stop_processes(self.procs, grace=15)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-2000:] for p in sorted((self.workdir / "logs").iterdir())
        )


def drop_files(folder: Path) -> dict[str, str]:
    """Write FILES files three ways; returns name -> sha256 of the final content."""
    expected: dict[str, str] = {}
    slow: list[tuple[Path, bytes]] = []
    for i in range(FILES):
        name = f"file-{i:04d}.txt"
        content = f"file {i}\n".encode() + os.urandom(64).hex().encode() + b"\n"
        expected[name] = hashlib.sha256(content).hexdigest()
        target = folder / name
        if i % 3 == 0:  # the temp-name convention: invisible until renamed
            temp = folder / f"{name}.part"
            temp.write_bytes(content)
            os.rename(temp, target)
        elif i % 50 == 1:  # written in two halves, below: must not be taken half-written
            slow.append((target, content))
        else:
            target.write_bytes(content)
    for target, content in slow:
        target.write_bytes(content[:10])
    time.sleep(0.05)  # a pause shorter than `stable` (a longer one would make the half stable)
    for target, content in slow:
        with open(target, "ab") as f:
            f.write(content[10:])
    return expected


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_inbox_survives_worker_kills(tmp_path: Path, store_env: dict[str, str]) -> None:
    """1,000 files, workers kill -9'd twice: one run per file, no file executed twice;
    a modified file is processed again."""
    os.environ.update(store_env)  # the test's own App reads the same store
    try:
        run_test(tmp_path / "inbox", store_env)
    finally:
        for key in store_env:
            os.environ.pop(key, None)


def run_test(workdir: Path, store_env: dict[str, str]) -> None:
    t0 = time.monotonic()
    mod = load_app_module()
    workdir.mkdir()
    app = mod.build_app(workdir)  # migrates the store before the workers race to
    app.list_runs(limit=1)
    workers = Workers(workdir, store_env)
    try:
        workers.spawn(WORKERS)
        expected = drop_files(workdir / "in")
        kills = 0
        for threshold in (FILES // 4, FILES * 3 // 5):
            wait_for(
                f"{threshold} ledger lines",
                lambda n=threshold: len(mod.read_ledger(workdir)) >= n,
                timeout=SETTLE_SECONDS,
                every=0.05,
            )
            kills += workers.kill_all()
            workers.spawn(WORKERS)
        killed_at = len(mod.read_ledger(workdir))

        def settled() -> list[Any] | None:
            runs = app.list_runs(limit=10_000)
            done = [r for r in runs if r.status in (COMPLETED, NEEDS_ATTENTION)]
            return runs if len(done) == len(runs) >= FILES else None

        runs = wait_for(f"{FILES} settled runs", settled, timeout=SETTLE_SECONDS, every=0.05)
        run_ids = {f"inbox:drop:{digest[:32]}" for digest in expected.values()}
        assert {r.id for r in runs} == run_ids  # one run per file, none for a half-written one

        ledger = mod.read_ledger(workdir)
        per_name = Counter(line["name"] for line in ledger)
        assert max(per_name.values()) == 1, f"executed twice: {per_name.most_common(3)}"
        for line in ledger:  # each execution saw the whole file its run was started for
            assert line["sha"] == expected[line["name"]]
            assert line["run"] == f"inbox:drop:{line['sha'][:32]}"

        # The operator settles the once steps a kill interrupted: done if the ledger has it.
        stuck = [r for r in runs if r.status == NEEDS_ATTENTION]
        done_in_ledger = {line["run"] for line in ledger}
        resolved_value = 0
        for run in stuck:
            [mark] = [e for e in app.journal(run.id) if e.kind == "step.needs_attention"]
            if run.id in done_in_ledger:
                app.resolve(run.id, mark.position, value=expected_sha(run.id, expected))
                resolved_value += 1
            else:
                app.resolve(run.id, mark.position, retry=True)
        wait_for(
            f"{FILES} completed runs",
            lambda: len(app.list_runs(statuses=[COMPLETED], limit=10_000)) == FILES,
            timeout=SETTLE_SECONDS,
            every=0.05,
        )
        ledger = mod.read_ledger(workdir)
        assert sorted(line["name"] for line in ledger) == sorted(expected)  # each exactly once

        # A modified file is new content: processed again, under a new run id.
        changed = workdir / "in" / "file-0007.txt"
        changed.write_bytes(b"file 7, second edition\n")
        new_sha = hashlib.sha256(b"file 7, second edition\n").hexdigest()
        new_id = f"inbox:drop:{new_sha[:32]}"
        wait_for(
            "the modified file's run",
            lambda: any(r.id == new_id for r in app.list_runs(statuses=[COMPLETED], limit=10)),
            timeout=SETTLE_SECONDS,
            every=0.05,
        )
        time.sleep(3 * mod.STABLE)  # time enough for a wrong second start to show
        ledger = mod.read_ledger(workdir)
        assert len(app.list_runs(limit=10_000)) == FILES + 1
        assert [line["sha"] for line in ledger if line["name"] == changed.name] == [
            expected[changed.name],
            new_sha,
        ]
        assert len(ledger) == FILES + 1
        print(
            f"\ninbox restarts ({'postgres' if store_env else 'sqlite'}): {FILES} files, "
            f"{kills} workers kill -9'd in 2 rounds (ledger at {killed_at} lines after the "
            f"second), {len(stuck)} needs_attention ({resolved_value} marked done, "
            f"{len(stuck) - resolved_value} retried), {FILES} runs completed, "
            f"ledger {len(ledger)} lines (max 1 per content), modified file reprocessed; "
            f"{time.monotonic() - t0:.1f}s"
        )
        assert len(workers.alive()) == WORKERS, "a worker died by itself:\n" + workers.logs()
    finally:
        workers.stop_all()
        app.close()


def expected_sha(run_id: str, expected: dict[str, str]) -> str:
    """The step's value for a run: the full digest its id was made from."""
    prefix = run_id.rsplit(":", 1)[1]
    [digest] = [d for d in expected.values() if d.startswith(prefix)]
    return digest
