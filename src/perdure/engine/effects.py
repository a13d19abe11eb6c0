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


def check_effect(effect: str, where: str) -> Effect:
    """Return `effect` if it is one of the five, else raise a ConfigError naming `where`."""
    from ..errors import ConfigError

    if effect not in EFFECTS:
        raise ConfigError(f"{where}: effect {effect!r} is not one of {', '.join(EFFECTS)}")
    return effect  # type: ignore[return-value]
