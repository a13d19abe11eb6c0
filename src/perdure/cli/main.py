"""`perdure ...`: a thin CLI over the public API. User errors print one line and exit 2."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from ..app import App
from ..engine.client import unblob_text
from ..engine.durable import internal
from ..engine.inspection import effects, explain, replay_check
from ..engine.origins import run_origins
from ..engine.progress import executing
from ..engine.reasons import shown_status
from ..errors import PerdureError
from ..observe.redact import Redactor
from ..server import operations as ops
from ..server.access import Principal, local_operator
from ..server.answers import entry_json, explanation, run_detail, run_summary
from ..store.sqlite import SQLiteStore
from . import render
from .agent import COMMANDS as AGENT_COMMANDS
from .audit import audit
from .dead import dead
from .loading import load_app
from .mcp import mcp_cmd
from .schedules import schedules
from .serve import serve
from .specs import add_agents, agent_option
from .tail import tail
from .tokens import token
from .top import top
from .triggers import triggers
from .versions import versions
from .workers import worker, workers

JSON_HELP = "Print one JSON object (its schema: docs/cli-json/)."
WIDE_HELP = "Print every value in full (nothing cut to fit a column)."
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
@click.version_option(package_name="perdure", prog_name="perdure", message="%(prog)s %(version)s")
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


def takes_agent(ctx: click.Context | None) -> bool:
    """Does this command (or the group it is under) take `--agent SPEC`?"""
    while ctx is not None:
        if any(p.name == "agent_specs" for p in ctx.command.params):
            return True
        ctx = ctx.parent
    return False


def get_app(
    ctx: click.Context,
    *,
    need_code: bool = False,
    existing: bool = False,
    agents: Sequence[str] = (),
    model: str = "spec",
    works: bool = False,
) -> App:
    """The app to act with; `existing` refuses to create a store that is not there yet;
    `agents`: specs whose agents (and triggers) are added to it (`--agent SPEC`)."""
    db, spec = ctx.obj
    if need_code and not spec and not agents:
        takes = takes_agent(ctx)
        raise PerdureError("this command needs your workflows: pass --app module:attribute"
                           + (" or --agent SPEC" if takes else ""))  # fmt: skip
    app = load_app(spec, db)
    ctx.meta["perdure.agents_added"] = add_agents(app, agents, model, works=works)  # said on start
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
    run, created = act(app, ops.start(app, operator(), workflow, positional, keywords,
                                      run_id=run_id, via="cli"), "start")  # fmt: skip
    render.echo(render.shown(run.id))
    if not created:
        given = app.runtime.sync(unblob_text(app.runtime.store, run.input), "start") or "null"
        if (run.workflow, json.loads(given)) != (
            workflow, {"args": list(positional), "kwargs": keywords}
        ):  # fmt: skip
            shown = Redactor().json_text(given) or ""  # input may hold secrets: masked first
            shown = shown if len(shown) <= 200 else shown[:200] + "... (cut at 200 characters)"
            render.echo(f"note: run {render.shown(run.id)} exists already, started "
                        f"{render.when(run.created_at)} UTC with other arguments "
                        f"({render.shown(run.workflow)} {render.shown(shown)}); nothing new "
                        "was started", err=True)  # fmt: skip
    if wait:
        render.echo(json.dumps(wait_for(app, run.id, ctx)))


NO_WORKER_AFTER = 3.0  # seconds `start --wait` waits before it looks for a live worker


def wait_for(app: App, run_id: str, ctx: click.Context) -> Any:
    """The run's result; after NO_WORKER_AFTER seconds without one, if no live worker is
    registered, say so once (with the command that starts one) and keep waiting."""
    from ..engine.peers import worker_states
    from ..errors import WaitTimeout

    handle = app.handle(run_id)
    try:
        return handle.result(timeout=NO_WORKER_AFTER)
    except WaitTimeout:
        pass
    now = app.clock.now()
    states = app.runtime.sync(worker_states(app.runtime.store, now, now - 3600), "start --wait")
    if not any(state.live for _, state in states):
        db, spec = ctx.obj
        where = f" --db {db}" if db else ""
        render.echo(f"waiting for run {render.shown(run_id)}, but no live worker is registered "
                    f"on this store: start one with `perdure{where} --app {spec} worker`",
                    err=True)  # fmt: skip
    return handle.result()


@cli.command("ls")
@click.option("--status", "statuses", multiple=True, help="Filter by status (repeatable).")
@click.option("--workflow", default=None, help="Filter by workflow name.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def list_runs(
    ctx: click.Context, statuses: tuple[str, ...], workflow: str | None, limit: int,
    as_json: bool,
) -> None:  # fmt: skip
    """List runs, newest first, each with the reason it is where it is (in full);
    `claimable`: running runs no worker holds."""
    from ..store.base import ALL_STATUSES

    unknown = sorted(set(statuses) - {*ALL_STATUSES, "claimable"})
    if unknown:
        raise PerdureError(f"--status {unknown[0]!r}: use one of "
                           f"{', '.join((*ALL_STATUSES, 'claimable'))}")  # fmt: skip
    app = get_app(ctx, existing=True)
    asked = {"running" if s == "claimable" else s for s in statuses}
    rows = app.list_runs(statuses=sorted(asked), workflow=workflow, limit=limit)
    paused = app.runtime.sync(app.client.paused_workflows(), "ls")
    now = app.clock.now()
    if statuses:  # a claimable run is listed as such, not under `running`
        shown = {r.id: shown_status(r, paused, now) for r in rows}
        rows = [r for r in rows if shown[r.id] in statuses
                or (shown[r.id] != "claimable" and r.status in statuses)]  # fmt: skip
    origins = app.runtime.sync(run_origins(app.runtime.store, [r.id for r in rows]), "ls")
    if as_json:
        redactor = Redactor()
        runs = [run_summary(r, redactor, now, origins[r.id]) for r in rows]
        render.print_json({"runs": runs, "next_cursor": None})
        return
    render.echo(render.runs(rows, origins, paused, now))


@cli.command()
@click.option(
    "--grace", default=60.0, show_default=True, help="Seconds overdue before a run counts."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (docs/cli-json.md).")
@click.pass_context
def stuck(ctx: click.Context, grace: float, as_json: bool) -> None:
    """Runs waiting for a person (needs_attention, dead, parked by a step) with the reason in
    full, how long and the command that moves them; runs nobody is moving (lease long
    expired, timer long due, pending long), schedules held back by a run waiting for an
    operator, broker messages that could start no run (dead, with the reason), message
    triggers a live worker cannot consume (with the broker's words, since when), and an
    SQLite write lock held so long that every writer waits (naming its holder); exit 1 if
    any."""
    from ..server.stuck import anything
    from ..server.stuck import stuck as listing

    app = get_app(ctx, existing=True)
    found = app.runtime.sync(listing(app, grace), "perdure stuck")
    if as_json:
        render.print_json(found)
        sys.exit(1 if anything(found) else 0)
    if found["store"] is not None:
        render.echo(f"store: {found['store']}")
    runs, held, dead = found["runs"], found["schedules"], found["dead_messages"]
    failing = found["triggers"]
    if not runs and not held and not dead and not failing:
        if found["store"] is not None:
            sys.exit(1)
        render.echo(
            "no stuck runs, blocked schedules, dead messages or triggers in error "
            f"(grace {grace:g}s)"
        )
        return
    if runs:
        rows = [(r["run_id"], r["workflow"], r["status"], r["reason"]) for r in runs]
        render.echo(render.table(rows, ("RUN", "WORKFLOW", "STATUS", "WHY")))
    if held:
        if runs:
            render.echo()
        blocking = [(b["schedule"], b["run_id"], b["status"], f"{b['held']} tick(s)", b["fix"])
                    for b in held]  # fmt: skip
        header = ("SCHEDULE", "BLOCKED BY RUN", "STATUS", "HELD BACK", "TO FREE IT")
        render.echo(render.table(blocking, header))
    if dead:
        if runs or held:
            render.echo()
        lines = [(d["trigger"], d["message_id"], d["kind"], d["reason"]) for d in dead]
        render.echo(render.table(lines, ("MESSAGE TRIGGER", "DEAD MESSAGE", "SOURCE", "WHY")))
    if failing:
        if runs or held or dead:
            render.echo()
        cells = [(t["trigger"], t["kind"], t["worker"], f"{t['state']} since "
                  f"{render.when(t['since'])}", t["error"]) for t in failing]  # fmt: skip
        header = ("TRIGGER NOT CONSUMING", "SOURCE", "WORKER", "STATE", "BROKER SAID")
        render.echo(render.table(cells, header))
    sys.exit(1)


@cli.command()
@click.argument("run_id")
@click.option(
    "--step",
    "position",
    type=int,
    default=None,
    help="Only this step (its position): every entry in full, errors' tracebacks too.",
)
@click.option("--wide", is_flag=True, help=WIDE_HELP)
@click.option("--all", "every", is_flag=True, help="Also the markers perdure records for itself.")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def show(
    ctx: click.Context, run_id: str, position: int | None, wide: bool, every: bool, as_json: bool
) -> None:  # fmt: skip
    """A run's status, what it executes now, and its journal timeline (--step N: one step's
    entries in full, with the traceback of each error)."""
    app = get_app(ctx, existing=True)
    run, entries = app.get_run(run_id), app.journal(run_id)
    if position is not None:
        entries = [e for e in entries if e.position == position]
        if not entries:
            raise PerdureError(f"run {run_id!r} has no step at position {position} "
                               f"(perdure show {run_id} lists them)")  # fmt: skip
    if as_json:
        redactor = Redactor()
        detail = app.runtime.sync(run_detail(app, run), "show")
        render.print_json({"run": detail, "entries": [entry_json(e, redactor) for e in entries]})
        return
    if position is not None:
        render.echo(render.step_entries(entries))
        return
    paused = app.runtime.sync(app.client.paused_workflows(), "show")
    now = app.clock.now()
    render.echo(render.run_header(run, entries, paused, now, wide=wide))
    doing = executing(run, entries, app.runtime.sync(latest_stream(app, run.id), "show"), now)
    if doing is not None:
        render.echo(f"now       {doing.describe(now)}")
    render.echo()
    shown = entries if every else [e for e in entries if not internal(e)]
    render.echo(render.timeline(shown, wide=wide, run_id=run.id))


async def latest_stream(app: App, run_id: str, rows: int = 50) -> list[Any]:
    """The newest `rows` rows of a run's stream (its attempt markers say what executes)."""
    last = await app.runtime.store.stream_last(run_id)
    return list(await app.runtime.store.read_stream(run_id, max(-1, last - rows), rows))


@cli.command("explain")
@click.argument("run_id")
@click.option("--wide", is_flag=True, help=WIDE_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def explain_cmd(ctx: click.Context, run_id: str, wide: bool, as_json: bool) -> None:
    """Per step: what happened and what recovery would do if the worker died now."""
    app = get_app(ctx, existing=True)
    run, entries = app.get_run(run_id), app.journal(run_id)
    if as_json:
        render.print_json(explanation(run, explain(app.runtime, run, entries)))
        return
    paused = app.runtime.sync(app.client.paused_workflows(), "explain")
    render.echo(render.run_header(run, entries, paused, app.clock.now(), wide=wide))
    render.echo()
    render.echo(render.explanation(explain(app.runtime, run, entries), wide=wide, run_id=run.id))


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
@click.argument("text")
@click.pass_context
def steer(ctx: click.Context, run_id: str, text: str) -> None:
    """Send TEXT to a running agent: it joins the transcript at the run's next model call
    (a workflow that calls perdure.steering() takes it there). Audited."""
    app = get_app(ctx, existing=True)
    event_id = act(app, ops.steer(app, operator(), run_id, text), "steer")
    render.echo(f"steered {render.shown(run_id)} (message {event_id}): taken at its next "
                "model call")  # fmt: skip


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
@click.option(
    "--probe", is_flag=True, help="Ask the step's probe again (done: go on; not done: re-run)."
)
@click.pass_context
def resolve(
    ctx: click.Context,
    run_id: str,
    step: str,
    value: str | None,
    retry: bool,
    fail: bool,
    probe: bool,
) -> None:
    """Settle a needs_attention STEP (its position or name): mark it done with a value, run
    it again, fail the run, or have its probe ask the world again (the worker that takes the
    run asks: done, the run goes on; not done, the step runs again; cannot tell, it waits
    here again)."""
    if sum((value is not None, retry, fail, probe)) != 1:
        raise PerdureError("resolve: give exactly one of --value JSON, --retry, --fail or --probe")
    target: int | str = int(step) if step.isascii() and step.isdigit() else step
    app = get_app(ctx, existing=True)
    settle = ops.resolve(app, operator(), run_id, target, value=parse_json(value, "--value"),
                         retry=retry, fail=fail, probe=probe)  # fmt: skip
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
@agent_option
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def effects_cmd(ctx: click.Context, agent_specs: tuple[str, ...], as_json: bool) -> None:
    """Every registered step, its effect, and what recovery does with it."""
    app = get_app(ctx, need_code=True, agents=agent_specs)
    rows = effects(app.runtime)
    if as_json:
        render.print_json({"steps": [dataclasses.asdict(r) for r in rows]})
        return
    render.echo(render.effects(rows))


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
cli.add_command(versions)
for command in AGENT_COMMANDS:
    cli.add_command(command)
