"""The app the MCP conformance tests serve with `perdure mcp --http` (store from PERDURE_DB)."""

from __future__ import annotations

from datetime import timedelta

import perdure

app = perdure.App()


@app.workflow(name="ask")
async def ask() -> str:
    """Wait for a person's answer at the gate human:colour (a question)."""
    return str(await perdure.wait_event("human:colour"))


@app.workflow(name="explode")
def explode(n: int) -> int:
    """Fail with a ValueError naming n."""
    raise ValueError(f"bad input {n}")


@app.workflow(name="hold")
async def hold() -> str:
    """Wait for the event `go` (not a question: the task stays working)."""
    return str(await perdure.wait_event("go"))


@app.workflow(name="nap")
async def nap(x: int, pause: float = 1.0) -> int:
    """Double x after a durable sleep."""
    await perdure.sleep(timedelta(seconds=pause))
    return 2 * x


@app.workflow(name="family")
async def family() -> str:
    """Start a child run of `hold` and wait for it."""
    return str(await hold())


@app.step(effect="read", name="say")
def say(words: str) -> int:
    perdure.stream.write(words)
    return len(words)


@app.workflow(name="confide")
def confide(words: str) -> int:
    """Write `words` into the run's stream."""
    return say(words)
