"""`perdure mcp --operator`: the operator tools through the official SDK's client (in memory),
each action audited as the same action from the CLI, refused in one line where the scopes do
not allow it, in both MCP revisions; the skill file ships with the package. (The real-process
test, a worker killed with SIGKILL mid-`once`: tests/mcp_conformance/test_operator_tools.py.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner

from extras_needed import needs
from parked_runs import crash_and_recover

pytest.importorskip("mcp", reason=needs("mcp"))

from mcp import ClientSession
from mcp import types as t
from mcp.shared.memory import create_connected_server_and_client_session

import perdure
from perdure.cli.main import cli
from perdure.errors import ConfigError
from perdure.server.access import Principal
from perdure.server.access_sql import Access
from perdure.server.mcp import McpOptions, PerdureMcp, skill, workflow_tools
from perdure.server.mcp.server import Requestor
from perdure.server.mcp.stateless import Rpc, Stateless
from perdure.testing import TestClock, TestWorker

OPERATOR_TOOLS = {"perdure_stuck", "perdure_explain", "perdure_resolve", "perdure_cancel",
                  "perdure_pause", "perdure_resume", "perdure_fork", "perdure_steer"}  # fmt: skip


@pytest.fixture
def charges(app: perdure.App) -> list[str]:
    """`app` with a `charge` workflow whose once `pay` step records each payment it makes."""
    paid: list[str] = []

    @app.step(effect="once", name="pay")
    def pay(order: str) -> str:
        paid.append(order)
        return f"paid-{order}"

    receipt = app.step(effect="idempotent", name="receipt")(lambda paid: f"receipt for {paid}")

    @app.workflow(name="charge")
    async def charge(order: str) -> str:
        payment = await pay(order)
        return str(await receipt(payment))

    @app.workflow(name="hold")
    async def hold() -> str:
        return str(await perdure.wait_event("go"))

    return paid


def park(app: perdure.App, clock: TestClock, run_id: str) -> None:
    """A charge whose worker died between the pay step's intent and its outcome."""
    app.start("charge", run_id, run_id=run_id)
    crash_and_recover(app, clock, "pay")
    assert app.get_run(run_id).status == "needs_attention"


def answer(result: t.CallToolResult) -> dict[str, Any]:
    """The structured answer of a tool call that must have succeeded."""
    assert not result.isError, result.content
    assert result.structuredContent is not None
    text = result.content[0]
    assert isinstance(text, t.TextContent) and json.loads(text.text) == result.structuredContent
    return result.structuredContent


def serve(app: perdure.App) -> PerdureMcp:
    return PerdureMcp(app, workflow_tools(app.runtime.workflows), McpOptions(poll=0.1),
                      operator=True)  # fmt: skip


async def session_calls(app: perdure.App, work: Any) -> None:
    async with create_connected_server_and_client_session(
        serve(app).server, client_info=t.Implementation(name="helper", version="1")
    ) as session:
        await work(session)


def test_a_parked_run_is_listed_explained_and_resolved_and_each_action_is_audited(
    app: perdure.App, charges: list[str], clock: TestClock
) -> None:
    """The tools are listed beside the workflows' (never as tasks); stuck lists the parked
    run with its cause, explain points at the pay step, resolve with the payment's value lets
    the run finish without paying again; the resolve is audited with the client as actor."""
    park(app, clock, "c1")

    async def work(session: ClientSession) -> None:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert OPERATOR_TOOLS | {"charge", "hold"} == set(tools)
        assert tools["perdure_stuck"].annotations is not None
        assert tools["perdure_stuck"].annotations.readOnlyHint is True
        assert tools["perdure_resolve"].execution is not None
        assert tools["perdure_resolve"].execution.taskSupport == "forbidden"
        assert "'operate' scope" in (tools["perdure_resolve"].description or "")
        [parked] = answer(await session.call_tool("perdure_stuck", {}))["runs"]
        assert (parked["run_id"], parked["cause"]) == ("c1", "interrupted")
        explained = answer(await session.call_tool("perdure_explain", {"run_id": "c1"}))
        assert explained["status"] == "needs_attention" and explained["cause"] == "interrupted"
        [step] = [s for s in explained["steps"] if s["state"] == "needs_attention"]
        assert (step["position"], step["name"], step["effect"]) == (0, "pay", "once")
        missing = await session.call_tool(
            "perdure_resolve", {"run_id": "c1", "step": 0, "how": "value"}
        )
        assert missing.isError and "how=value needs `value`" in str(missing.content)
        done = answer(await session.call_tool("perdure_resolve", {
            "run_id": "c1", "step": 0, "how": "value", "value": "paid-c1",
            "comment": "the ledger shows the payment"}))  # fmt: skip
        assert done == {"run_id": "c1", "status": "pending"}

    asyncio.run(session_calls(app, work))
    TestWorker(app).run_until_idle()
    run = app.get_run("c1")
    assert (run.status, run.result) == ("completed", '"receipt for paid-c1"')
    assert charges == []  # settled by its value: the step's body never ran again
    rows = app.runtime.sync(Access(app.runtime.store).audit_log(target="run:c1"), "audit")
    [resolved] = [r for r in rows if r.action == "run.resolve"]
    assert (resolved.actor, resolved.outcome) == ("mcp:helper", "ok")
    detail = json.loads(resolved.detail)
    assert detail == {"step": 0, "how": "value", "value": "paid-c1",
                      "comment": "the ledger shows the payment"}  # fmt: skip


def test_pause_resume_cancel_and_fork_go_through_the_operations_route(
    app: perdure.App, charges: list[str], clock: TestClock
) -> None:
    """Each action answers the run's new status and leaves the audit row the CLI's would;
    fork starts a new run; a task-augmented call of an operator tool is refused."""
    app.start("hold", run_id="h1")
    app.start("charge", "o2", run_id="o2")
    TestWorker(app).run_until_idle()
    assert app.get_run("o2").status == "completed"

    async def work(session: ClientSession) -> None:
        paused = await session.call_tool("perdure_pause", {"run_id": "h1", "comment": "look"})
        assert answer(paused) == {"run_id": "h1", "status": "paused"}
        resumed = answer(await session.call_tool("perdure_resume", {"run_id": "h1"}))
        assert resumed["status"] != "paused"
        forked = answer(await session.call_tool(
            "perdure_fork", {"run_id": "o2", "from_step": 1, "new_id": "o2-again"}))  # fmt: skip
        assert forked["run_id"] == "o2-again" and forked["forked_from"] == "o2"
        cancelled = answer(await session.call_tool("perdure_cancel", {"run_id": "h1"}))
        assert cancelled["status"] in ("cancelled", "cancelling")
        unknown = await session.call_tool("perdure_cancel", {"run_id": "nope"})
        assert unknown.isError and "nope" in str(unknown.content)
        extra = await session.call_tool("perdure_explain", {"run_id": "h1", "x": 1})
        assert extra.isError and "x: Extra inputs are not permitted" in str(extra.content)

    asyncio.run(session_calls(app, work))
    TestWorker(app).run_until_idle()
    assert app.get_run("o2-again").status == "completed"
    assert charges == ["o2"]  # the fork reused the payment (step 0)
    rows = app.runtime.sync(Access(app.runtime.store).audit_log(actor="mcp:helper"), "audit")
    assert {(r.action, r.target, r.outcome) for r in rows} == {
        ("run.pause", "run:h1", "ok"), ("run.resume", "run:h1", "ok"),
        ("run.fork", "run:o2", "ok"), ("run.cancel", "run:h1", "ok"),
        ("run.cancel", "run:nope", "refused"),
    }  # fmt: skip


def test_a_read_token_may_look_but_not_act_in_either_revision(
    app: perdure.App, charges: list[str], clock: TestClock
) -> None:
    """A read-only principal: stuck answers; resolve is a tool error naming the scope it
    needs (2025-11-25 and 2026-07-28 alike), audited as refused, and the run stays parked."""
    park(app, clock, "c3")
    server = serve(app)
    reader = Requestor(Principal("reader", frozenset({"read"})), "token:r")
    resolve = server.operators["perdure_resolve"]
    args = {"run_id": "c3", "step": 0, "how": "retry"}

    async def work() -> None:
        looked = await server.operate(reader, server.operators["perdure_stuck"], {}, False)
        assert [r["run_id"] for r in answer(looked)["runs"]] == ["c3"]
        refused = await server.operate(reader, resolve, args, False)
        assert refused.isError
        assert refused.content[0].text == (  # type: ignore[union-attr]
            "perdure_resolve refused: run.resolve needs the 'operate' scope; 'reader' has ['read']"
        )
        rpc = Rpc(1, "tools/call", {"name": "perdure_resolve", "arguments": args})
        modern = await Stateless(server).handle(rpc, reader)
        assert modern["result"]["isError"] is True
        assert "needs the 'operate' scope" in modern["result"]["content"][0]["text"]
        listed = await Stateless(server).handle(Rpc(2, "tools/list", {}), reader)
        assert {tool["name"] for tool in listed["result"]["tools"]} >= OPERATOR_TOOLS

    asyncio.run(work())
    assert app.get_run("c3").status == "needs_attention"
    rows = app.runtime.sync(Access(app.runtime.store).audit_log(actor="reader"), "audit")
    assert [(r.action, r.outcome) for r in rows] == [("run.resolve", "refused")] * 2


def test_a_workflow_named_like_an_operator_tool_is_refused(app: perdure.App) -> None:
    @app.workflow(name="perdure_stuck")
    def clash() -> None:
        return None

    with pytest.raises(ConfigError, match="perdure_stuck"):
        serve(app)
    PerdureMcp(app, workflow_tools(app.runtime.workflows))  # without --operator: served


def test_the_skill_file_ships_and_prints() -> None:
    """`perdure mcp --print-skill` prints the packaged SKILL.md (no app, no store), which
    names every operator tool."""
    printed = CliRunner().invoke(cli, ["mcp", "--print-skill"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == skill()
    assert printed.output.startswith("---\nname: perdure-operator\n")
    for name in OPERATOR_TOOLS:
        assert f"`{name}`" in printed.output
