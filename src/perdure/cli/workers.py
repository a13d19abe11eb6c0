"""`perdure worker` runs one; `perdure workers` lists every worker the store heard of lately."""

from __future__ import annotations

import logging
import os
import sys

import click

from ..agent.serve import MODEL_CHOICES
from ..engine.peers import worker_states
from ..engine.worker import WorkerOptions, public_url, run_until_signalled
from ..extras import require_extra
from ..triggers.health_sql import consumers_by_worker, consumers_said
from . import render
from .specs import agent_option


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
@click.option(
    "--alert-url",
    envvar="PERDURE_ALERT_URL",
    default=None,
    help="POST each run this worker parks for a person, once, as JSON (or PERDURE_ALERT_URL).",
)
@agent_option
@click.option(
    "--model", type=click.Choice(MODEL_CHOICES), default="spec",
    help="Serve the --agent agents' default tier with this model.",
)  # fmt: skip
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
    alert_url: str | None,
    agent_specs: tuple[str, ...],
    model: str,
) -> None:
    """Run workflows until SIGTERM/SIGINT: then start no new step, hand runs back at their
    next step boundary, and after --grace seconds leave what still executes to recovery (a
    second signal: at once). Prints one `ready worker=ID store=URL concurrency=N` line on
    stdout once claiming; logs go to stderr. --alert-url: each run this worker parks for a
    person (a once step in doubt, a dead run, a step that parked it) is POSTed once to the
    URL as JSON {run_id, workflow, status, cause, reason, fix, step, position}. --agent SPEC
    (no --app needed): also work that agent's runs and serve its trigger."""
    from ..observe import instrument
    from .main import get_app

    if metrics_port is not None:
        require_extra("observe", "perdure worker --metrics-port", "prometheus_client")
    if alert_url:  # a URL that is not http(s) is one line, before anything starts
        from ..observe.alerts import alert_on_park

        alert_on_park(alert_url)
    app = get_app(ctx, need_code=True, agents=agent_specs, model=model, works=True)
    instrument(app.runtime)
    if metrics_port is not None:
        from ..observe.metrics import serve_metrics
        from ..server.scrape_access import worker_guard

        serve_metrics(
            app.runtime, metrics_port, guard=None if metrics_public else worker_guard(app)
        )
    agents = ctx.meta.get("perdure.agents_added") or ""
    render.echo(
        f"perdure worker: {len(app.runtime.workflows)} workflow(s) on {public_url(app.url)}"
        + (f"; {agents}" if agents else ""),
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/cli-json/).")
@click.pass_context
def workers(ctx: click.Context, since: float, as_json: bool) -> None:
    """Workers (id, host, pid, runs held), how far their host's clock is from the store
    server's (CLOCK, PostgreSQL only: +2.0s is 2 s ahead) and their state: alive (busy or
    idle), stopped, dead (with the proof: its process is gone on this host, or its
    PostgreSQL session ended) or silent (no heartbeat for 30 s, nothing proven); and, for a
    live worker, the state of each of its message-trigger consumers (consuming, paused,
    refused, down ...; a failing one with the broker's words below the table)."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    app.runtime.sync(
        app.runtime.open_store(), "workers"
    )  # on PostgreSQL the clock is then the server's
    now = app.clock.now()
    rows = app.runtime.sync(worker_states(app.runtime.store, now, now - since), "workers")
    live = {w.id for w, judged in rows if judged.live}
    consumers = app.runtime.sync(consumers_by_worker(app.runtime.store, live), "workers")
    listed: list[dict[str, object]] = []
    failing: list[str] = []
    if not rows and not as_json:
        render.echo("no workers in the last hour" if since == 3600.0 else "no workers")
        return
    body = []
    for w, judged in rows:
        mine = consumers.get(w.id, [])
        state = judged.label
        if judged.state == "stopped" and w.stopped_at is not None:
            state = f"stopped {render.when(w.stopped_at)}"
        skew = "-" if w.clock_offset is None else f"{-w.clock_offset:+.1f}s"
        listed.append({"id": w.id, "host": w.host, "pid": w.pid, "running": w.running,
                       "concurrency": w.concurrency, "started_at": w.started_at,
                       "heartbeat_at": w.heartbeat_at, "stopped_at": w.stopped_at,
                       "clock_ahead": None if w.clock_offset is None else -w.clock_offset,
                       "state": judged.state, "said": state,
                       "triggers": [c.as_consumer() for c in mine]})  # fmt: skip
        body.append([w.id, w.host, str(w.pid), f"{w.running}/{w.concurrency}",
                     render.when(w.started_at), render.when(w.heartbeat_at), skew,
                     consumers_said(mine), state])  # fmt: skip
        failing += [f"{w.id}: trigger {c.trigger} {c.state} since {render.when(c.since)}: "
                    f"{c.error or '-'}" for c in mine if c.failing]  # fmt: skip
    if as_json:
        render.print_json({"workers": listed, "at": now})
        return
    head = ["WORKER", "HOST", "PID", "RUNS", "STARTED", "HEARTBEAT", "CLOCK", "TRIGGERS", "STATE"]
    render.echo(render.table(body, head))
    for line in failing:
        render.echo(line)
