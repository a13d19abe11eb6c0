"""`perdure top`: a live terminal view of workers, queues and running runs."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ..extras import require_extra


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--interval", default=1.0, show_default=True, help="Seconds between frames.")
@click.option("--limit", default=30, show_default=True, help="Running runs listed at most.")
@click.pass_context
def top(ctx: click.Context, once: bool, interval: float, limit: int) -> None:
    """Workers (by the leases they hold), queues and running runs, refreshed until Ctrl-C.

    With --app, queue limits declared in code are shown too.
    """
    require_extra("observe", "perdure top", "rich")
    from rich.console import Console
    from rich.live import Live

    from ..observe.top import render, snapshot
    from .main import get_app  # main imports this module to register the command

    app = get_app(ctx, existing=True)

    def frame() -> Any:
        return render(
            app.runtime.sync(snapshot(app.runtime, limit=limit), "perdure top"),
            f"perdure {app.url}",
        )

    if once:
        Console(width=None if sys.stdout.isatty() else 160).print(frame())
        return
    try:
        with Live(frame(), auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
