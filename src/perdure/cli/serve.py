"""`perdure serve`: the HTTP server (API, dashboard, webhooks, /metrics, health) on uvicorn."""

from __future__ import annotations

import signal
from types import FrameType

import click

from ..extras import require_extra
from . import render


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, help="Port to bind.")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int) -> None:
    """Serve the HTTP API (/api/v1), the dashboard (/ui), webhooks (/hooks/NAME), /metrics,
    /healthz and /readyz until SIGTERM/SIGINT. It starts runs; a `perdure worker` executes
    them. Binds 127.0.0.1 unless told otherwise."""
    require_extra("server", "perdure serve")
    import uvicorn

    from ..server import create_app
    from .main import get_app  # main imports this module to register the command

    app = get_app(ctx, need_code=True)
    for hook in app.webhooks.values():
        hook.check(app)  # a hook that cannot work stops the server before it listens
    from ..observe import instrument

    instrument(app)
    names = ", ".join(sorted(app.webhooks)) or "none"
    render.echo(f"perdure serve: http://{host}:{port} on {app.url}; webhooks: {names}", err=True)
    server = uvicorn.Server(uvicorn.Config(create_app(app), host=host, port=port, log_config=None))

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
