"""`perdure dead ...`: broker messages that could start no run: list, show, forget."""

from __future__ import annotations

import dataclasses

import click

from ..observe.redact import Redactor
from ..server import operations as ops
from ..triggers.dead_sql import DeadMessages
from . import render


@click.group("dead")
def dead() -> None:
    """Dead messages: broker messages a message trigger could not turn into a run."""


@dead.command("ls")
@click.option("--trigger", default=None, help="Only this message trigger's.")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (docs/cli-json/).")
@click.pass_context
def list_dead(ctx: click.Context, trigger: str | None, limit: int, as_json: bool) -> None:
    """Dead messages, newest first, with why each could start no run."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    rows = app.runtime.sync(
        DeadMessages(app.runtime.store).dead_messages(trigger, limit=limit), "dead ls"
    )
    if as_json:
        redactor = Redactor()
        listed = [{**dataclasses.asdict(d), "reason": redactor.text(d.reason),
                   "body": redactor.text(d.body)} for d in rows]  # fmt: skip
        render.print_json({"dead_messages": listed})
        return
    if not rows:
        render.echo("no dead messages")
        return
    lines = [(d.trigger, d.message_id, d.kind, render.when(d.at), d.reason) for d in rows]
    render.echo(render.table(lines, ("TRIGGER", "MESSAGE", "SOURCE", "AT", "WHY")))


@dead.command("show")
@click.argument("trigger")
@click.argument("message_id")
@click.pass_context
def show(ctx: click.Context, trigger: str, message_id: str) -> None:
    """One dead message: why, its size and its body (as kept: cut at the payload limit)."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    rows = app.runtime.sync(
        DeadMessages(app.runtime.store).dead_messages(trigger, limit=100_000), "dead show"
    )
    found = next((d for d in rows if d.message_id == message_id), None)
    if found is None:
        raise click.ClickException(f"no dead message {message_id!r} of trigger {trigger!r}")
    render.echo(f"{found.trigger} {found.message_id} ({found.kind}, {found.size} bytes, "
                f"{render.when(found.at)}): {found.reason}")  # fmt: skip
    render.echo(found.body)


@dead.command("forget")
@click.argument("trigger")
@click.argument("message_id")
@click.pass_context
def forget(ctx: click.Context, trigger: str, message_id: str) -> None:
    """Drop a dead message you dealt with (audited); it no longer shows in `perdure stuck`."""
    from .main import act, get_app, operator

    app = get_app(ctx, existing=True)
    act(app, ops.forget_dead_message(app, operator(), trigger, message_id), "dead forget")
    render.echo(f"{trigger} {message_id}: forgotten")
