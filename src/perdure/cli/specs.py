"""`--agent SPEC` on the commands that need workflows (serve, worker, effects, schedules,
triggers): each spec's agent registered on the app with its trigger, so a folder holding
only a spec and its store is served, worked and inspected with no Python module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from ..app import App

F = TypeVar("F", bound=Callable[..., Any])


def agent_option(command: F) -> F:
    """Add `--agent SPEC` (repeatable), as `perdure mcp` takes it."""
    return click.option(
        "--agent", "agent_specs", multiple=True, metavar="SPEC",
        help="Also the agent of this TOML spec, with its trigger (repeatable; no --app needed).",
    )(command)  # fmt: skip


def add_agents(app: App, specs: Sequence[str], model: str = "spec", *, works: bool = False) -> str:
    """Register the agent of each spec on `app`, with its trigger; what was added, in words.
    `works`: this process calls the models (a worker), so a tier's missing extra is refused
    now and the spec's budget is declared (`perdure budget` knows it)."""
    if not specs:
        return ""
    from ..agent.budgets import declare
    from ..agent.loop import Agent
    from ..agent.models import require_extras
    from ..agent.serve import attach_trigger, with_model
    from ..agent.spec import load_spec

    loaded = [with_model(load_spec(path), model) for path in specs]  # all checked first
    if works:
        for spec in loaded:
            require_extras(spec)
    said = []
    for spec in loaded:
        agent = Agent(app.runtime, spec)
        if works:
            app.runtime.sync(declare(app.runtime, spec), "--agent")
        said.append(f"agent {spec.name} ({attach_trigger(app, agent)})")
    return "; ".join(said)
