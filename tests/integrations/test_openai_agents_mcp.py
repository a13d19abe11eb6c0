"""The Agents SDK made durable: an agent's MCP servers' tool calls are steps (a real MCP
server subprocess), and changed code (a renamed tool or agent) is a non-determinism error
at the position where the replay diverges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("agents", reason=needs("openai-agents"))
pytest.importorskip("mcp", reason=needs("mcp"))

import agents
from agents import Agent, function_tool
from agents.mcp import MCPServerStdio
from crashes import app_module, kill_all, worker_process
from test_openai_agents import Payments, make_runner, script, shop_agent

import perdure
from crash_steps import crash_after, crash_and_recover
from perdure.integrations.openai_agents import Runner
from perdure.server import operations
from perdure.server.access import local_operator
from perdure.testing import TestClock, TestWorker
from waits import wait_for

agents.set_tracing_disabled(True)
FIXTURE = str(Path(__file__).parent.parent / "agent" / "mcp_server_fixture.py")


def mcp_agent(server: Any, **options: Any) -> Agent[Any]:
    """An agent whose only tools are those of the fixture MCP server (not connected: the
    durable run connects it where it runs)."""
    fixture = MCPServerStdio(
        params={"command": sys.executable, "args": [FIXTURE]}, name="fixture",
        client_session_timeout_seconds=30, **options,
    )  # fmt: skip
    base = shop_agent(server, Payments())
    return base.clone(tools=[], mcp_servers=[fixture])


@pytest.mark.slow  # an MCP server subprocess cut off by the crash, then another
def test_mcp_tool_calls_are_steps_and_an_interrupted_once_call_parks(
    app: perdure.App, clock: TestClock, server: Any, tmp_path: Path
) -> None:
    """`add` (read, per tool) and `touch` (once, the server's effect) go to a real MCP server
    as steps; a crash inside `touch` parks the run without touching; the operator's value
    is what the model reads."""
    target = tmp_path / "touched.txt"
    runner = Runner(app, tool_effects={"add": "read"}, mcp_effects={"fixture": "once"},
                    require_effects=True)  # fmt: skip
    flow = runner.workflow(mcp_agent(server))
    server.reply(tool_calls=[("c1", "add", {"a": 2, "b": 3})])
    server.reply(tool_calls=[("c2", "touch", {"path": str(target)})])
    server.reply("Added and touched.")
    handle = app.start(flow, "add, then touch", run_id="m-1")
    crash_and_recover(app, clock, "agents.refunds.tool.touch")
    assert handle.status() == "needs_attention" and not target.exists()
    assert len(server.requests) == 2
    add_reply = server.requests[1].body["messages"][-1]
    assert add_reply["role"] == "tool" and "5" in json.dumps(add_reply["content"])

    by_hand = {"content": [{"type": "text", "text": "touched by hand"}], "isError": False}
    app.resolve("m-1", "agents.refunds.tool.touch", value=by_hand)
    TestWorker(app).run_until_idle()
    assert handle.result() == "Added and touched." and not target.exists()
    assert "touched by hand" in json.dumps(server.requests[-1].body["messages"][-1]["content"])
    effects = {n: d.effect for n, d in app.runtime.steps.items() if ".tool." in n}
    assert effects["agents.refunds.tool.add"] == "read"
    assert effects["agents.refunds.tool.touch"] == "once"


@pytest.mark.parametrize("approve", [True, False])
def test_an_mcp_servers_require_approval_interrupts_into_a_gate(
    app: perdure.App, worker: TestWorker, server: Any, tmp_path: Path, approve: bool
) -> None:
    """An MCP server with require_approval="always": the SDK's interruption becomes a
    perdure gate; approved, the call runs (once, as a step); denied, the model reads the
    reason, and the call never reaches the server."""
    target = tmp_path / "touched.txt"
    runner = Runner(app, mcp_effects={"fixture": "idempotent"})
    flow = runner.workflow(mcp_agent(server, require_approval="always"))
    server.reply(tool_calls=[("c1", "touch", {"path": str(target)})])
    server.reply("Done.")
    handle = app.start(flow, "touch it", run_id="m-gate")
    worker.run_until_idle()
    assert handle.status() == "waiting" and not target.exists()
    gates = app.runtime.sync(operations.pending_gates(app), "gates")
    assert [(g.call_id, g.tool, g.arguments) for g in gates] == [
        ("c1", "touch", {"path": str(target)})
    ]
    app.runtime.sync(
        operations.decide(app, local_operator(), "m-gate", "c1", approve, "no"), "decide"
    )
    worker.run_until_idle()
    assert handle.result() == "Done." and target.exists() == approve
    assert len(server.requests) == 2
    steps = [e.name for e in app.journal("m-gate") if e.kind == "step.outcome"]
    assert steps.count("agents.refunds.tool.touch") == (1 if approve else 0)
    if not approve:
        assert "no" in json.dumps(server.requests[-1].body["messages"][-1]["content"])


def test_an_mcp_server_without_an_effect_is_refused_under_require_effects(
    app: perdure.App, server: Any
) -> None:
    """require_effects=True: an MCP server whose tools have no declared effect is one line
    when the agent is registered."""
    with pytest.raises(perdure.ConfigError, match="MCP server 'fixture' declares no effect"):
        Runner(app, require_effects=True).workflow(mcp_agent(server))


def _crash_in_refund(app: perdure.App, server: Any, run_id: str) -> None:
    workflow = make_runner(app).workflow(shop_agent(server, Payments()))
    script(server)
    app.start(workflow, "refund o42", run_id=run_id)
    crash_after(app, "agents.refunds.tool.issue_refund")


def test_a_renamed_tool_is_a_non_determinism_error_at_the_first_request(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """New code whose refund tool is renamed: the replay stops at the first recorded model
    call, which offered the old tool list, naming both lists; no request is sent."""
    _crash_in_refund(app, server, "n-tool")
    sent = len(server.requests)

    @function_tool
    def refund_order(order: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = shop_agent(server, Payments())
    agent = agent.clone(
        tools=[refund_order if t.name == "issue_refund" else t for t in agent.tools]
    )
    fresh = perdure.App(app.url, clock=clock)
    try:
        make_runner(fresh).workflow(agent)
        clock.advance(60)
        TestWorker(fresh).run_until_idle()
        run = fresh.get_run("n-tool")
    finally:
        fresh.close()
    error = json.loads(run.error or "{}")
    message = error.get("message", "")
    assert run.status == "failed" and error["type"] == "perdure.errors.NonDeterminismError"
    assert "at position 0" in message and "'issue_refund'" in message, message
    assert "'refund_order'" in message and "\n" not in message, message
    assert len(server.requests) == sent


def test_a_renamed_agent_is_a_non_determinism_error_at_its_first_step(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """Inside one's own workflow, the agent renamed in new code stops the replay at
    position 0, where the journal has the old agent's model step."""
    agent = shop_agent(server, Payments())

    @app.workflow(name="support")
    async def support(text: str) -> str:
        return str((await make_runner(app).run(agent, text)).final_output)

    script(server)
    app.start(support, "refund o42", run_id="n-agent")
    crash_after(app, "agents.refunds.tool.issue_refund")

    fresh = perdure.App(app.url, clock=clock)
    try:
        renamed = shop_agent(server, Payments()).clone(name="helpdesk")

        @fresh.workflow(name="support")
        async def support2(text: str) -> str:
            return str((await make_runner(fresh).run(renamed, text)).final_output)

        clock.advance(60)
        TestWorker(fresh).run_until_idle()
        run = fresh.get_run("n-agent")
    finally:
        fresh.close()
    message = json.loads(run.error or "{}").get("message", "")
    # a deploy never fails the run (issue 36): it waits for a worker of its code version
    assert run.status == "needs_attention" and "at position 0" in message, message
    assert "agents.refunds.model" in message and "agents.helpdesk.model" in message, message


@pytest.mark.slow
def test_a_worker_killed_inside_a_once_tool_parks_the_run_and_no_model_call_repeats(
    tmp_path: Path, store_url: str, server: Any
) -> None:
    """`kill -9` of a real `perdure worker` while the e-mail tool runs: a restarted worker
    sends no recorded model call again, streams none again, and does not re-send the
    e-mail; the run is in needs_attention, and resolved it finishes with one more call."""
    ledger, log = tmp_path / "ledger", tmp_path / "log"
    ledger.touch()
    env = {"AGENTS_LEDGER": str(ledger), "AGENTS_BASE_URL": server.origin + "/v1"}
    os.environ.update(env)  # the client's copy of the app builds the same agent
    agents_app = app_module("agents_app")
    client = perdure.App(store_url)
    workflow = agents_app.register(client)
    lines = lambda: ledger.read_text().split()  # noqa: E731
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    server.reply(tool_calls=[("c2", "send_email", {"order": "o42"})])
    server.reply("Order o42 was refunded.")
    first = worker_process("agents_app:app", store_url, env, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = client.start(workflow, "refund o42", run_id="k-42", stream=True)
        wait_for("the e-mail to start", lambda: "email-started" in lines(), log)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert lines() == ["lookup", "email-started"] and len(server.requests) == 2
        second = worker_process("agents_app:app", store_url, env, log)
        wait_for("needs_attention", lambda: handle.status() == "needs_attention", log)
        time.sleep(agents_app.HOLD + 0.5)  # a re-sent e-mail would have logged by now
        assert lines() == ["lookup", "email-started"] and len(server.requests) == 2
        client.resolve("k-42", "agents.refunds.tool.send_email", value="sent")
        assert handle.result(timeout=30) == "Order o42 was refunded."
        assert lines() == ["lookup", "email-started"] and len(server.requests) == 3
        kinds = [(c.kind, c.data["step"]) for c in handle.stream() if c.kind != "chunk"]
        model = ("attempt", "agents.refunds.model")
        # each model call streamed once, none again; the lookup's output once; the e-mail's
        # none (killed inside it, then resolved by value, never run again)
        assert kinds == [model, ("attempt", "agents.refunds.tool.lookup_order"), model, model]
    finally:
        kill_all(first, second)
        client.close()
        for key in env:
            os.environ.pop(key, None)


@pytest.mark.slow  # an MCP server subprocess cut off by the crash, then another
def test_an_interrupted_mcp_call_is_settled_by_its_probe(
    app: perdure.App, clock: TestClock, server: Any, tmp_path: Path
) -> None:
    """`Runner(tool_probes={"touch": ...})` probes an MCP tool's interrupted call with its
    arguments: the file is there (the call had reached the server), so the call is settled
    with the probe's value as the MCP result, `touch` is not called again, and the model
    reads that value."""
    target = tmp_path / "touched.txt"
    asked: list[dict[str, Any]] = []

    def find_touched(path: str) -> perdure.ProbeAnswer:
        asked.append({"path": path})
        found = Path(path)
        return perdure.ProbeAnswer.done(f"found {found.read_text()}") if found.exists() else (
            perdure.ProbeAnswer.not_done()
        )  # fmt: skip

    runner = Runner(app, mcp_effects={"fixture": "once"}, tool_probes={"touch": find_touched})
    flow = runner.workflow(mcp_agent(server))
    server.reply(tool_calls=[("c1", "touch", {"path": str(target)})])
    server.reply("Touched.")
    handle = app.start(flow, "touch", run_id="m-probe")
    dead = crash_after(app, "agents.refunds.tool.touch")
    target.write_text("before the crash")  # as if the call had reached the server
    clock.advance(dead.lease + 1)
    TestWorker(app).run_until_idle()

    assert handle.result() == "Touched."
    assert target.read_text() == "before the crash" and asked == [{"path": str(target)}]
    assert "found before the crash" in json.dumps(server.requests[-1].body["messages"][-1])
