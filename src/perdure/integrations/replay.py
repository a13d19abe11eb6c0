"""Replay checks of framework agents: a model step journals the tools it offered, and a
replay whose code offers others (a tool renamed, added or removed) stops right there with a
non-determinism error, instead of mixing the old journal with the new tool list."""

from __future__ import annotations

from typing import Any

from ..engine.context import require
from ..errors import NonDeterminismError

__all__ = ["check_tools"]


def check_tools(outcome: dict[str, Any], offered: list[str], step: str) -> None:
    """Raise NonDeterminismError (failing the run, even if the framework swallows it) when
    the recorded model step at `outcome["position"]` offered other tools than `offered`."""
    recorded = outcome.get("tools")
    if recorded is None or sorted(recorded) == sorted(offered):
        return
    ctx = require("a durable agent's model request")
    ctx.diverged = NonDeterminismError(
        ctx.run_id,
        int(outcome.get("position", -1)),
        f"{step} offering tools {sorted(recorded)}",
        f"{step} offering tools {sorted(offered)}",
    )
    raise ctx.diverged
