"""`perdure worker` runs one; `perdure workers` lists every worker the store heard of lately."""

from __future__ import annotations

import logging
import os
import sys

import click

from ..engine.peers import SILENT_AFTER
from ..engine.worker import WorkerOptions, public_url, run_until_signalled
from ..extras import require_extra
from . import render


@click.command("worker")
@click.option("--id", "worker_id", default=None, help="Worker name, unique among live workers.")
@click.option(
    "--build", default=None, help="Name of the code it runs (default: a hash of its workflows)."
)
@click.option("--concurrency", default=16, show_default=True, help="Runs executed at once.")
@click.option("--lease", default=30.0, show_default=True, help="Lease seconds (heartbeat 1/3).")
@click.option("--poll", default=0.5, show_default=True, help="Longest idle wait, seconds.")
@click.option("--grace", default=30.0, show_default=True, help="Drain seconds on SIGTERM.")
@click.option(
    "--max-recoveries",
    default=5,
    show_default=True,
    help="Crashed recoveries in a row before a run is made dead (-1: never).",
)
@click.option(
    "--gc-every", default=300.0, show_default=True, help="Seconds between gc passes (0: off)."
)
@click.option("--metrics-port", type=int, default=None, help="Serve /metrics on this port.")
@click.option(
    "--metrics-public",
    is_flag=True,
    help="Serve --metrics-port without a token (default: a `read` token, as serve's /metrics).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    worker_id: str | None,
    build: str | None,
    concurrency: int,
    lease: float,
    poll: float,
    grace: float,
    max_recoveries: int,
    gc_every: float,
    metrics_port: int | None,
    metrics_public: bool,
) -> None:
    """Run workflows until SIGTERM/SIGINT: then start no new step, hand runs back at their
    next step boundary, and after --grace seconds leave what still executes to recovery (a
    second signal: at once). Prints one `ready worker=ID store=URL concurrency=N` line on
    stdout once claiming; logs go to stderr."""
    from ..observe import instrument
    from .main import get_app

    if metrics_port is not None:
        require_extra("observe", "perdure worker --metrics-port", "prometheus_client")
    app = get_app(ctx, need_code=True)
    instrument(app.runtime)
    if metrics_port is not None:
        from ..observe.metrics import serve_metrics
        from ..server.scrape_access import worker_guard

        serve_metrics(
            app.runtime, metrics_port, guard=None if metrics_public else worker_guard(app)
        )
    render.echo(
        f"perdure worker: {len(app.runtime.workflows)} workflow(s) on {public_url(app.url)}",
        err=True,
    )
    options = WorkerOptions(
        id=worker_id,
        build=build,
        concurrency=concurrency,
        lease=lease,
        poll=poll,
        grace=grace,
        max_recoveries=None if max_recoveries < 0 else max_recoveries,
        gc_every=gc_every or None,
        announce=True,
    )
    worker = app.worker(options)
    run_until_signalled(worker)
    if worker.abandoned:  # abandoned steps may still run on threads: their runs are handed
        logging.shutdown()  # back, so the process exits without waiting for them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@click.command("workers")
@click.option("--since", default=3600.0, show_default=True, help="Seconds of history shown.")
@click.pass_context
def workers(ctx: click.Context, since: float) -> None:
    """Workers (id, host, pid, runs held), how far their host's clock is from the store
    server's (CLOCK, PostgreSQL only: +2.0s is 2 s ahead) and their state: alive, silent
    (no heartbeat for 30 s: crashed or cut off) or stopped."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    app.runtime.sync(
        app.runtime.open_store(), "workers"
    )  # on PostgreSQL the clock is then the server's
    now = app.clock.now()
    rows = app.runtime.sync(app.runtime.store.list_workers(now - since), "workers")
    if not rows:
        render.echo("no workers in the last hour" if since == 3600.0 else "no workers")
        return
    body = []
    for w in rows:
        if w.stopped_at is not None:
            state = f"stopped {render.when(w.stopped_at)}"
        elif now - w.heartbeat_at > SILENT_AFTER:
            state = f"SILENT for {now - w.heartbeat_at:.0f}s"
        else:
            state = "alive"
        skew = "-" if w.clock_offset is None else f"{-w.clock_offset:+.1f}s"
        body.append([w.id, w.host, str(w.pid), f"{w.running}/{w.concurrency}",
                     render.when(w.started_at), render.when(w.heartbeat_at), skew,
                     state])  # fmt: skip
    head = ["WORKER", "HOST", "PID", "RUNS", "STARTED", "HEARTBEAT", "CLOCK", "STATE"]
    render.echo(render.table(body, head))
