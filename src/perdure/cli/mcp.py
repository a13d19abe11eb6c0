"""`perdure mcp`: serve the app's workflows and agents as MCP tools that run as MCP tasks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import click

from ..agent.serve import MODEL_CHOICES
from ..errors import ConfigError
from ..extras import require_extra
from . import render
from .listening import connection_limits, listen_options


@click.command("mcp")
@click.option(
    "--http",
    "over_http",
    is_flag=True,
    help="Streamable HTTP (bearer tokens from `perdure token create`) instead of stdio.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (--http).")
@click.option("--port", default=8765, show_default=True, help="Port to bind (--http).")
@click.option("--path", default="/mcp", show_default=True, help="Endpoint path (--http).")
@click.option(
    "--worker",
    "with_worker",
    is_flag=True,
    help="Also run workflows in this process (default: a `perdure worker` runs them).",
)
@click.option("--concurrency", default=8, show_default=True, help="Runs the --worker runs at once.")
@click.option(
    "--agent",
    "agent_specs",
    multiple=True,
    metavar="SPEC",
    help="Also serve the agent of this TOML spec (repeatable).",
)
@click.option(
    "--model",
    type=click.Choice(MODEL_CHOICES),
    default="spec",
    help="Serve the agents' default tier with this model.",
)
@click.option(
    "--workflow",
    "only",
    multiple=True,
    metavar="NAME",
    help="Expose only these workflows (repeatable; default: all).",
)
@click.option("--builtin", is_flag=True, help="Also expose perdure's own workflows (perdure.plan).")
@click.option(
    "--operator",
    is_flag=True,
    help="Also offer the operator tools (stuck, explain, resolve, cancel, pause, resume, fork) "
    "under the client's scopes; no --app needed.",
)
@click.option(
    "--print-skill",
    is_flag=True,
    help="Print the skill file (SKILL.md) telling a model how to work the stuck queue with "
    "the operator tools, and exit.",
)
@click.option(
    "--call-wait",
    default=60.0,
    show_default=True,
    help="Seconds a plain (not task) tools/call waits for its run's result.",
)
@listen_options
@click.pass_context
def mcp_cmd(
    ctx: click.Context,
    /,
    over_http: bool,
    host: str,
    port: int,
    path: str,
    with_worker: bool,
    concurrency: int,
    agent_specs: tuple[str, ...],
    model: str,
    only: tuple[str, ...],
    builtin: bool,
    operator: bool,
    print_skill: bool,
    call_wait: float,
    allowed_hosts: tuple[str, ...],
    **listening: Any,
) -> None:
    """Serve workflows and agents as MCP tools (stdio, or Streamable HTTP with --http).

    A task-augmented tools/call starts a durable run whose id is the task id
    (tasks/get, tasks/result, tasks/list, tasks/cancel); a gate the run reaches
    is put to the client as an elicitation. Over HTTP the same endpoint also serves
    the stateless revision 2026-07-28 with the tasks extension (tasks/get,
    tasks/update, tasks/cancel, subscriptions/listen), chosen per request. Tasks
    survive the server: any server on the same store answers for them. Over HTTP it
    answers only requests for its own address or an --allowed-host name, and cuts
    slow clients off. With --operator it also offers the operator tools, each
    checked against the client's scopes and audited as the same action from the
    CLI; --print-skill prints the skill file that tells a model how to use them
    (e.g. `perdure mcp --print-skill > .claude/skills/perdure-operator/SKILL.md`).
    """  # fmt: skip
    require_extra("mcp", "perdure mcp")
    if print_skill:
        from ..server.mcp import skill

        click.echo(skill(), nl=False)
        return
    from ..agent.loop import Agent
    from ..agent.models import require_extras
    from ..agent.serve import with_model
    from ..agent.spec import load_spec
    from ..engine.worker import WorkerOptions
    from ..observe.logs import configure_logging
    from ..server.mcp import McpOptions, PerdureMcp, serve_http, serve_stdio, workflow_tools
    from .main import get_app  # main imports this module to register the command

    # the one log configuration of perdure's processes (PERDURE_LOG_FORMAT, PERDURE_LOG_LEVEL),
    # on stderr only: over stdio, standard output is the protocol; secrets masked as in every
    # perdure log (an access log's request line can carry `?token=...`)
    configure_logging()
    logging.getLogger("mcp").setLevel(logging.WARNING)
    app = get_app(ctx)
    descriptions: dict[str, str] = {}
    for spec_path in agent_specs:
        spec = with_model(load_spec(spec_path), model)
        require_extras(spec)
        agent = Agent(app.runtime, spec)
        descriptions[agent.name] = agent.spec.goal.strip()
    tools = workflow_tools(
        app.runtime.workflows, only=only, builtin=builtin, descriptions=descriptions
    )
    if not tools and not operator:
        raise ConfigError(
            "no tools to serve: pass --app module:attribute and/or --agent SPEC, or --operator"
        )
    options = McpOptions(call_wait=call_wait)
    worker = WorkerOptions(concurrency=concurrency) if with_worker else None
    server = PerdureMcp(app, tools, options, http=over_http, operator=operator)
    names = ", ".join([*sorted(tools), *server.operators]) or "none"
    runs = "runs workflows here" if with_worker else "a `perdure worker` runs them"
    try:
        if over_http:
            render.echo(f"perdure mcp: http://{host}:{port}{path} on {app.url}; tools: {names}; "
                       f"{runs}", err=True)  # fmt: skip
            limits = connection_limits(listening)
            asyncio.run(serve_http(server, host, port, path=path, worker=worker,
                                   names=allowed_hosts, limits=limits))  # fmt: skip
        else:
            render.echo(f"perdure mcp: stdio on {app.url}; tools: {names}; {runs}", err=True)
            asyncio.run(serve_stdio(server, worker))
    finally:
        app.close()
