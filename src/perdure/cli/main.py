"""`perdure ...`: a thin CLI over the public API. User errors print one line and exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import click

from ..app import App
from ..engine.inspection import effects, explain, replay_check
from ..errors import PerdureError
from ..server import operations as ops
from ..server.access import Principal, local_operator
from ..store.sqlite import SQLiteStore
from ..triggers.dead_sql import DeadMessages
from . import render
from .agent import COMMANDS as AGENT_COMMANDS
from .audit import audit
from .dead import dead
from .loading import load_app
from .mcp import mcp_cmd
from .schedules import schedules
from .serve import serve
from .tail import tail
from .tokens import token
from .top import top
from .triggers import triggers
from .workers import worker, workers

APP_HELP = "Your app as module:attribute (or PERDURE_APP); needed to run or check workflows."
DB_HELP = "Store URL (or PERDURE_DB); default sqlite:///.perdure/perdure.db"


class Group(click.Group):
    """Turns perdure's user errors into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PerdureError as exc:
            render.echo(f"error: {exc}", err=True)
            sys.exit(2)


def parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PerdureError(
            f"{what} is not valid JSON ({exc.msg} at column {exc.colno}): {text!r}"
        ) from None


@click.group(cls=Group)
@click.option("--db", envvar="PERDURE_DB", default=None, help=DB_HELP)
@click.option("--app", "app_spec", envvar="PERDURE_APP", default=None, help=APP_HELP)
@click.pass_context
def cli(ctx: click.Context, db: str | None, app_spec: str | None) -> None:
    """perdure: durable workflows and persistent agents."""
    ctx.obj = (db, app_spec)


def operator() -> Principal:
    """Who the CLI acts as in the audit log: `cli:<OS user>@<host>`, every scope."""
    return local_operator()


def act(app: App, coro: Any, what: str) -> Any:
    """Run an operator action (an `operations` coroutine, audited) from the sync CLI."""
    return app.runtime.sync(coro, what)


def get_app(ctx: click.Context, *, need_code: bool = False, existing: bool = False) -> App:
    """The app to act with; `existing` refuses to create a store that is not there yet."""
    db, spec = ctx.obj
    if need_code and not spec:
        raise PerdureError("this command needs your workflows: pass --app module:attribute")
    app = load_app(spec, db)
    store = app.runtime.store
    path = store.path if isinstance(store, SQLiteStore) else None
    if existing and path and path != ":memory:" and not os.path.exists(path):
        raise PerdureError(
            f"no perdure store at {os.path.abspath(path)} (pass --db or set PERDURE_DB)"
        )
    return app


@cli.command()
@click.argument("workflow")
@click.argument("args", required=False)
@click.option("--id", "run_id", default=None, help="Run id (starting an existing id is a no-op).")
@click.option("--wait", is_flag=True, help="Wait for the result (needs a worker running).")
@click.pass_context
def start(
    ctx: click.Context, workflow: str, args: str | None, run_id: str | None, wait: bool
) -> None:
    """Start WORKFLOW with ARGS: a JSON list (positional) or object (keyword)."""
    value = parse_json(args, "ARGS")
    if args is not None and not isinstance(value, list | dict):
        raise PerdureError(
            f"ARGS must be a JSON list (positional) or object (keywords), not {args!r}; "
            f"e.g. '[{args}]' to pass it as the one argument"
        )
    app = get_app(ctx, need_code=True)
    positional, keywords = ([], value) if isinstance(value, dict) else (value or [], {})
    run, _ = act(app, ops.start(app, operator(), workflow, positional, keywords, run_id=run_id,
                                via="cli"), "start")  # fmt: skip
    render.echo(render.shown(run.id))
    if wait:
        render.echo(json.dumps(app.handle(run.id).result()))


@cli.command("ls")
@click.option("--status", "statuses", multiple=True, help="Filter by status (repeatable).")
@click.option("--workflow", default=None, help="Filter by workflow name.")
@click.option("--limit", default=50, show_default=True)
@click.pass_context
def list_runs(
    ctx: click.Context, statuses: tuple[str, ...], workflow: str | None, limit: int
) -> None:
    """List runs, newest first."""
    app = get_app(ctx, existing=True)
    rows = app.list_runs(statuses=statuses, workflow=workflow, limit=limit)
    render.echo(render.runs(rows, app.runtime.sync(app.client.paused_workflows(), "ls")))


@cli.command()
@click.option(
    "--grace", default=60.0, show_default=True, help="Seconds overdue before a run counts."
)
@click.pass_context
def stuck(ctx: click.Context, grace: float) -> None:
    """Runs nobody is moving (lease long expired, timer long due, pending long), schedules
    held back by a run waiting for an operator, broker messages that could start no run
    (dead, with the reason), and an SQLite write lock held so long that every writer waits
    (naming its holder); exit 1 if any."""
    from ..triggers.schedules import blocked

    app = get_app(ctx, existing=True)
    stall = app.client.write_lock_stall()  # first: the queries below may have to wait for it
    if stall is not None:
        render.echo(f"store: {stall}")
    found = app.runtime.sync(app.client.stuck(grace), "perdure stuck")
    held = app.runtime.sync(blocked(app.runtime), "perdure stuck")
    dead = app.runtime.sync(
        DeadMessages(app.runtime.store).dead_messages(limit=100), "perdure stuck"
    )
    if not found and not held and not dead:
        if stall is not None:
            sys.exit(1)
        render.echo(f"no stuck runs, blocked schedules or dead messages (grace {grace:g}s)")
        return
    if found:
        render.echo(
            render.table(
                [(r.id, r.workflow, r.status, why) for r, why in found],
                ("RUN", "WORKFLOW", "STATUS", "WHY"),
            )
        )
    if held:
        if found:
            render.echo()
        rows = [(b.schedule, b.run_id, b.status, f"{b.held} tick(s)", b.fix) for b in held]
        header = ("SCHEDULE", "BLOCKED BY RUN", "STATUS", "HELD BACK", "TO FREE IT")
        render.echo(render.table(rows, header))
    if dead:
        if found or held:
            render.echo()
        lines = [(d.trigger, d.message_id, d.kind, d.reason) for d in dead]
        render.echo(render.table(lines, ("MESSAGE TRIGGER", "DEAD MESSAGE", "SOURCE", "WHY")))
    sys.exit(1)


@cli.command()
@click.argument("run_id")
@click.pass_context
def show(ctx: click.Context, run_id: str) -> None:
    """A run's status and its journal timeline."""
    app = get_app(ctx, existing=True)
    run, entries = app.get_run(run_id), app.journal(run_id)
    paused = app.runtime.sync(app.client.paused_workflows(), "show")
    render.echo(render.run_header(run, entries, paused))
    render.echo()
    render.echo(render.timeline(entries))


@cli.command("explain")
@click.argument("run_id")
@click.pass_context
def explain_cmd(ctx: click.Context, run_id: str) -> None:
    """Per step: what happened and what recovery would do if the worker died now."""
    app = get_app(ctx, existing=True)
    run, entries = app.get_run(run_id), app.journal(run_id)
    paused = app.runtime.sync(app.client.paused_workflows(), "explain")
    render.echo(render.run_header(run, entries, paused))
    render.echo()
    render.echo(render.explanation(explain(app.runtime, run, entries)))


@cli.command()
@click.argument("run_id")
@click.argument("event")
@click.argument("payload", required=False)
@click.pass_context
def send(ctx: click.Context, run_id: str, event: str, payload: str | None) -> None:
    """Send EVENT with a JSON PAYLOAD to a run (kept until the run waits for it)."""
    app = get_app(ctx, existing=True)
    act(app, ops.send_event(app, operator(), run_id, event, parse_json(payload, "PAYLOAD")), "send")
    render.echo(f"sent {render.shown(event)} to {render.shown(run_id)}")


@cli.command()
@click.argument("run_id")
@click.pass_context
def cancel(ctx: click.Context, run_id: str) -> None:
    """Cancel a run and its children."""
    app = get_app(ctx, existing=True)
    render.echo(act(app, ops.cancel(app, operator(), run_id), "cancel"))


def _whole(
    ctx: click.Context,
    run_id: str | None,
    workflow: str | None,
    worker: str | None,
    on: bool,
    now: bool = False,
) -> str | None:
    """Pause or resume a whole workflow or worker; None when a single run was named."""
    named = [x for x in (run_id, workflow, worker) if x]
    if len(named) != 1:
        raise PerdureError("name one RUN, or --workflow NAME, or --worker ID_OR_HOST")
    if run_id:
        return None
    app = get_app(ctx, existing=True)
    scope, name = ("workflow", workflow) if workflow else ("worker", worker)
    assert name is not None
    changed = act(app, ops.set_pause(app, operator(), scope, name, on, now=now), "pause")
    verb = ("paused, calls in flight aborted" if now else "paused") if on else "resumed"
    return f"{scope} {name}: {verb}" + ("" if changed else " (already)")


@cli.command()
@click.argument("run_id", required=False)
@click.option("--workflow", default=None, help="Pause every run of this workflow.")
@click.option("--worker", default=None, help="Pause a worker (its id) or all of a host's.")
@click.option("--now", is_flag=True, help="Abort model and tool calls in flight that allow it.")
@click.pass_context
def pause(
    ctx: click.Context, run_id: str | None, workflow: str | None, worker: str | None, now: bool
) -> None:
    """Pause a run, a workflow or a worker (at once if parked, at the next step if running;
    --now: abort the calls in flight that allow it, journaled aborted, re-run on resume)."""
    whole = _whole(ctx, run_id, workflow, worker, True, now)
    if whole is None:
        app = get_app(ctx, existing=True)
        whole = act(app, ops.pause(app, operator(), run_id or "", now=now), "pause")
    render.echo(whole)


@cli.command()
@click.argument("run_id", required=False)
@click.option("--workflow", default=None, help="Resume a paused workflow.")
@click.option("--worker", default=None, help="Resume a paused worker or host.")
@click.pass_context
def resume(
    ctx: click.Context, run_id: str | None, workflow: str | None, worker: str | None
) -> None:
    """Resume a paused run, workflow or worker where it was (a dead run replays again)."""
    whole = _whole(ctx, run_id, workflow, worker, False)
    if whole is None:
        app = get_app(ctx, existing=True)
        whole = act(app, ops.resume(app, operator(), run_id or ""), "resume")
    render.echo(whole)


@cli.command()
@click.option("--batch", default=200, show_default=True, help="Runs deleted per transaction.")
@click.pass_context
def gc(ctx: click.Context, batch: int) -> None:
    """Delete finished runs beyond their workflow's retention, with journals, events and blobs."""
    app = get_app(ctx, need_code=True, existing=True)
    kept = sorted(name for name, wf in app.runtime.workflows.items() if wf.retention is None)
    report = act(app, ops.gc(app, operator(), batch), "gc")
    render.echo(str(report))
    if kept:
        render.echo(
            f"kept every run of {len(kept)} workflow(s) without retention: {', '.join(kept)}"
        )


@cli.command()
@click.argument("run_id")
@click.argument("step")
@click.option("--value", default=None, help="Mark the step done with this JSON value.")
@click.option("--retry", is_flag=True, help="Run the step again.")
@click.option("--fail", is_flag=True, help="Fail the run.")
@click.pass_context
def resolve(
    ctx: click.Context, run_id: str, step: str, value: str | None, retry: bool, fail: bool
) -> None:
    """Settle a needs_attention STEP (its position or name)."""
    if sum((value is not None, retry, fail)) != 1:
        raise PerdureError("resolve: give exactly one of --value JSON, --retry or --fail")
    target: int | str = int(step) if step.isascii() and step.isdigit() else step
    app = get_app(ctx, existing=True)
    settle = ops.resolve(app, operator(), run_id, target, value=parse_json(value, "--value"),
                         retry=retry, fail=fail)  # fmt: skip
    render.echo(act(app, settle, "resolve"))


@cli.command()
@click.argument("run_id")
@click.option(
    "--from-step",
    "from_step",
    type=int,
    required=True,
    help="Keep the first N outcomes; run the rest anew.",
)
@click.option("--id", "new_id", default=None, help="Id of the new run.")
@click.pass_context
def fork(ctx: click.Context, run_id: str, from_step: int, new_id: str | None) -> None:
    """Start a new run from RUN_ID's step N (retry from here after a fix)."""
    app = get_app(ctx, existing=True)
    render.echo(
        render.shown(act(app, ops.fork(app, operator(), run_id, from_step, new_id), "fork").id)
    )


@cli.command()
@click.argument("event_type")
@click.argument("payload", required=False)
@click.option("--id", "event_id", required=True, help="The event's id (a redelivery is a no-op).")
@click.option("--run", "run_id", default=None, help="Deliver to this run instead of triggers.")
@click.pass_context
def emit(
    ctx: click.Context, event_type: str, payload: str | None, event_id: str, run_id: str | None
) -> None:
    """Ingest an event: start the runs EVENT_TYPE triggers, or deliver it to --run."""
    app = get_app(ctx, need_code=run_id is None)
    ingest = ops.emit(app, operator(), event_type, parse_json(payload, "PAYLOAD"),
                      event_id=event_id, run_id=run_id)  # fmt: skip
    for rid in act(app, ingest, "emit"):
        render.echo(render.shown(rid))


@cli.command("effects")
@click.pass_context
def effects_cmd(ctx: click.Context) -> None:
    """Every registered step, its effect, and what recovery does with it."""
    render.echo(render.effects(effects(get_app(ctx, need_code=True).runtime)))


@cli.command("replay-check")
@click.pass_context
def replay_check_cmd(ctx: click.Context) -> None:
    """Replay unfinished runs against the current code (executes nothing); exit 1 on divergence."""
    app = get_app(ctx, need_code=True)
    report = asyncio.run(replay_check(app.runtime))
    render.echo(render.replay(report))
    if report.divergences:
        sys.exit(1)


def main() -> None:
    cli(prog_name="perdure")


cli.add_command(serve)
cli.add_command(schedules)
cli.add_command(dead)
cli.add_command(token)
cli.add_command(worker)
cli.add_command(workers)
cli.add_command(mcp_cmd)
cli.add_command(top)
cli.add_command(audit)
cli.add_command(tail)
cli.add_command(triggers)
for command in AGENT_COMMANDS:
    cli.add_command(command)
