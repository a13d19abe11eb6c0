"""The workflow a trigger starts: registered, and taking what the trigger hands it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..engine.runtime import Runtime


def check_one_argument(runtime: Runtime, workflow: str, where: str, what: str) -> None:
    """A one-line ConfigError (prefixed `where`) unless `workflow` is registered and takes
    `what` (the change, the event's payload) as its one argument."""
    definition = runtime.workflows.get(workflow)
    if definition is None:
        raise ConfigError(f"{where}: no workflow named {workflow!r} is registered")
    try:
        definition.signature.bind(None)
    except TypeError:
        raise ConfigError(
            f"{where}: workflow {workflow!r} must take {what} as its one argument"
        ) from None
