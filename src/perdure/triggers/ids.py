"""What may go into a run id that a trigger builds from outside input (event ids, names)."""

from __future__ import annotations

from ..errors import ConfigError

MAX_ID = 200


def id_problem(value: str | None) -> str | None:
    """Why `value` cannot be part of a run id, or None: 1-200 visible ASCII characters."""
    if not value:
        return "missing"
    if len(value) > MAX_ID:
        return f"longer than {MAX_ID} characters"
    if not all(33 <= ord(c) < 127 for c in value):
        return "not visible ASCII (no spaces or control characters)"
    return None


def check_id(value: str | None, what: str) -> str:
    """`value` if usable in a run id, else a one-line ConfigError naming `what`."""
    problem = id_problem(value)
    if problem is not None:
        raise ConfigError(f"{what} {value!r}: {problem}")
    assert value is not None
    return value
