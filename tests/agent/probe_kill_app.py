"""The app the spec-agent probe kill test runs in real `perdure worker` processes.

Run as `python -m perdure --app probe_kill_app:app worker` from this folder, with
`PERDURE_DB` (the store), `PROBE_KILL_SPEC` (the agent spec the test wrote: a scripted
model, `[tools.effects] issue_refund = { probe = "find_refund" }`) and `PROBE_KILL_DIR` (a
folder outside the store: the ledger, the markers, the gates).

`issue_refund(order)` appends `started:<order>` to `markers`, waits for the gate file
`pay` (or `pay-<order>`), appends `<order>` to `ledger` (the effect), waits for the gate
file `return` (or `return-<order>`), and returns `refunded <order>`; `find_refund(order)`,
the probe, appends `<order>` to `looked` and reads the ledger; `notify(order)`, a once tool
without a probe, appends `<order>` to `notified`. Each line is one write() on an O_APPEND
file: whole even under kill -9.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import perdure
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.agent.tools.base import tool

SPEC_ENV = "PROBE_KILL_SPEC"
DIR_ENV = "PROBE_KILL_DIR"
GATE_MOST = 120.0  # seconds a tool waits at a gate at most (the test failed long before)


def folder() -> Path:
    return Path(os.environ[DIR_ENV])


def append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_gate(name: str, order: str) -> None:
    """Until the gate file `name` (for every order) or `name-order` is there."""
    limit = time.monotonic() + GATE_MOST
    gates = (folder() / name, folder() / f"{name}-{order}")
    while not any(g.exists() for g in gates) and time.monotonic() < limit:
        time.sleep(0.02)


@tool(effect="once")
def issue_refund(order: str) -> str:
    """Refund an order (no idempotency key: the payment system applies every call).

    Args:
        order: The order.
    """
    append_line(folder() / "markers", f"started:{order}")
    wait_gate("pay", order)
    append_line(folder() / "ledger", order)
    wait_gate("return", order)
    return f"refunded {order}"


@tool(effect="read")
def find_refund(order: str) -> str:
    """Look the order's refund up in the payment ledger.

    Args:
        order: The order.
    """
    append_line(folder() / "looked", order)
    if order in lines(folder() / "ledger"):
        return json.dumps({"done": True, "value": f"refunded {order} (found in the ledger)"})
    return json.dumps({"done": False})


@tool(effect="once")
def notify(order: str) -> str:
    """Tell the customer a refund is on its way.

    Args:
        order: The order.
    """
    append_line(folder() / "notified", order)
    return f"notified {order}"


app = perdure.App()
tools = [issue_refund, find_refund, notify]
agent = Agent(app.runtime, load_spec(os.environ[SPEC_ENV]), tools=tools)
