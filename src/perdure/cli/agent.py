"""`perdure validate | run | agent | usage | budget`: agents from their TOML spec."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from ..agent.budget_sql import Budgets
from ..agent.serve import MODEL_CHOICES, attach_trigger, with_model
from ..agent.spec import AgentSpec, SpecProblems, duration, load_spec, validate_spec
from ..agent.tools.builtins import builtin_tools
from ..errors import PerdureError, WaitTimeout
from . import render

if TYPE_CHECKING:
    from ..agent.loop import Agent
    from ..app import App

JSON_HELP = "Print one JSON object (docs/cli-json/)."
MODEL_HELP = (
    "Serve the default tier with this model (local: Qwen2.5-Coder-1.5B, local-small:"
    " SmolLM2-135M, scripted: deterministic, no model)."
)


def _agent(ctx: click.Context, spec_path: str, model: str) -> tuple[App, Agent]:
    from ..agent.loop import Agent
    from ..agent.models import require_extras
    from .main import get_app

    spec = with_model(load_spec(spec_path), model)
    require_extras(spec)  # before anything is started or recorded
    app = get_app(ctx)
    return app, Agent(app.runtime, spec)


@click.command()
@click.argument("spec_path", metavar="SPEC")
@click.option("--model", type=click.Choice(MODEL_CHOICES), default="spec", help=MODEL_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def validate(spec_path: str, model: str, as_json: bool) -> None:
    """Check an agent spec, and show the tiers that will answer (with --model as given):
    every problem at once, one a line (exit 2), the MCP servers' commands included. With
    --json, a spec that does not pass is {"ok": false, "error": ..., "errors": [...]} and
    exit 2."""
    try:  # the grants as a run from the spec checks them
        spec = with_model(validate_spec(spec_path, [t.name for t in builtin_tools()]), model)
    except SpecProblems as exc:
        if as_json:
            render.print_json({"spec": spec_path, "ok": False, "error": str(exc),
                               "errors": list(exc.problems)})  # fmt: skip
        else:
            for problem in exc.problems:
                render.echo(f"error: {problem}", err=True)
        raise SystemExit(2) from None
    except PerdureError as exc:
        if not as_json:
            raise
        render.print_json({"spec": spec_path, "ok": False, "error": str(exc),
                           "errors": [str(exc)]})  # fmt: skip
        raise SystemExit(2) from None
    if as_json:
        tiers = [{"tier": name, "provider": spec.models[name].provider,
                  "model": spec.models[name].model or spec.models[name].script or None}
                 for name in spec.routing.order()]  # fmt: skip
        render.print_json({"spec": spec_path, "ok": True, "agent": spec.name, "tiers": tiers,
                           "tools": list(spec.tools.grant),
                           "summary": _describe(spec, model)})  # fmt: skip
        return
    render.echo(f"{spec_path}: ok: {_describe(spec, model)}")


def _describe(spec: AgentSpec, model: str = "spec") -> str:
    routing = spec.routing
    tiers = []
    for i, name in enumerate(routing.order()):
        m = spec.models[name]
        served = f"{m.provider}:{m.model or m.script or 'default'}"
        if i == 0 and model != "spec":
            served += f" (--model {model})"
        tiers.append(f"{name}={served}")
    after = routing.escalate_after_failures
    escalation = f", next after {after} failures" if len(tiers) > 1 else ""
    tools = ", ".join(spec.tools.grant) or "none"
    trigger = "none"
    if spec.trigger is not None:
        t = spec.trigger
        trigger = next(
            (f"{k} {getattr(t, k)}" for k in ("inbox", "cron", "every", "event", "webhook")
             if getattr(t, k)), "none",
        )  # fmt: skip
    acc = spec.acceptance
    checks = [c for c in (acc.grounded and "grounded in the source", acc.command, acc.python) if c]
    if acc.facts_first:  # a second model call a file: the facts, each checked, then the answer
        checks.insert(0, "facts listed first (two model calls a file)")
    return (f"agent {spec.name}; tiers {' -> '.join(tiers)}{escalation}; "
            f"acceptance {', '.join(checks) or 'an answer'}; tools {tools}; "
            f"trigger {trigger}")  # fmt: skip


@click.command("run")
@click.argument("spec_path", metavar="SPEC")
@click.option("--prompt", default=None, help="The task, in words (default: the spec's goal).")
@click.option("--file", "file", default=None, help="A file for the agent to work on.")
@click.option("--id", "run_id", default=None, help="Run id (an existing id is a no-op).")
@click.option("--model", type=click.Choice(MODEL_CHOICES), default="spec", help=MODEL_HELP)
@click.option("--wait", is_flag=True, help="Work the run in this process until it ends.")
@click.pass_context
def run_spec(
    ctx: click.Context,
    spec_path: str,
    prompt: str | None,
    file: str | None,
    run_id: str | None,
    model: str,
    wait: bool,
) -> None:
    """Start one run of the agent SPEC (with --wait, also work it here to the end)."""
    app, agent = _agent(ctx, spec_path, model)
    task: dict[str, Any] = {"prompt": prompt or agent.spec.goal}
    if file:  # a path typed here means one from here, not from the agent's workspace
        task["file"] = os.path.abspath(file)
    from ..server import operations as ops
    from .main import act, operator

    run, _ = act(app, ops.start(app, operator(), agent.workflow.name, [task], run_id=run_id,
                                via="cli"), "run")  # fmt: skip
    handle = app.handle(run.id)
    render.echo(render.shown(handle.id))
    if not wait:
        return

    async def work() -> Any:
        worker = app.worker(concurrency=4, poll=0.2)
        runner = asyncio.create_task(worker.run())
        try:
            while True:  # a run parked for an operator's fix (a refused key) ends the wait
                try:
                    return await handle.result_async(timeout=1.0)
                except WaitTimeout:
                    run = await app.client.get(handle.id)
                    if run.status == "paused" and run.error is not None:
                        record = json.loads(run.error)
                        said = record.get("message") if isinstance(record, dict) else run.error
                        raise PerdureError(f"run {run.id} is parked: {said}") from None
        finally:
            worker.stop()
            await runner

    result = asyncio.run(work())
    render.echo(json.dumps(result, indent=2))


@click.command("agent")
@click.argument("spec_path", metavar="SPEC")
@click.option("--model", type=click.Choice(MODEL_CHOICES), default="spec", help=MODEL_HELP)
@click.option("--concurrency", default=4, show_default=True, help="Runs worked at once.")
@click.option("--poll", default=0.5, show_default=True, help="Longest idle wait, seconds.")
@click.pass_context
def agent_cmd(
    ctx: click.Context, spec_path: str, model: str, concurrency: int, poll: float
) -> None:
    """Serve the agent's trigger and work its runs until SIGTERM (drains, then stops)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from ..agent.budgets import declare

    app, agent = _agent(ctx, spec_path, model)
    app.runtime.sync(declare(app.runtime, agent.spec), "agent")  # `perdure budget` knows it now
    served = attach_trigger(app, agent)
    render.echo(f"perdure agent {agent.spec.name}: {served}; store {app.url}", err=True)
    app.run_worker(concurrency=concurrency, poll=poll)


@click.command()
@click.option("--agent", default=None, help="Only this agent.")
@click.option("--since", default="7d", show_default=True, help="How far back: 90m, 24h, 7d.")
@click.option("--by", type=click.Choice(["run", "agent", "day"]), default="day", show_default=True)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def usage(ctx: click.Context, agent: str | None, since: str, by: str, as_json: bool) -> None:
    """Tokens and cost of model calls, per run, agent or day."""
    from .main import get_app

    try:
        seconds = duration(since)
    except ValueError as exc:
        raise PerdureError(f"--since: {exc}") from None
    app = get_app(ctx, existing=True)
    if as_json:
        _usage_json(app, agent, time.time() - seconds, by)
        return
    rows = app.runtime.sync(Budgets(app.runtime.store).usage(agent, time.time() - seconds), "usage")
    groups: dict[tuple[str, ...], list[float]] = {}
    for u in rows:
        day = datetime.fromtimestamp(u.at, UTC).strftime("%Y-%m-%d")
        key = {"run": (u.agent, u.run_id), "agent": (u.agent,), "day": (day, u.agent)}[by]
        total = groups.setdefault(key, [0, 0, 0, 0.0])
        total[0] += 1
        total[1] += u.input_tokens
        total[2] += u.output_tokens
        total[3] += u.cost
    header = {"run": ["AGENT", "RUN"], "agent": ["AGENT"], "day": ["DAY", "AGENT"]}[by]
    body = [[*k, str(int(v[0])), str(int(v[1])), str(int(v[2])), f"{v[3]:.4f}"]
            for k, v in sorted(groups.items())]  # fmt: skip
    held = app.runtime.sync(
        Budgets(app.runtime.store).reservations(agent, time.time() - seconds), "usage"
    )
    if not body and not held:
        render.echo("no model calls recorded")
        return
    if body:
        render.echo(render.table(body, [*header, "CALLS", "IN", "OUT", "COST"]))
    if held:  # sent (or about to be) and never settled: counted at their reservation
        kinds: dict[tuple[str, str, str, str], list[float]] = {}
        for r in held:
            total = kinds.setdefault((r.agent, r.model, r.tier, _HELD[r.state]), [0, 0, 0.0])
            total[0] += 1
            total[1] += r.tokens
            total[2] += r.cost
        reserved = [[*k, str(int(v[0])), str(int(v[1])), f"{v[2]:.4f}"]
                    for k, v in sorted(kinds.items())]  # fmt: skip
        render.echo("\nCalls whose usage is not known, counted at their reservation:")
        render.echo(render.table(reserved, ["AGENT", "MODEL", "TIER", "OUTCOME", "CALLS",
                                       "TOKENS (EST.)", "COST (EST.)"]))  # fmt: skip


def _usage_json(app: App, agent: str | None, since: float, by: str) -> None:
    """`usage --json`: the API's `Usage` object, and `reserved`: the calls whose usage is not
    known, counted at their reservation."""
    from ..server.answers import usage as grouped

    shown = app.runtime.sync(grouped(app, agent, since, by), "usage")
    held = app.runtime.sync(Budgets(app.runtime.store).reservations(agent, since), "usage")
    kinds: dict[tuple[str, str, str, str], list[float]] = {}
    for r in held:
        total = kinds.setdefault((r.agent, r.model, r.tier, r.state), [0, 0, 0.0])
        total[0] += 1
        total[1] += r.tokens
        total[2] += r.cost
    shown["reserved"] = [
        {"agent": k[0], "model": k[1], "tier": k[2], "state": k[3], "outcome": _HELD[k[3]],
         "calls": int(v[0]), "tokens": int(v[1]), "cost": v[2]}
        for k, v in sorted(kinds.items())
    ]  # fmt: skip
    render.print_json(shown)


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


_HELD = {
    "open": "in flight or cut off",
    "unknown": "sent, outcome unknown",
    "estimated": "answered without usage",
    "aborted": "aborted by pause --now",
}


def _limit(option: str, text: str | None, kind: type[int] | type[float]) -> int | float | None:
    """A limit given on the command line: a number, 0 or more (one-line error otherwise)."""
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number of tokens" if kind is int else "a cost"
        raise PerdureError(f"{option}: {text!r} is not {what}") from None
    if value < 0 or value != value or value == float("inf"):
        raise PerdureError(f"{option}: {text!r} must be 0 or more")
    return value


@click.command()
@click.argument("agent", required=False)
@click.option("--shared", default=None, metavar="NAME",
              help="A budget agents share ([budget] shared = NAME), not one agent's.")  # fmt: skip
@click.option("--tokens-per-hour", default=None, metavar="N", help="Change this limit only.")
@click.option("--tokens-per-day", default=None, metavar="N", help="Change this limit only.")
@click.option("--cost-per-hour", default=None, metavar="X", help="Change this limit only.")
@click.option("--cost-per-day", default=None, metavar="X", help="Change this limit only.")
@click.option("--reset", is_flag=True, help="Forget the stored budget: the spec's is in force.")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def budget(
    ctx: click.Context,
    agent: str | None,
    shared: str | None,
    tokens_per_hour: str | None,
    tokens_per_day: str | None,
    cost_per_hour: str | None,
    cost_per_day: str | None,
    reset: bool,
    as_json: bool,
) -> None:
    """Show AGENT's budget in force and where each limit comes from (spec or stored), or
    change only the limits given (--reset: back to the spec's); parked runs that now fit go on.
    With --shared NAME instead: the budget the agents naming NAME in their spec share."""
    from ..agent.budgets import describe
    from ..server import operations as ops
    from .main import act, get_app, operator

    if (agent is None) == (shared is None):
        raise PerdureError("budget: name one AGENT, or --shared NAME")
    changes = {
        "tokens_per_hour": _limit("--tokens-per-hour", tokens_per_hour, int),
        "tokens_per_day": _limit("--tokens-per-day", tokens_per_day, int),
        "cost_per_hour": _limit("--cost-per-hour", cost_per_hour, float),
        "cost_per_day": _limit("--cost-per-day", cost_per_day, float),
    }
    if reset and any(v is not None for v in changes.values()):
        raise PerdureError("budget: --reset goes alone (it returns every limit to the spec's)")
    app = get_app(ctx, existing=True)
    if shared is not None:
        _shared_budget(app, shared, changes, reset, as_json)
        return
    assert agent is not None
    woken = None
    if reset or any(v is not None for v in changes.values()):
        woken = act(app, ops.set_budget(app, operator(), agent, changes, reset=reset), "budget")
    shown = app.runtime.sync(describe(app.runtime, agent), "budget")
    if as_json:
        render.print_json(shown if woken is None else {**shown, "woken": woken})
        return
    rows = []
    for name, value in shown["in_force"].items():
        window = name.rsplit("_", 1)[1]
        used = shown["spent"][window]["tokens" if name.startswith("tokens") else "cost"]
        limit = "none" if value["limit"] is None else _number(value["limit"])
        rows.append([name, limit, value["from"], _number(used)])
    render.echo(render.table(rows, ["LIMIT", "IN FORCE", "FROM", "SPENT (RESERVED COUNTED)"]))
    if shown["shared"]:
        render.echo(f"also held to the shared budget {render.shown(shown['shared'])} "
                    f"(perdure budget --shared {render.shown(shown['shared'])})")  # fmt: skip
    if shown["parked"]:
        render.echo(f"{shown['parked']} run(s) parked for budget")
    if woken is not None:
        render.echo(f"{render.shown(agent)}: budget {'reset to the spec' if reset else 'changed'}; "
                   f"{woken} parked run(s) woken")  # fmt: skip


def _shared_budget(
    app: App, name: str, changes: dict[str, Any], reset: bool, as_json: bool = False
) -> None:
    """`perdure budget --shared NAME [limits]`: change only the limits given, then show them
    with what its agents spent and which agents share it."""
    from ..agent.budgets import describe_shared
    from ..server import operations as ops
    from .main import act, operator

    woken = None
    if reset or any(v is not None for v in changes.values()):
        woken = act(app, ops.set_shared_budget(app, operator(), name, changes, reset=reset),
                    "budget")  # fmt: skip
    shown = app.runtime.sync(describe_shared(app.runtime, name), "budget")
    if as_json:
        render.print_json(shown if woken is None else {**shown, "woken": woken})
        return
    rows = []
    for limit_name, value in shown["limits"].items():
        window = limit_name.rsplit("_", 1)[1]
        used = shown["spent"][window]["tokens" if limit_name.startswith("tokens") else "cost"]
        limit = "none" if value is None else _number(value)
        rows.append([limit_name, limit, _number(used)])
    render.echo(render.table(rows, ["LIMIT", "SHARED", "SPENT (RESERVED COUNTED)"]))
    agents = ", ".join(render.shown(a) for a in shown["agents"]) or "none yet"
    render.echo(f"shared by: {agents}")
    if shown["parked"]:
        render.echo(f"{shown['parked']} run(s) parked for budget")
    if woken is not None:
        what = "limits forgotten" if reset else "changed"
        render.echo(f"shared {render.shown(name)}: {what}; {woken} parked run(s) woken")


COMMANDS = (validate, run_spec, agent_cmd, usage, budget)
