"""`pause --now` inside one process: it cuts off a tool call that allows it (journaled aborted,
re-run on resume under its effect's rule), leaves a `once` call that does not allow it to
finish, and sends an aborted `once` call that allowed it to needs_attention on resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import perdure
from perdure.agent.loop import Agent
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.agent.tools import ToolContext, tool
from perdure.engine.context import current
from perdure.testing import TestWorker

SPEC = """
name = "pauser"
goal = "Do the task"

[models.fast]
provider = "scripted"
context_tokens = 100000

[tools]
grant = ["finish", "{tool}"]

[limits]
max_iterations = 4
"""


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def _agent(app: perdure.App, tmp_path: Path, made: Any) -> tuple[Agent, ScriptedModel]:
    path = tmp_path / "agent.toml"
    path.write_text(SPEC.format(tool=made.name))
    model = ScriptedModel([_call(made.name, what="x"), _call("finish", summary="done")])
    return Agent(app.runtime, load_spec(path), providers={"fast": model}, tools=[made]), model


async def _pause_now(app: perdure.App) -> None:
    """What an operator does while the tool runs: pause its run with `now`."""
    ctx = current()
    assert ctx is not None
    await app.client.pause(ctx.run_id, now=True)


def _stopped(app: perdure.App, run_id: str) -> list[dict[str, Any]]:
    entries = app.runtime.sync(app.runtime.store.journal(run_id), "journal")
    return [json.loads(e.data or "{}") for e in entries if e.kind == "step.stopped"]


def test_a_keyed_tool_is_aborted_and_runs_again_with_the_same_key_on_resume(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The first call hangs until cut off; the run is paused with the call journaled aborted;
    resumed, the call runs again (same key) and the run finishes."""
    keys: list[str] = []

    @tool(effect="keyed")
    async def charge(ctx: ToolContext, what: str) -> str:
        """Charge for a thing.

        Args:
            what: The thing.
        """
        from perdure import current_step

        keys.append(current_step().idempotency_key)
        if len(keys) == 1:
            await _pause_now(app)
            await asyncio.Event().wait()  # hangs: only the abort ends it
        return "charged"

    agent, model = _agent(app, tmp_path, charge)
    handle = app.start(agent.workflow, {"prompt": "go"}, run_id="k1")
    worker.run_until_idle()
    assert app.get_run("k1").status == "paused"
    [stopped] = _stopped(app, "k1")
    assert stopped["aborted"] is True and stopped["effect"] == "keyed"
    assert "tool charge: aborted by pause --now" in stopped["reason"]
    app.resume("k1")
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    assert len(keys) == 2 and keys[0] == keys[1]
    assert model.calls == 2  # the model's answer before the tool was replayed, not re-bought


def test_a_once_tool_is_not_cut_off_unless_it_says_so(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """A `once` tool that does not declare itself abortable finishes its call; the run then
    pauses at its next step and, resumed, never runs that call again."""
    runs: list[str] = []

    @tool(effect="once")
    async def send(ctx: ToolContext, what: str) -> str:
        """Send a thing.

        Args:
            what: The thing.
        """
        runs.append(what)
        await _pause_now(app)
        await asyncio.sleep(0.05)  # were it aborted, it would be here
        return "sent"

    agent, _ = _agent(app, tmp_path, send)
    handle = app.start(agent.workflow, {"prompt": "go"}, run_id="o1")
    worker.run_until_idle()
    assert app.get_run("o1").status == "paused"
    assert _stopped(app, "o1") == []
    app.resume("o1")
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    assert runs == ["x"]


def test_an_aborted_once_tool_that_allowed_it_needs_attention_on_resume(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """A `once` tool declared abortable is cut off; its effect may be half done, so resume
    sends the run to needs_attention, naming the abort, instead of running it again."""
    runs: list[str] = []

    @tool(effect="once", abortable=True)
    async def post(ctx: ToolContext, what: str) -> str:
        """Post a thing.

        Args:
            what: The thing.
        """
        runs.append(what)
        await _pause_now(app)
        await asyncio.Event().wait()
        return "posted"

    agent, _ = _agent(app, tmp_path, post)
    app.start(agent.workflow, {"prompt": "go"}, run_id="a1")
    worker.run_until_idle()
    assert app.get_run("a1").status == "paused"
    [stopped] = _stopped(app, "a1")
    assert stopped["aborted"] is True and stopped["effect"] == "once"
    app.resume("a1")
    worker.run_until_idle()
    run = app.get_run("a1")
    assert run.status == "needs_attention"
    assert runs == ["x"]
    entries = app.runtime.sync(app.runtime.store.journal("a1"), "journal")
    [attention] = [e for e in entries if e.kind == "step.needs_attention"]
    assert "aborted by pause --now" in json.loads(attention.data or "{}")["reason"]


def test_two_gathered_steps_aborted_at_once_pause_the_run_and_both_run_again(
    app: perdure.App, worker: TestWorker
) -> None:
    """Steps of one run awaited together are all cut off; the run pauses (neither waits for
    the other forever) and, resumed, each runs again with its own key."""
    calls: list[int] = []

    @app.step(name="slow", effect="keyed")
    async def slow(i: int) -> int:
        calls.append(i)
        if len(calls) <= 2:
            if i == 0:
                await asyncio.sleep(0.01)  # both are in flight when the pause comes
                await _pause_now(app)
            return int(await perdure.abortable(asyncio.sleep(3600, i)))
        return i

    @app.workflow(name="both")
    async def both() -> list[int]:
        return list(await asyncio.gather(slow(0), slow(1)))

    handle = app.start(both, run_id="g1")
    worker.run_until_idle()
    assert app.get_run("g1").status == "paused"
    assert [s["aborted"] for s in _stopped(app, "g1")] == [True, True]
    app.resume("g1")
    worker.run_until_idle()
    assert handle.result(timeout=5) == [0, 1]
    assert sorted(calls) == [0, 0, 1, 1]


def test_the_app_pauses_a_workflow_now_and_its_workers_are_told_to_abort(
    app: perdure.App,
) -> None:
    """`App.pause_workflow(name, now=True)` is recorded so that the heartbeat of a worker
    holding one of its runs says to hold it and abort its calls; a plain pause only holds."""

    @app.workflow(name="held")
    def held() -> int:
        return 1

    app.start(held, run_id="h1")
    [claim] = app.runtime.sync(
        app.runtime.store.claim("w1", app.clock.now(), 30.0, 1, ["held"]), "claim"
    )
    app.pause_workflow("held")
    [state] = app.runtime.sync(
        app.runtime.store.heartbeat("w1", ["h1"], app.clock.now() + 30), "beat"
    )
    assert state.hold and not state.abort
    assert app.pause_workflow("held", now=True) is True  # changed: now it aborts too
    [state] = app.runtime.sync(
        app.runtime.store.heartbeat("w1", ["h1"], app.clock.now() + 30), "beat"
    )
    assert state.hold and state.abort
    assert app.resume_workflow("held") is True
    [state] = app.runtime.sync(
        app.runtime.store.heartbeat("w1", ["h1"], app.clock.now() + 30), "beat"
    )
    assert not state.hold and not state.abort and claim.run.id == "h1"
