"""`perdure workers`: every worker the store has heard of lately, where it runs, how alive."""

from __future__ import annotations

import time

import click

from ..engine.worker import PRESENCE
from . import render

SILENT_AFTER = 3 * PRESENCE  # seconds without a heartbeat before a worker counts as silent


@click.command("workers")
@click.option("--since", default=3600.0, show_default=True, help="Seconds of history shown.")
@click.pass_context
def workers(ctx: click.Context, since: float) -> None:
    """Workers (id, host, pid, runs held) and their state: alive, silent (no heartbeat for
    30 s: crashed or cut off) or stopped."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    now = time.time()
    rows = app.sync(app.store.list_workers(now - since), "workers")
    if not rows:
        click.echo("no workers in the last hour" if since == 3600.0 else "no workers")
        return
    body = []
    for w in rows:
        if w.stopped_at is not None:
            state = f"stopped {render.when(w.stopped_at)}"
        elif now - w.heartbeat_at > SILENT_AFTER:
            state = f"SILENT for {now - w.heartbeat_at:.0f}s"
        else:
            state = "alive"
        body.append([w.id, w.host, str(w.pid), f"{w.running}/{w.concurrency}",
                     render.when(w.started_at), render.when(w.heartbeat_at), state])  # fmt: skip
    click.echo(
        render.table(body, ["WORKER", "HOST", "PID", "RUNS", "STARTED", "HEARTBEAT", "STATE"])
    )
