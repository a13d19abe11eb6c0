"""The app the agent crash test runs in real worker processes: one agent, one tool per effect.

Run as `python -m perdure --app agent_crash_app:app worker ...` from this directory, with
`PERDURE_DB` naming the store, `AGENT_CRASH_SPEC` the agent spec the test wrote (its model
is the test's fake OpenAI-compatible server), and `AGENT_CRASH_LEDGER` /
`AGENT_CRASH_MARKERS` two files outside the store.

The tools `ledger_once`, `ledger_keyed`, `ledger_idempotent` and `ledger_read` each take the
run's name and, with the step's idempotency key (run id + position, stable across replays):

1. append `started:<run>:<tool>:<key>` to the marker file,
2. wait until the file `effect` exists in the folder `AGENT_CRASH_GATE` (a kill here lands
   between the model call, already journaled, and the tool's effect),
3. append `<run>:<tool>:<key>` to the ledger: the side effect,
4. wait until the file `return` exists there (a kill here lands between the effect and its
   journal write),
5. return `result_text(run, tool, key)`.

The test opens the gates (creates the files) when its kill has landed, so the kill points
hold however slow the machine is; without `AGENT_CRASH_GATE` each wait is
`AGENT_CRASH_HOLD` seconds.

Each line is one `write()` on an O_APPEND file, so it survives kill -9 whole.
"""

from __future__ import annotations

import asyncio
import os

import perdure
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.agent.tools.base import FunctionTool, Tool, ToolContext, tool

SPEC_ENV = "AGENT_CRASH_SPEC"
LEDGER_ENV = "AGENT_CRASH_LEDGER"
MARKERS_ENV = "AGENT_CRASH_MARKERS"
HOLD_ENV = "AGENT_CRASH_HOLD"
GATE_ENV = "AGENT_CRASH_GATE"
GATE_MOST = 120.0  # seconds a tool waits at a gate at most (the test failed long before)
EFFECTS = ("once", "keyed", "idempotent", "read")


def tool_name(effect: str) -> str:
    return f"ledger_{effect}"


def result_text(run: str, tool: str, key: str) -> str:
    """What a tool returns; an operator who resolves a once call with its value writes this."""
    return f"{tool} recorded {run} under key {key}"


def append_line(path: str, line: str) -> None:
    """One line, one write() on an O_APPEND file: whole even under kill -9."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def gate(name: str) -> None:
    """Wait until the test opens gate `name` (or AGENT_CRASH_HOLD seconds without gates)."""
    folder = os.environ.get(GATE_ENV)
    if not folder:
        await asyncio.sleep(float(os.environ.get(HOLD_ENV, "1.0")))
        return
    path = os.path.join(folder, name)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GATE_MOST
    while not os.path.exists(path) and loop.time() < deadline:
        await asyncio.sleep(0.01)


def make_tool(effect: str) -> FunctionTool:
    name = tool_name(effect)

    async def record(ctx: ToolContext, run: str) -> str:
        key = perdure.current_step().idempotency_key  # the same on every replay of this call
        append_line(os.environ[MARKERS_ENV], f"started:{run}:{name}:{key}")
        await gate("effect")
        append_line(os.environ[LEDGER_ENV], f"{run}:{name}:{key}")
        await gate("return")
        return result_text(run, name, key)

    record.__name__ = name
    record.__doc__ = f"""Record one {effect} side effect for a run.

    Args:
        run: The run's name, exactly as the task gives it.
    """
    return tool(effect=effect, name=name)(record)


TOOLS: list[Tool] = [make_tool(effect) for effect in EFFECTS]


def build(db: str | None = None, spec_path: str | None = None) -> tuple[perdure.App, Agent]:
    """An App on `db` (default PERDURE_DB) with the agent of the spec at `spec_path`."""
    application = perdure.App(db)
    spec = load_spec(spec_path or os.environ[SPEC_ENV])
    built = Agent(application.runtime, spec, tools=list(TOOLS))
    # The provider (and the SDK it imports, ~1 s) is made now, as in a warm worker: made
    # lazily, the first model call would stall the worker's event loop while it imports.
    built.provider(spec.routing.default)
    return application, built


app, agent = build()
