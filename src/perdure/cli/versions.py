"""`perdure versions`: unfinished runs by workflow and code version, the workers and builds
serving each, drained builds, and what this checkout would do with runs of other versions."""

from __future__ import annotations

import json

import click

from ..engine.versions import report_json, summary, versions_report
from . import render

SHOWN = 20  # waiting runs listed one a line (--json: all)


@click.command("versions")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option("--no-check", is_flag=True, help="Do not replay runs against this checkout.")
@click.pass_context
def versions(ctx: click.Context, as_json: bool, no_check: bool) -> None:
    """Unfinished runs by workflow and version (WAIT: parked until a worker of their version
    comes), the live workers and builds holding each version, each build's runs only it
    holds (0: drained, its last worker may stop), and, with --app, what a worker of this
    checkout would do with runs of other versions: upgrade them, or leave them waiting at
    the position where the code changed. Executes nothing."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    check = bool(app.runtime.workflows) and not no_check
    report = app.runtime.sync(versions_report(app.runtime, check_code=check), "versions")
    if as_json:
        render.echo(json.dumps(report_json(report), sort_keys=True))
        return
    if not report.lines and not report.builds:
        render.echo("no unfinished runs and no workers in the last day")
    if report.lines:
        rows = [
            [
                render.shown(v.workflow),
                render.shown(v.version) + (" (this checkout)" if v.current else ""),
                str(v.runs),
                ", ".join(f"{n} {s}" for s, n in sorted(v.statuses.items())) or "-",
                str(v.waiting),
                ", ".join(render.shown(w) for w in v.workers) or "-",
            ]
            for v in report.lines
        ]
        head = ["WORKFLOW", "VERSION", "RUNS", "STATES", "WAIT", "LIVE WORKERS"]
        render.echo(render.table(rows, head))
    if report.builds:
        rows = [
            [
                render.shown(b.build),
                ", ".join(render.shown(w) for w in b.workers) or "-",
                "drained" if b.drained else f"holds {b.holds} run(s)",
            ]
            for b in report.builds
        ]
        render.echo()
        render.echo(render.table(rows, ["BUILD", "LIVE WORKERS", "STATE"]))
    outlook = report.outlook
    if outlook is not None:
        render.echo()
        render.echo(f"this checkout: {summary(outlook)}")
        for d in outlook.wait[:SHOWN]:
            render.echo(f"  {render.shown(d.run_id)} ({render.shown(d.workflow)} "
                        f"{render.shown(d.run_version)}): {d.said()}")  # fmt: skip
        if len(outlook.wait) > SHOWN:
            render.echo(f"  ... {len(outlook.wait) - SHOWN} more (--json lists every one)")
