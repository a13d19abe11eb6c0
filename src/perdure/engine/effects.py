"""The five effects a step declares, and what recovery does with each (DESIGN.md table)."""

from __future__ import annotations

from typing import Literal, get_args

Effect = Literal["read", "idempotent", "keyed", "once", "transactional"]
EFFECTS: tuple[str, ...] = get_args(Effect)

MEANING: dict[str, str] = {
    "read": "changes nothing outside",
    "idempotent": "repeating gives the same outcome",
    "keyed": "the outside deduplicates by a key",
    "once": "must not run twice",
    "transactional": "writes to the store's own database",
}

RECOVERY: dict[str, str] = {
    "read": "re-run",
    "idempotent": "re-run",
    "keyed": "re-run with the same idempotency key",
    "once": "not re-run: run goes to needs_attention for an operator",
    "transactional": "nothing to recover: effect and outcome commit together",
}


# Why recovery found a `once` step with an intent and no outcome (the needs_attention reason).
CRASHED = "its worker was lost between intent and outcome of a once step"
UNKNOWN_EFFECT = "its effect may or may not have happened"


def lost_reason(why: str) -> str:
    """The needs_attention reason of a once step whose worker was lost, saying how (`why`)."""
    return f"{why} between intent and outcome of a once step; {UNKNOWN_EFFECT}"


STOPPED = "stopped while executing a once step"


def stopped_reason(why: str) -> str:
    """The needs_attention reason of a once step cut off by a stopping worker (`why`)."""
    return f"{STOPPED} ({why}); not a crash, but {UNKNOWN_EFFECT}"


NOT_STARTED = "the worker stopped before the step's body started"


def check_effect(effect: str, where: str) -> Effect:
    """Return `effect` if it is one of the five, else raise a ConfigError naming `where`."""
    from ..errors import ConfigError

    if effect not in EFFECTS:
        raise ConfigError(f"{where}: effect {effect!r} is not one of {', '.join(EFFECTS)}")
    return effect  # type: ignore[return-value]
