"""Stopping a test's worker processes at its end: SIGTERM (drain), then SIGKILL for any
that has not exited within the grace."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM every live one of `procs`, then wait for each, killing it after `grace`s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
