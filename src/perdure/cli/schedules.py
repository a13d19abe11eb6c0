"""`perdure schedules ...`: list, inspect, add, pause, resume and delete schedules."""

from __future__ import annotations

import click

from ..errors import PerdureError
from ..server import operations as ops
from ..server.answers import schedule_detail, schedule_json
from ..triggers import schedules as sched
from . import render
from .specs import agent_option


@click.group("schedules")
def schedules() -> None:
    """Schedules in the store: what fires when, and what happened to each tick."""


@schedules.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/cli-json/).")
@click.pass_context
def list_schedules(ctx: click.Context, as_json: bool) -> None:
    """Every schedule with its next fire time (UTC)."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    if as_json:
        render.print_json({"schedules": [schedule_json(r) for r in app.schedules()]})
        return
    render.echo(render.schedules(app.schedules()))


@schedules.command("show")
@click.argument("name")
@click.option("--next", "count", default=5, show_default=True, help="Upcoming fire times.")
@click.option("--ticks", "limit", default=20, show_default=True, help="Recent ticks shown.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/cli-json/).")
@click.pass_context
def show(ctx: click.Context, name: str, count: int, limit: int, as_json: bool) -> None:
    """A schedule's definition, its next fire times, and its recent ticks with reasons."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    row = app.runtime.sync(sched.get(app.runtime, name), "schedules show")
    after = max(app.clock.now(), (row.next_fire or 0.0) - 1e-6)
    upcoming = [] if row.paused else sched.upcoming(row, count, after)
    ticks = app.schedule_ticks(name, limit=limit)
    if as_json:
        render.print_json(schedule_detail(row, list(upcoming), list(ticks)))
        return
    render.echo(render.schedule(row, upcoming, ticks))


@schedules.command("add")
@click.argument("name")
@click.argument("workflow")
@click.argument("args", required=False)
@click.option("--cron", default=None, help="Cron expression, e.g. '0 9 * * 1-5'.")
@click.option("--every", type=float, default=None, help="Seconds between ticks.")
@click.option("--tz", default="UTC", show_default=True, help="Time zone of --cron.")
@click.option("--catchup", type=click.Choice(sched.CATCHUP), default="latest", show_default=True)
@click.option("--catchup-limit", default=10, show_default=True)
@click.option("--overlap", type=click.Choice(sched.OVERLAP), default="skip", show_default=True)
@click.option("--jitter", type=float, default=0.0, show_default=True, help="Seconds.")
@agent_option
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    workflow: str,
    args: str | None,
    cron: str | None,
    every: float | None,
    tz: str,
    catchup: str,
    catchup_limit: int,
    overlap: str,
    jitter: float,
    agent_specs: tuple[str, ...],
) -> None:
    """Store a schedule (needs --app or --agent) starting WORKFLOW every tick; times in UTC.

    Usage: perdure --app module:attribute schedules add NAME WORKFLOW [ARGS] [OPTIONS]
    (or --agent SPEC, whose agent is the workflow `agent:NAME`);
    ARGS is a JSON list (positional) or object (keywords); WORKFLOW must be registered in
    the app; --cron fires in --tz, and every time printed is UTC."""
    from .main import act, get_app, operator, parse_json

    app = get_app(ctx, need_code=True, agents=agent_specs)
    spec = parse_json(args, "ARGS")
    if spec is None:
        spec = []
    if not isinstance(spec, list | dict):
        raise PerdureError("ARGS must be a JSON list (positional) or object (keywords)")
    schedule = sched.Schedule(
        name=name,
        workflow=workflow,
        cron=cron,
        every=every,
        tz=tz,
        args=tuple(spec) if isinstance(spec, list) else (),
        kwargs=spec if isinstance(spec, dict) else {},
        catchup=catchup,
        catchup_limit=catchup_limit,
        overlap=overlap,
        jitter=jitter,
    )
    row = act(app, ops.add_schedule(app, operator(), schedule), "schedules add")
    render.echo(f"{render.shown(row.name)}: next fire {render.when(row.next_fire)} UTC")


def _operate(ctx: click.Context, name: str, verb: str) -> None:
    from .main import act, get_app, operator

    app = get_app(ctx, existing=True)
    who = operator()
    if verb == "pause":
        row = act(app, ops.pause_schedule(app, who, name), "schedules pause")
    elif verb == "resume":
        row = act(app, ops.resume_schedule(app, who, name), "schedules resume")
    else:
        act(app, ops.delete_schedule(app, who, name), "schedules delete")
        render.echo(f"{render.shown(name)}: deleted")
        return
    state = "paused" if row.paused else f"next fire {render.when(row.next_fire)} UTC"
    render.echo(f"{render.shown(name)}: {state}")


@schedules.command("pause")
@click.argument("name")
@click.pass_context
def pause(ctx: click.Context, name: str) -> None:
    """Stop firing at once (every worker, every host)."""
    _operate(ctx, name, "pause")


@schedules.command("resume")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """Fire again from the next tick (ticks passed meanwhile are recorded as skipped)."""
    _operate(ctx, name, "resume")


@schedules.command("delete")
@click.argument("name")
@click.pass_context
def delete(ctx: click.Context, name: str) -> None:
    """Remove a schedule and its tick history (a schedule declared in code comes back)."""
    _operate(ctx, name, "delete")
