"""The JSON Schema of what each reading command prints with `--json`, kept in docs/cli-json/.

A command that has an HTTP API twin prints the API's object (`server/answers.py` builds
both), so its schema is the API's (`server.openapi.SCHEMAS`); the others are described here.
Each file is a standalone JSON Schema (2020-12) whose `$defs` hold the objects it refers to.
`python -m perdure.cli.schemas [DIR]` writes them (default `docs/cli-json`); a test checks
the committed files are what this module produces and that every command's output fits.
Building them needs the `server` extra (the API's schemas live beside its routes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path("docs/cli-json")
DIALECT = "https://json-schema.org/draft/2020-12/schema"

# command (its words joined by "-") -> (schema name, what it prints)
COMMANDS: dict[str, tuple[str, str]] = {
    "ls": ("RunPage", "runs newest first (`next_cursor` is always null: use --limit)"),
    "show": ("Show", "the run and its journal (--step N: that step's entries only)"),
    "explain": ("Explanation", "per step: what happened and what recovery would do now"),
    "stuck": ("Stuck", "what waits for a person or nobody moves; exit 1 if anything"),
    "workers": ("Workers", "workers heard of within --since, with their state"),
    "triggers": ("Triggers", "every trigger with its state, lag and last error"),
    "schedules-ls": ("Schedules", "every schedule"),
    "schedules-show": ("ScheduleDetail", "a schedule, its next fire times, recent ticks"),
    "usage": ("CliUsage", "model tokens and cost, grouped; calls counted at reservation"),
    "audit": ("AuditEntry", "one JSON object per line, newest first (JSON lines)"),
    "effects": ("Effects", "every registered step, its effect and recovery"),
    "dead-ls": ("DeadMessages", "broker messages that could start no run"),
    "validate": ("Validated", "whether the spec passes (exit 2 with the error if not)"),
    "budget": ("AnyBudget", "an agent's budget, or a shared one (--shared); `woken` if set"),
}


def _cli_schemas() -> dict[str, dict[str, Any]]:
    """The objects only the CLI prints (the others are the API's)."""
    from ..server.openapi import ANY, INT, NUM, OPT_NUM, OPT_STR, STR, _array, _obj, _ref

    return {
        "Show": _obj("run entries", run=_ref("Run"), entries=_array(_ref("Entry"))),
        "Workers": _obj(
            "workers at",
            at=NUM,
            workers=_array(
                _obj(
                    "id host pid running concurrency started_at heartbeat_at stopped_at "
                    "clock_ahead state said triggers",
                    id=STR,
                    host=STR,
                    pid=INT,
                    running=INT,
                    concurrency=INT,
                    started_at=NUM,
                    heartbeat_at=NUM,
                    stopped_at=OPT_NUM,
                    clock_ahead=OPT_NUM,
                    state={"enum": ["alive", "silent", "stopped", "dead"]},
                    said=STR,
                    triggers=_array(_ref("Consumer")),
                )
            ),
        ),
        "CliUsage": {
            "allOf": [
                _ref("Usage"),
                _obj(
                    "reserved",
                    reserved=_array(
                        _obj(
                            "agent model tier state outcome calls tokens cost",
                            agent=STR,
                            model=STR,
                            tier=STR,
                            state=STR,
                            outcome=STR,
                            calls=INT,
                            tokens=INT,
                            cost=NUM,
                        )
                    ),
                ),
            ]
        },
        "AuditEntry": _obj(
            "id at actor action target detail outcome reason",
            id=INT,
            at=NUM,
            actor=STR,
            action=STR,
            target=STR,
            detail=ANY,
            reason=STR,
            outcome={"enum": ["ok", "refused", "failed"]},
        ),
        "Effects": _obj(
            "steps",
            steps=_array(
                _obj(
                    "name effect meaning recovery retry timeout",
                    name=STR,
                    effect=STR,
                    meaning=STR,
                    recovery=STR,
                    retry=STR,
                    timeout=STR,
                )
            ),
        ),
        "DeadMessages": _obj(
            "dead_messages",
            dead_messages=_array(
                _obj(
                    "trigger message_id kind reason body size at",
                    trigger=STR,
                    message_id=STR,
                    kind=STR,
                    reason=STR,
                    body=STR,
                    size=INT,
                    at=NUM,
                )
            ),
        ),
        "Validated": {
            "oneOf": [
                _obj(
                    "spec ok agent tiers tools summary",
                    spec=STR,
                    ok={"const": True},
                    agent=STR,
                    tools=_array(STR),
                    summary=STR,
                    tiers=_array(
                        _obj("tier provider model", tier=STR, provider=STR, model=OPT_STR)
                    ),
                ),
                _obj(
                    "spec ok error errors",
                    spec=STR,
                    ok={"const": False},
                    error=STR,
                    errors=_array(STR),
                ),
            ]
        },
        "AnyBudget": {"anyOf": [_ref("Budget"), _ref("SharedBudget")]},
    }


def _refs(value: Any) -> set[str]:
    """The schema names `value` refers to."""
    if isinstance(value, dict):
        found = set()
        ref = value.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[1])
        for item in value.values():
            found |= _refs(item)
        return found
    if isinstance(value, list):
        return set().union(*(_refs(v) for v in value)) if value else set()
    return set()


def _local(value: Any) -> Any:
    """`value` with each `#/components/schemas/X` made `#/$defs/X`."""
    if isinstance(value, dict):
        return {k: (v.replace("#/components/schemas/", "#/$defs/") if k == "$ref" else _local(v))
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_local(v) for v in value]
    return value


def schema(command: str) -> dict[str, Any]:
    """The standalone JSON Schema of `perdure COMMAND --json`'s output."""
    from ..server.openapi import SCHEMAS

    known = {**SCHEMAS, **_cli_schemas()}
    name, what = COMMANDS[command]
    needed: dict[str, Any] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in needed:
            continue
        needed[current] = known[current]
        todo += sorted(_refs(known[current]) - needed.keys())
    words = command.replace("-", " ")
    return {
        "$schema": DIALECT,
        "$id": f"https://perdure.dev/cli-json/{command}.schema.json",
        "title": f"perdure {words} --json",
        "description": what,
        "$ref": f"#/$defs/{name}",
        "$defs": {k: _local(needed[k]) for k in sorted(needed)},
    }


def render(command: str) -> str:
    return json.dumps(schema(command), indent=2, ensure_ascii=False) + "\n"


def write(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write one `<command>.schema.json` per command into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for command in COMMANDS:
        path = directory / f"{command}.schema.json"
        path.write_text(render(command), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR):
        print(path)
