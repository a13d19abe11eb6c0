"""The app the inbox restart test runs as worker processes: an inbox feeding a `once` step.

    python tests/triggers/inbox_app.py WORKDIR

Files dropped in `WORKDIR/in` start one `ingest` run per content. Its `record` step
(effect `once`) reads the file and appends one line per execution to
`WORKDIR/ledger.jsonl` (a single `write()` on an O_APPEND file survives kill -9
whole): what a killed worker did cannot be taken back or hidden. The store is the
SQLite file `WORKDIR/perdure.db` unless `INBOX_STORE_URL` names another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import perdure

LEDGER = "ledger.jsonl"
STORE_URL_ENV = "INBOX_STORE_URL"
INBOX = "drop"
STABLE = 0.5


def store_url(workdir: Path) -> str:
    return os.environ.get(STORE_URL_ENV) or f"sqlite:///{Path(workdir) / 'perdure.db'}"


def build_app(workdir: Path) -> perdure.App:
    """The App on `workdir`'s store, with the `ingest` workflow and its inbox on `in/`."""
    workdir = Path(workdir)
    app = perdure.App(store_url(workdir))

    @app.step(name="record", effect="once")
    def record(path: str) -> str:
        content = Path(path).read_bytes()
        digest = hashlib.sha256(content).hexdigest()
        time.sleep(random.uniform(0.0, 0.02))  # a kill may land before or after the effect
        line = {
            "name": Path(path).name,
            "sha": digest,
            "run": perdure.current_step().run_id,
            "pid": os.getpid(),
        }
        fd = os.open(workdir / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
        time.sleep(random.uniform(0.0, 0.02))
        return digest

    @app.workflow(name="ingest")
    def ingest(path: str) -> str:
        return record(path)

    app.inbox(str(workdir / "in"), ingest, name=INBOX, stable=STABLE, poll=0.2)
    return app


def read_ledger(workdir: Path) -> list[dict[str, Any]]:
    path = Path(workdir) / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s pid=%(process)d %(name)s %(levelname)s %(message)s",
    )
    app = build_app(Path(sys.argv[1]))
    app.run_worker(concurrency=16, lease=1.0, poll=0.05, grace=2.0)


if __name__ == "__main__":
    main()
