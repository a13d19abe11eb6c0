"""PerdureAgent, continued: deferred tools wait at perdure gates, budgets are reserved before
every model request, a real MCP server's tool calls are steps, declared effects are
enforced when asked, and a renamed agent is a non-determinism error where it diverges."""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))
pytest.importorskip("mcp", reason=needs("mcp"))

from gate_checks import assert_decided_once
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.toolsets.external import TOOL_SCHEMA_VALIDATOR
from pydantic_ai.usage import RequestUsage

import perdure
from crash_steps import crash_after, crash_and_recover
from perdure.agent import budgets
from perdure.agent.budget_sql import Budget
from perdure.errors import ConfigError
from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool
from perdure.server import operations
from perdure.server.access import local_operator
from perdure.testing import TestClock, TestWorker

NAME = "pydantic_ai:shop"
FIXTURE = str(Path(__file__).parent.parent / "agent" / "mcp_server_fixture.py")


class Calls:
    """A FunctionModel script: the given tool calls one turn each, then the last result."""

    def __init__(self, *calls: tuple[str, dict[str, Any]], used: int = 0) -> None:
        self.calls = list(calls)
        self.requests = 0
        self.used = used  # output tokens the first response reports (0: pydantic-ai's guess)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if p.part_kind in ("tool-return", "retry-prompt")]  # fmt: skip
        if len(returns) < len(self.calls):
            tool, args = self.calls[len(returns)]
            usage = RequestUsage(input_tokens=10, output_tokens=self.used) if self.used else None
            return ModelResponse(
                parts=[ToolCallPart(tool, args, f"c{len(returns) + 1}")],
                **({"usage": usage} if usage else {}),
            )
        last = returns[-1].content if returns else "nothing"
        return ModelResponse(parts=[TextPart(f"done: {last}")])


def refund_agent(script: Calls, refunds: list[str]) -> Agent[Any, str]:
    agent = Agent(FunctionModel(script), name="shop")

    @agent.tool_plain(requires_approval=True)
    @perdure_tool(effect="keyed")
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    return agent


@pytest.mark.parametrize("approve", [True, False])
def test_a_tool_that_requires_approval_waits_at_a_gate_answered_once(
    app: perdure.App, clock: TestClock, worker: TestWorker, approve: bool
) -> None:
    """`requires_approval=True`: the run waits at a gate listing the call; the audited
    answer lets it go on (approved: the tool runs once; denied: the model reads why), and a
    second answer finds no gate."""
    script, refunds = Calls(("issue_refund", {"order": "42"})), []
    durable = PerdureAgent(refund_agent(script, refunds), app)
    handle = durable.start("refund 42", run_id="p-gate")
    worker.run_until_idle()
    assert handle.status() == "waiting" and refunds == []
    gates = app.runtime.sync(operations.pending_gates(app), "gates")
    assert [(g.kind, g.call_id, g.tool, g.arguments) for g in gates] == [
        ("approval", "c1", "issue_refund", {"order": "42"})
    ]
    clock.advance(5 * 86400)  # a person answers days later
    who = local_operator()
    app.runtime.sync(operations.decide(app, who, "p-gate", "c1", approve, "not this one"), "decide")
    worker.run_until_idle()
    output = durable.result(handle).output
    assert output == ("done: refunded 42" if approve else "done: not this one")
    assert refunds == (["42"] if approve else [])
    assert script.requests == 2
    assert_decided_once(app, who, "p-gate", "c1", approve)


def test_an_approval_survives_a_crash_after_it_was_given(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A crash in the approved tool: recovery replays the decision from the journal (no new
    gate), reruns the keyed refund with its key and finishes."""
    script, refunds = Calls(("issue_refund", {"order": "42"})), []
    durable = PerdureAgent(refund_agent(script, refunds), app)
    handle = durable.start("refund 42", run_id="p-gate-crash")
    worker.run_until_idle()
    app.send_event("p-gate-crash", "approve:c1", {"approve": True})
    crash_and_recover(app, clock, f"{NAME}.tool.issue_refund")
    assert durable.result(handle).output == "done: refunded 42"
    assert refunds == ["42"] and script.requests == 2


def test_a_steer_sent_at_a_gate_survives_a_crash_and_is_in_the_next_request_once(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Steered at the gate, then a crash in the approved tool: after recovery the next
    model request carries the message once, as user content."""
    seen: list[list[ModelMessage]] = []
    calls = Calls(("issue_refund", {"order": "42"}))

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return calls(messages, info)

    agent = Agent(FunctionModel(script), name="shop")

    @agent.tool_plain(requires_approval=True)
    @perdure_tool(effect="keyed")
    def issue_refund(order: str) -> str:
        return f"refunded {order}"

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund 42", run_id="p-steer")
    worker.run_until_idle()
    app.runtime.sync(app.client.steer("p-steer", "refund to the card"), "steer")
    app.send_event("p-steer", "approve:c1", {"approve": True})
    crash_and_recover(app, clock, f"{NAME}.tool.issue_refund")
    assert durable.result(handle).output == "done: refunded 42"
    carried = [
        sum("refund to the card" in str(p.content) for m in messages for p in m.parts
            if p.part_kind == "user-prompt")
        for messages in seen
    ]  # fmt: skip
    assert carried == [0, 1]


def test_a_deferred_question_is_answered_at_a_gate(app: perdure.App, worker: TestWorker) -> None:
    """A tool raising CallDeferred(kind='question') waits for a person's answer, which the
    model then reads as the tool's result."""
    agent = Agent(FunctionModel(Calls(("ask_customer", {"question": "which order?"}))),
                  name="shop")  # fmt: skip

    @agent.tool_plain
    @perdure_tool(effect="read")
    def ask_customer(question: str) -> str:
        raise CallDeferred(kind="question")

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund", run_id="p-ask")
    worker.run_until_idle()
    gates = app.runtime.sync(operations.pending_gates(app), "gates")
    assert [(g.kind, g.tool) for g in gates] == [("question", "ask_customer")]
    app.runtime.sync(operations.answer(app, local_operator(), "p-ask", "c1", "order 42"), "answer")
    worker.run_until_idle()
    assert durable.result(handle).output == "done: order 42"


def test_a_spent_budget_parks_the_run_before_the_request_and_a_raise_wakes_it(
    app: perdure.App, worker: TestWorker
) -> None:
    """The first request used 5000 tokens: the second's worst case does not fit the hourly
    budget, it is not made and the run waits for budget; raising it (as `perdure budget`
    does) wakes it to finish."""
    script = Calls(("lookup_order", {"order": "42"}), used=5000)
    agent = Agent(FunctionModel(script), name="shop")

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> str:
        return "shipped"

    durable = PerdureAgent(agent, app, budget={"tokens_per_hour": 6000})
    handle = durable.start("where is 42?", run_id="p-budget")
    worker.run_until_idle()
    assert handle.status() == "waiting" and script.requests == 1
    assert app.get_run("p-budget").waiting_for == f"event:{budgets.BUDGET_EVENT}"
    described = app.runtime.sync(budgets.describe(app.runtime, NAME), "budget")
    assert described["parked"] == 1 and described["in_force"]["tokens_per_hour"]["limit"] == 6000
    raised = Budget(NAME, tokens_per_hour=10**6)
    assert app.runtime.sync(budgets.set_budget(app.runtime, NAME, raised), "budget") == 1
    worker.run_until_idle()
    assert durable.result(handle).output == "done: shipped" and script.requests == 2


def test_a_run_over_its_own_limit_fails_in_one_line(app: perdure.App, worker: TestWorker) -> None:
    """max_tokens per run: a request whose worst case is over it is not made; the run fails."""
    script = Calls()
    durable = PerdureAgent(Agent(FunctionModel(script), name="shop"), app, max_tokens=100)
    handle = durable.start("hi")
    worker.run_until_idle()
    run = app.get_run(handle.id)
    message = json.loads(run.error or "{}")["message"]
    assert run.status == "failed" and script.requests == 0
    assert "run limit" in message and "\n" not in message, message


class StdioMCP(AbstractToolset[Any]):
    """A leaf toolset on a real MCP server subprocess (the `mcp` SDK's stdio client): what
    pydantic-ai's MCPToolset does, without its fastmcp dependency."""

    def __init__(self, toolset_id: str) -> None:
        self._id = toolset_id
        self._stack: AsyncExitStack | None = None
        self.session: ClientSession | None = None

    @property
    def id(self) -> str | None:
        return self._id

    async def __aenter__(self) -> StdioMCP:
        self._stack = AsyncExitStack()
        params = StdioServerParameters(command=sys.executable, args=[FIXTURE])
        read, write = await self._stack.enter_async_context(stdio_client(params))
        self.session = await self._stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        assert self._stack is not None
        await self._stack.aclose()
        return None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        assert self.session is not None
        listed = await self.session.list_tools()
        return {
            t.name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=t.name, parameters_json_schema=t.inputSchema, description=t.description
                ),
                max_retries=1,
                args_validator=TOOL_SCHEMA_VALIDATOR,
            )
            for t in listed.tools
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        assert self.session is not None
        result = await self.session.call_tool(name, tool_args)
        return "".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.slow  # an MCP server subprocess cut off by the crash, then another
def test_an_mcp_servers_tool_calls_are_steps_with_the_toolsets_effect(
    app: perdure.App, clock: TestClock, tmp_path: Path
) -> None:
    """Calls to a real MCP server subprocess are steps: `add` (read, per tool) and `touch`
    (once, the toolset's effect); a crash in `touch` parks the run without touching."""
    target = tmp_path / "touched.txt"
    script = Calls(("add", {"a": 2, "b": 3}), ("touch", {"path": str(target)}))
    agent = Agent(FunctionModel(script), name="shop", toolsets=[StdioMCP("fixture")])
    durable = PerdureAgent(
        agent, app, tool_effects={"add": "read"}, toolset_effects={"fixture": "once"},
        require_effects=True,
    )  # fmt: skip
    handle = durable.start("add then touch", run_id="p-mcp")
    crash_and_recover(app, clock, f"{NAME}.tool.touch")
    assert handle.status() == "needs_attention" and not target.exists(), app.get_run(handle.id)
    assert app.runtime.steps[f"{NAME}.tool.add"].effect == "read"
    assert app.runtime.steps[f"{NAME}.tool.touch"].effect == "once"
    app.resolve("p-mcp", 3, value={"value": "touched by hand"})
    TestWorker(app).run_until_idle()
    assert durable.result(handle).output == "done: touched by hand"
    done = [(e.position, e.name) for e in app.journal("p-mcp") if e.kind == "step.outcome"]
    assert [n for _, n in sorted(done)] == [
        f"{NAME}.model", f"{NAME}.tool.add", f"{NAME}.model", f"{NAME}.tool.touch",
        f"{NAME}.model",
    ]  # fmt: skip


def test_require_effects_refuses_an_undeclared_tool_or_toolset_in_one_line(
    app: perdure.App,
) -> None:
    """With require_effects=True a tool, or an MCP toolset, declared nowhere is refused
    when the agent is wrapped, in one line naming it and the fix."""
    agent = Agent(FunctionModel(Calls()), name="shop")

    @agent.tool_plain
    def send_email(to: str) -> str:
        return "sent"

    with pytest.raises(ConfigError) as caught:
        PerdureAgent(agent, app, require_effects=True)
    message = str(caught.value)
    assert "tool 'send_email' declares no effect" in message and "\n" not in message
    assert not [n for n in app.runtime.steps if n.startswith(NAME)]  # refused: nothing registered
    PerdureAgent(agent, app, require_effects=True, tool_effects={"send_email": "once"})

    mcp_agent = Agent(FunctionModel(Calls()), name="mcp", toolsets=[StdioMCP("fx")])
    with pytest.raises(ConfigError, match=r"toolset .* declares no effect"):
        PerdureAgent(mcp_agent, app, require_effects=True)


def test_a_renamed_agent_is_a_non_determinism_error_at_its_first_step(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Inside one's own workflow, the agent renamed in new code stops the replay at the
    first model step the journal holds under the old name."""
    script = Calls(("lookup_order", {"order": "42"}))

    def make(name: str, target: perdure.App) -> PerdureAgent:
        agent = Agent(FunctionModel(script), name=name)

        @agent.tool_plain
        @perdure_tool(effect="keyed")
        def lookup_order(order: str) -> str:
            return "shipped"

        return PerdureAgent(agent, target)

    durable = make("shop", app)

    @app.workflow(name="support")
    async def support() -> str:
        return str((await durable.run("where?")).output)

    handle = app.start(support)
    dead = crash_after(app, f"{NAME}.tool.lookup_order")

    fresh = perdure.App(app.url, clock=clock)
    try:
        renamed = make("helpdesk", fresh)

        @fresh.workflow(name="support")
        async def support2() -> str:
            return str((await renamed.run("where?")).output)

        clock.advance(dead.lease + 1)
        TestWorker(fresh).run_until_idle()
        run = fresh.get_run(handle.id)
    finally:
        fresh.close()
    error = run.error or ""
    # a deploy never fails the run (issue 36): it waits for a worker of its code version
    assert run.status == "needs_attention" and '"cause": "version"' in error, run
    assert "position 0" in error and "pydantic_ai:helpdesk.model" in error, error
    assert f"{NAME}.model" in error, error
