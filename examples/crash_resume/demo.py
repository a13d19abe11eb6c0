"""Crash and resume: start runs, kill -9 the worker mid-flight, start another, watch them finish.

Run from the repository root: `python examples/crash_resume/demo.py`.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
STATE = os.path.join(HERE, ".state")
NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Linus"]


def worker() -> subprocess.Popen[bytes]:
    env = {**os.environ, "DEMO_STATE": STATE, "PYTHONPATH": HERE}
    cmd = [
        sys.executable,
        "-m",
        "perdure",
        "--app",
        "app:app",
        "worker",
        "--lease",
        "2",
        "--poll",
        "0.1",
    ]
    return subprocess.Popen(cmd, env=env, cwd=HERE, stderr=subprocess.DEVNULL)


def wait_for_ledger(ready: Callable[[list[str]], bool], timeout: float = 60.0) -> None:
    """Wait until the side ledger's lines say `ready` (the worker is where the demo wants it)."""
    limit = time.monotonic() + timeout
    ledger = Path(STATE, "ledger.txt")
    while not (ledger.exists() and ready(ledger.read_text().splitlines())):
        if time.monotonic() > limit:
            raise SystemExit(f"the worker did not get there in {timeout:.0f} s")
        time.sleep(0.05)


def main() -> None:
    shutil.rmtree(STATE, ignore_errors=True)
    os.makedirs(STATE)
    os.environ["DEMO_STATE"] = STATE
    sys.path.insert(0, HERE)
    from app import app, onboard

    from perdure.cli import render
    from perdure.engine.inspection import explain

    handles = [app.start(onboard, name, run_id=f"onboard-{name.lower()}") for name in NAMES]
    print(f"started {len(handles)} runs of 'onboard' in {app.url}")

    first = worker()
    # the moment to kill: five reports are being built and Linus's slow mail is being sent
    wait_for_ledger(lambda lines: sum("(started)" in line for line in lines) >= 5)
    print("\n$ kill -9 <worker>   # in the middle of build_report")
    first.send_signal(signal.SIGKILL)
    first.wait()
    for h in handles:
        print(f"  {h.id:<18} {h.status()}")

    print("\nstarting a new worker; it recovers every run once the dead worker's lease expires")
    second = worker()
    try:
        *others, linus = handles
        for h in others:
            h.result(timeout=60)
        while linus.status() != "needs_attention":
            if linus.status() == "completed":
                raise SystemExit("the kill came after Linus's mail was sent: run the demo again")
            time.sleep(0.1)
        for h in handles:
            print(f"  {h.id:<18} {h.status()}")
        print(f"\n$ perdure explain {linus.id}")
        print(
            render.explanation(explain(app.runtime, app.get_run(linus.id), app.journal(linus.id)))
        )
        print("\nperdure will not send a 'once' email twice. The operator checks the mail log,")
        print(
            f"sees it went out, and says so:  perdure resolve {linus.id} send_welcome_email "
            "--value '\"sent\"'"
        )
        app.resolve(linus.id, "send_welcome_email", value="welcome mail sent (operator)")
        linus.result(timeout=60)
        print(f"  {linus.id:<18} {linus.status()}")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait()

    with open(os.path.join(STATE, "ledger.txt")) as f:
        lines = f.read().splitlines()
    counts = collections.Counter(line.split()[0] for line in lines if "(finished)" not in line)
    finished = sum("(finished)" in line for line in lines)
    print("\nside effects executed (from the ledger outside perdure):")
    print(f"  create_account      {counts['create_account']}  (keyed: a re-run reuses its key)")
    print(
        f"  send_welcome_email  {counts['send_welcome_email']}  (once: never repeated, even "
        "the interrupted one)"
    )
    print(
        f"  build_report        {counts['build_report']} started, {finished} finished"
        "  (idempotent: the interrupted ones ran again)"
    )
    invoices = (
        sqlite3.connect(os.path.join(STATE, "demo.db"))
        .execute("SELECT COUNT(*) FROM invoices")
        .fetchone()[0]
    )
    print(f"  invoices            {invoices}  (transactional: exactly once)")
    print(f"\nresult of {handles[0].id}: {handles[0].result()}")
    print(
        f"\nsee a journal: perdure --db sqlite:///{os.path.relpath(STATE)}/demo.db "
        f"show {handles[0].id}"
    )


if __name__ == "__main__":
    main()
