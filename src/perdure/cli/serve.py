"""`perdure serve`: the HTTP server (API, dashboard, webhooks, /metrics, health) on uvicorn."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import click

from ..extras import require_extra
from . import render
from .listening import connection_limits, listen_options
from .specs import agent_option


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, help="Port to bind.")
@click.option(
    "--metrics-public",
    is_flag=True,
    help="Serve /metrics without a token (default: a token with the `read` scope).",
)
@click.option(
    "--session-idle", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
    help="A dashboard session ends after this long without a request (default 4 h).",
)  # fmt: skip
@click.option(
    "--session-max", metavar="SECONDS", type=click.FloatRange(min=0, min_open=True),
    help="A dashboard session ends this long after sign-in, however busy (default 24 h).",
)  # fmt: skip
@click.option(
    "--max-streams", default=100, show_default=True, metavar="N", type=click.IntRange(min=1),
    help="Event streams (API, dashboard, run output) open at once; one more gets 503.",
)  # fmt: skip
@agent_option
@listen_options
@click.pass_context
def serve(
    ctx: click.Context,
    /,
    host: str,
    port: int,
    metrics_public: bool,
    session_idle: float | None,
    session_max: float | None,
    max_streams: int,
    agent_specs: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    **listening: Any,
) -> None:
    """Serve the HTTP API (/api/v1), the dashboard (/ui), webhooks (/hooks/NAME), /metrics
    (with a `read` token, or --metrics-public), /healthz and /readyz until SIGTERM/SIGINT.
    It starts runs; a `perdure worker` executes them. Binds 127.0.0.1 unless told otherwise;
    answers only requests for its own address or an --allowed-host name. With --agent SPEC
    (no --app needed) it serves that agent's runs, approvals and webhook."""
    require_extra("server", "perdure serve")
    import uvicorn

    from ..server import create_app
    from ..server.hosts import HostCheck, hosts_for
    from ..server.sessions import SessionPolicy
    from ..server.timeouts import uvicorn_config
    from ..triggers.webhooks import Webhook
    from .main import get_app  # main imports this module to register the command

    app = get_app(ctx, need_code=True, agents=agent_specs)
    hooks = app.runtime.triggers.of(Webhook)
    for hook in hooks.values():
        hook.check(app.runtime)  # a hook that cannot work stops the server before it listens
    from ..observe import instrument

    instrument(app.runtime)
    names = ", ".join(sorted(hooks)) or "none"
    agents = ctx.meta.get("perdure.agents_added") or ""
    render.echo(f"perdure serve: http://{host}:{port} on {app.url}; webhooks: {names}"
                + (f"; {agents}" if agents else ""), err=True)  # fmt: skip
    limits = connection_limits(listening)
    default = SessionPolicy()
    idle, most = session_idle or default.idle, session_max or default.absolute
    if idle > most:
        raise click.UsageError(f"--session-idle ({idle:g} s) is longer than --session-max "
                               f"({most:g} s)")  # fmt: skip
    sessions = SessionPolicy(idle=idle, absolute=most)
    asgi = HostCheck(create_app(
        app, metrics_public=metrics_public, sessions=sessions, max_streams=max_streams
    ),
                     hosts_for(host, port, allowed_hosts), origins=False)  # fmt: skip
    server = uvicorn.Server(uvicorn_config(asgi, host, port, limits))

    def stop(signum: int, frame: FrameType | None) -> None:
        # Before uvicorn installs its own handlers this stops it as soon as it starts; after
        # its graceful shutdown uvicorn re-raises the signal here, and we exit 0.
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        app.close()
