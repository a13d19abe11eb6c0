"""Checked-in runs of earlier perdure versions, put back into a store through its own API."""

from __future__ import annotations

from typing import Any

import perdure
from perdure.store.base import Entry, NewRun


def seed_journal(app: perdure.App, record: dict[str, Any]) -> str:
    """Create the recorded run (`record["run"]`, a RunRow as a dict) with its journal
    (`record["journal"]`, Entries as dicts) in `app`'s store; return the run id."""
    run = record["run"]
    entries = [Entry(**{k: v for k, v in e.items() if k not in ("seq", "epoch", "worker")})
               for e in record["journal"]]  # fmt: skip
    new = NewRun(
        id=run["id"], workflow=run["workflow"], input=run["input"],
        code_version=run["code_version"], now=run["created_at"], entries=entries,
    )  # fmt: skip
    app.runtime.sync(app.runtime.open_store(), "open")
    app.runtime.sync(app.runtime.store.create_run(new), "seed")
    return str(run["id"])
