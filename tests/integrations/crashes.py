"""Real `perdure worker` processes of the integration tests' apps, killed with SIGKILL."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
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
