"""`perdure token create | ls | revoke`: bearer tokens for the HTTP API, dashboard and MCP."""

from __future__ import annotations

import click

from ..server import operations as ops
from ..server.access import SCOPES
from ..server.access_sql import Access
from . import render


@click.group("token")
def token() -> None:
    """API tokens (shown once; only their hash is stored)."""


@token.command("create")
@click.argument("name")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(SCOPES), required=True,
              help="read, operate, approve or admin (repeatable).")  # fmt: skip
@click.pass_context
def create(ctx: click.Context, name: str, scopes: tuple[str, ...]) -> None:
    """Create a token for NAME (a person or a program); prints it once."""
    from .main import act, get_app, operator

    app = get_app(ctx)
    token_id, secret = act(app, ops.create_token(app, operator(), name, scopes), "token create")
    held = f"{render.shown(name)} ({' '.join(scopes)})"
    render.echo(f"token {token_id} for {held}; keep it, it is not shown again:")
    render.echo(secret)


@token.command("ls")
@click.pass_context
def list_tokens(ctx: click.Context) -> None:
    """Every token: id, name, scopes, when created or revoked (never the token)."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    rows = app.runtime.sync(Access(app.runtime.store).list_tokens(), "token ls")
    body = [[r.id, r.name, r.scopes, render.when(r.created_at), render.when(r.revoked_at)]
            for r in rows]  # fmt: skip
    render.echo(render.table(body, ["ID", "NAME", "SCOPES", "CREATED", "REVOKED"]) if body
               else "no tokens")  # fmt: skip


@token.command("revoke")
@click.argument("token_id")
@click.pass_context
def revoke(ctx: click.Context, token_id: str) -> None:
    """Revoke a token at once."""
    from .main import act, get_app, operator

    app = get_app(ctx, existing=True)
    act(app, ops.revoke_token(app, operator(), token_id), "token revoke")
    render.echo(f"{token_id}: revoked")
