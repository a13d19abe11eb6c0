"""PerdureDurability with pydantic-ai's own `MCPToolset` (which needs the fastmcp client:
fastmcp-slim[client] 3.4 on mcp 1.x, the `mcp` extra's pin, or 4.x on mcp 2.x): a real MCP
server's tool list and tool calls are steps, each tool with its own effect, and a crash
inside a `once` tool parks the run without calling it again; in process and as a separate
stdio server process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))
pytest.importorskip("fastmcp", reason=needs("pydantic-ai"))  # MCPToolset: fastmcp-slim[client]

from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import perdure
from crash_steps import crash_after, recover
from perdure.integrations.pydantic_durability import PerdureDurability
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from process_stops import stop_processes

try:  # the MCP SDK's in-process server: MCPServer on 2.x, FastMCP on 1.x
    from mcp.server.mcpserver import MCPServer as SdkServer
except ImportError:  # pragma: no cover
    from mcp.server.fastmcp import FastMCP as SdkServer

MCP = "shop__mcp_server__fixture"
FIXTURE = str(Path(__file__).parent.parent / "agent" / "mcp_server_fixture.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
SERVED = '''
import perdure

app = perdure.App()


@app.workflow(name="double")
def double(x: int) -> int:
    """Double an integer."""
    return 2 * x
'''


def fixture_server(touched: list[str]) -> Any:
    """An MCP server with `add` (pure) and `touch` (a side effect the test counts)."""
    server = SdkServer("fixture")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def touch(path: str) -> str:
        """Create a file."""
        touched.append(path)
        Path(path).write_text("touched")
        return f"touched {path}"

    return server


class Calls:
    """A FunctionModel script: each given tool call one turn, then the last result."""

    def __init__(self, *calls: tuple[str, dict[str, Any]]) -> None:
        self.calls, self.requests = list(calls), 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if p.part_kind == "tool-return"]  # fmt: skip
        if len(returns) < len(self.calls):
            tool, args = self.calls[len(returns)]
            return ModelResponse(parts=[ToolCallPart(tool, args, f"c{len(returns) + 1}")])
        return ModelResponse(parts=[TextPart(f"done: {returns[-1].content}")])


def start_shop(app: perdure.App, model: Any, durability: PerdureDurability, toolset: Any,
               prompt: str) -> perdure.RunHandle:  # fmt: skip
    """The agent `shop` (FunctionModel `model`, `durability`, `toolset`) as the workflow
    `shop`, started on `prompt`."""
    agent = Agent(FunctionModel(model), name="shop", toolsets=[toolset],
                  capabilities=[durability])  # fmt: skip

    @app.workflow(name="shop")
    async def shop(prompt: str) -> str:
        return (await agent.run(prompt)).output

    return app.start(shop, prompt)


def test_an_mcp_toolsets_calls_are_steps_and_a_crash_in_a_once_tool_parks(
    app: perdure.App, clock: TestClock, tmp_path: Path
) -> None:
    """`add` (read, per tool) and `touch` (once, the toolset's effect) are steps named per
    tool; the server's tool list is journaled; a crash inside `touch` parks the run in
    needs_attention without touching again, and the operator's value finishes it."""
    touched: list[str] = []
    target = str(tmp_path / "touched.txt")
    script = Calls(("add", {"a": 2, "b": 3}), ("touch", {"path": target}))
    durability = PerdureDurability(app, tool_effects={"add": "read"},
                                   toolset_effects={"fixture": "once"})  # fmt: skip
    toolset = MCPToolset(fixture_server(touched), id="fixture")
    handle = start_shop(app, script, durability, toolset, "add then touch")
    dead = crash_after(app, f"{MCP}.call_tool:touch")
    assert touched == [] and script.requests == 2
    recover(app, clock, dead)
    assert handle.status() == "needs_attention" and touched == []
    assert app.runtime.steps[f"{MCP}.call_tool:add"].effect == "read"
    assert app.runtime.steps[f"{MCP}.call_tool:touch"].effect == "once"
    assert app.runtime.steps[f"{MCP}.get_tools"].effect == "read"
    position = max(e.position or 0 for e in app.journal(handle.id)
                   if e.name == f"{MCP}.call_tool:touch")  # fmt: skip
    app.resolve(handle.id, position, value="touched by hand")
    TestWorker(app).run_until_idle()
    assert handle.result(5) == "done: touched by hand"
    assert touched == [] and script.requests == 3


def test_an_mcp_server_process_tools_are_journaled_and_not_called_again_on_replay(
    app: perdure.App, clock: TestClock, tmp_path: Path
) -> None:
    """MCPToolset on a stdio MCP server process (tests/agent/mcp_server_fixture.py): the
    calls of `add` and `touch` are journaled with the server's answers; a crash after the
    run's last model call is recovered by replay alone: the server process is not asked
    again (`touch` ran once), nor the model."""
    from fastmcp.client.transports import StdioTransport

    target = tmp_path / "touched.txt"
    script = Calls(("add", {"a": 2, "b": 3}), ("touch", {"path": str(target)}))
    durability = PerdureDurability(app, tool_effects={"add": "read"},
                                   toolset_effects={"fixture": "once"})  # fmt: skip
    server = StdioTransport(command=sys.executable, args=[FIXTURE])
    crashed: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if script.requests == 2 and not crashed:  # the worker dies in the third model call
            crashed.append(1)
            raise SimulatedCrash("killed in the model call after both tools ran")
        return script(messages, info)

    handle = start_shop(app, model, durability, MCPToolset(server, id="fixture"), "add then touch")
    dead = crash_after(app)
    assert target.read_text() == "touched" and script.requests == 2
    target.unlink()  # a `touch` asked again would create it again
    recover(app, clock, dead)
    assert handle.result(5) == f"done: touched {target}"
    assert not target.exists() and script.requests == 3
    outcomes = {e.name: e.data or "" for e in app.journal(handle.id) if e.kind == "step.outcome"}
    assert '"add"' in outcomes[f"{MCP}.get_tools"] and "touch" in outcomes[f"{MCP}.get_tools"]
    assert "5" in outcomes[f"{MCP}.call_tool:add"]
    assert f"touched {target}" in outcomes[f"{MCP}.call_tool:touch"]


@pytest.mark.slow  # a `perdure mcp` process and a `perdure worker` process
def test_mcptoolset_calls_perdures_own_mcp_server(app: perdure.App, tmp_path: Path) -> None:
    """pydantic-ai's MCPToolset on `perdure mcp` (stdio, a process of its own, on another
    store): the served workflow is a tool; the agent's call of it, a step of the agent's
    run, starts a durable run in the served store, which a `perdure worker` completes; its
    result is what the model reads, journaled in the agent's run."""
    from fastmcp.client.transports import StdioTransport

    (tmp_path / "served_app.py").write_text(SERVED)
    env = {"PERDURE_DB": f"sqlite:///{tmp_path}/served.db",
           "PYTHONPATH": os.pathsep.join([SRC, str(tmp_path)])}  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "served_app:app", "worker", "--poll", "0.05"],
        cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        mcp = ["-m", "perdure", "--app", "served_app:app", "mcp"]
        server = StdioTransport(command=sys.executable, args=mcp, cwd=str(tmp_path), env=env)
        script = Calls(("double", {"x": 21}))
        durability = PerdureDurability(app, toolset_effects={"perdure": "keyed"})
        handle = start_shop(app, script, durability, MCPToolset(server, id="perdure"), "double 21")
        TestWorker(app).run_until_idle()
        assert handle.result(5) == "done: 42" and script.requests == 2
    finally:
        stop_processes([worker], grace=10)
    name = "shop__mcp_server__perdure.call_tool:double"
    assert app.runtime.steps[name].effect == "keyed"
    called = [e for e in app.journal(handle.id) if e.kind == "step.outcome" and e.name == name]
    assert len(called) == 1 and "42" in (called[0].data or "")
    served = perdure.App(env["PERDURE_DB"])
    try:
        runs = served.list_runs()
        assert [(r.workflow, r.status) for r in runs] == [("double", "completed")]
    finally:
        served.close()
