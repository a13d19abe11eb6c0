"""Real `perdure worker` processes of the integration tests' apps, killed with SIGKILL."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def worker_process(
    app_ref: str, url: str, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """A real `perdure worker` serving `app_ref` (a module of this folder) on `url`."""
    full = {**os.environ, **env, "PERDURE_DB": url, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", app_ref, "worker", "--poll", "0.05"],
            cwd=HERE, env=full, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def wait_for(what: str, until: Callable[[], bool], log: Path, timeout: float = 30.0) -> None:
    """Poll `until` (a worker's log in the failure: what it did instead)."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; worker log:\n{log.read_text()}")
        time.sleep(0.05)


def kill_all(*procs: subprocess.Popen[bytes] | None) -> None:
    """Kill the worker processes still running."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)


def app_module(name: str) -> ModuleType:
    """The app module `name` of this folder, as the worker processes import it."""
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(HERE))
