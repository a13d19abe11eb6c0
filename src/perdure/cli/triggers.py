"""`perdure triggers`: every trigger with its state, lag and last error; install table triggers."""

from __future__ import annotations

import sys

import click

from ..engine.triggers import TriggerStatus
from ..server import operations as ops
from . import render
from .specs import agent_option


@click.group("triggers", invoke_without_command=True)
@agent_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/cli-json/).")
@click.pass_context
def triggers(ctx: click.Context, agent_specs: tuple[str, ...], as_json: bool) -> None:
    """Every trigger (schedules, inbox folders, webhooks, events, table changes, message
    sources) with its state, lag and last error; exit 1 if one is in error. A message
    source is as its live workers recorded it (in error while one cannot consume, with the
    broker's words and since when), else as its broker answers this shell. Without --app
    or --agent, only the schedules in the store."""
    ctx.meta["perdure.agent_specs"] = agent_specs  # `triggers --agent SPEC install` too
    if ctx.invoked_subcommand is not None:
        return
    from .main import get_app

    app = get_app(ctx, existing=True, agents=agent_specs)
    rows = app.triggers()
    if as_json:
        render.print_json({"triggers": [t.as_dict() for t in rows]})
    else:
        render.echo(listing(rows) if rows else "no triggers")
    if any(t.state == "error" for t in rows):
        sys.exit(1)


def listing(rows: list[TriggerStatus]) -> str:
    def lag(t: TriggerStatus) -> str:
        shown = "-" if t.lag is None else f"{t.lag:.1f}s"
        return shown if t.pending is None else f"{shown} ({t.pending} pending)"

    return render.table(
        [[t.kind, t.name, t.workflow, t.state, lag(t), t.detail, t.last_error or "-"]
         for t in rows],
        ["KIND", "NAME", "WORKFLOW", "STATE", "LAG", "WATCHES", "LAST ERROR"],
    )  # fmt: skip


@triggers.command("install")
@click.pass_context
def install(ctx: click.Context) -> None:
    """Install (or check) the database trigger of every table change trigger now, as each
    worker does when it starts; nothing already recorded is touched."""
    from .main import get_app

    app = get_app(ctx, need_code=True, agents=ctx.meta.get("perdure.agent_specs", ()))
    changed = app.install_triggers()
    render.echo(f"installed: {', '.join(changed)}" if changed else "every trigger is up to date")


@triggers.command("uninstall")
@click.argument("name")
@click.pass_context
def uninstall(ctx: click.Context, name: str) -> None:
    """Drop table change trigger NAME from its table; changes it recorded stay in the
    outbox (a worker still declaring it would install it again)."""
    from .main import act, get_app, operator

    app = get_app(ctx, existing=True)
    dropped = act(app, ops.uninstall_table_trigger(app, operator(), name), "triggers uninstall")
    render.echo(f"{render.shown(name)}: " + ("dropped" if dropped else "was not installed"))


@triggers.command("retry")
@click.argument("name")
@click.pass_context
def retry(ctx: click.Context, name: str) -> None:
    """Make the changes table change trigger NAME refused pending again (once the workflow
    takes them); a worker turns them into runs."""
    from .main import act, get_app, operator

    app = get_app(ctx, existing=True)
    count = act(app, ops.retry_table_changes(app, operator(), name), "triggers retry")
    render.echo(f"{render.shown(name)}: {count} refused change(s) pending again")
