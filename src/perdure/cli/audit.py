"""`perdure audit`: the append-only log of operator actions, newest first, filtered."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import PerdureError
from ..observe.redact import Redactor
from ..server.access_sql import Access
from . import render

SINCE_HELP = "Only entries this recent: 90m, 24h, 7d, an ISO time (UTC) or Unix seconds."


@click.command("audit")
@click.option("--since", default=None, help=SINCE_HELP)
@click.option("--actor", default=None, help="Only this actor: cli:alice@host1, a token name.")
@click.option("--run", "run_id", default=None, help="Only actions on this run (target run:ID).")
@click.option("--target", default=None, help="Only this target: schedule:NAME, token:ID, ...")
@click.option("--limit", default=50, show_default=True, help="Entries shown.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--wide", is_flag=True, help="Print reasons and details in full.")
@click.pass_context
def audit(
    ctx: click.Context,
    since: str | None,
    actor: str | None,
    run_id: str | None,
    target: str | None,
    limit: int,
    as_json: bool,
    wide: bool,
) -> None:
    """Who did what, to which run, schedule, workflow, worker or token, when, and how it
    ended (ok, refused or failed, with the reason), from every interface."""
    from ..server.answers import audit_entry
    from ..server.operations import parse_since
    from .main import get_app

    if run_id and target:
        raise PerdureError("audit: give --run or --target, not both")
    if limit < 1:
        raise PerdureError("audit: --limit must be 1 or more")
    app = get_app(ctx, existing=True)
    after = parse_since(since, app.clock.now()) if since else None
    rows = app.runtime.sync(
        Access(app.runtime.store).audit_log(
            target=f"run:{run_id}" if run_id else target, limit=limit, actor=actor, since=after
        ),
        "audit",
    )
    redactor = Redactor()  # masked as GET /api/v1/audit and the dashboard mask them
    entries = [audit_entry(r, redactor) for r in rows]
    if as_json:
        for entry in entries:
            render.echo(json.dumps(entry, sort_keys=True))
        return
    if not entries:
        render.echo("no audit entries" + (" match" if since or actor or run_id or target else ""))
        return
    width = None if wide else 60
    body = [
        [str(e["id"]), render.when(e["at"]), e["actor"], e["action"], e["target"],
         _outcome(e, width),
         render.cut(_detail(e["detail"]), width)]
        for e in entries
    ]  # fmt: skip
    render.echo(render.table(body, ["#", "WHEN", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL"]))
    if not wide and any(len(e["reason"]) > 60 or len(_detail(e["detail"])) > 60 for e in entries):
        render.echo(render.cut_note("OUTCOME or DETAIL", "perdure audit"))


def _outcome(entry: dict[str, Any], width: int | None) -> str:
    if entry["outcome"] == "ok":
        return "ok"
    return f"{entry['outcome']}: {render.cut(entry['reason'], width)}"


def _detail(detail: Any) -> str:
    if not isinstance(detail, dict):
        return str(detail)
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                    for k, v in detail.items())  # fmt: skip
