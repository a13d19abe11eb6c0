"""`perdure mcp`: workflows and agents as MCP tools that run as MCP tasks (spec 2025-11-25),
driven by the official mcp SDK's client, in process and over stdio and Streamable HTTP,
including a server killed with SIGKILL between a task's submission and its result."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from extras_needed import needs
from live_workers import worker_task
from local_servers import free_port, wait_listening
from process_stops import stop_processes

pytest.importorskip("mcp", reason=needs("mcp"))

from mcp import ClientSession, StdioServerParameters
from mcp import types as t
from mcp.client.experimental.tasks import ExperimentalClientFeatures
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session

import perdure
from perdure.agent.loop import Agent
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.server.access import Principal, create_token
from perdure.server.access_sql import Access
from perdure.server.mcp import McpOptions, PerdureMcp, status_of, workflow_tools
from perdure.server.mcp.server import LOCAL_SCOPES, Requestor
from perdure.server.mcp.stateless import Rpc, Stateless
from perdure.store.base import RunRow

RELATED = "io.modelcontextprotocol/related-task"
TERMINAL = ("completed", "failed", "cancelled")
Elicit = Callable[[RequestContext[ClientSession, Any], t.ElicitRequestParams], Awaitable[Any]]


def register(app: perdure.App) -> None:
    """The workflows every in-process test serves."""

    @app.workflow(name="add")
    def add(a: int, b: int = 2) -> int:
        """Add two numbers.

        More text that is not the description."""
        return a + b

    @app.workflow(name="greet")
    async def greet(name: str, excited: bool = False) -> dict[str, Any]:
        return {"greeting": f"hello {name}" + ("!" if excited else ""), "length": len(name)}

    @app.workflow(name="explode")
    def explode(n: int) -> int:
        raise ValueError(f"bad input {n}")

    @app.workflow(name="hold")
    async def hold() -> str:
        return str(await perdure.wait_event("go"))

    @app.step(effect="read", name="narrate")
    def narrate(words: int) -> int:
        for i in range(words):
            perdure.stream.write(f"w{i} ")
            time.sleep(0.02)
        return words

    @app.workflow(name="talk")
    def talk(words: int) -> int:
        """Say `words` words into the run's stream."""
        return narrate(words)


@pytest.fixture
def mcp_app(tmp_path: Path) -> Any:
    application = perdure.App(f"sqlite:///{tmp_path}/mcp.db")  # real time: runs really wait
    register(application)
    yield application
    application.close()


def tasks(session: ClientSession) -> ExperimentalClientFeatures:
    """The SDK client's task methods (deprecated in mcp 1.x for 2.0, which moves them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return session.experimental


@asynccontextmanager
async def connected(
    app: perdure.App,
    *,
    options: McpOptions | None = None,
    elicit: Elicit | None = None,
    notes: list[t.TaskStatusNotificationParams] | None = None,
    worker: bool = True,
    **tool_options: Any,
) -> AsyncIterator[ClientSession]:
    """An SDK client session on the server for `app`, in memory; an in-process worker runs."""
    server = PerdureMcp(
        app,
        workflow_tools(app.runtime.workflows, **tool_options),
        options or McpOptions(poll=0.1),
    )

    async def on_message(message: Any) -> None:
        root = message.root if isinstance(message, t.ServerNotification) else None
        if notes is not None and isinstance(
            root, t.TaskStatusNotification | t.ProgressNotification
        ):
            notes.append(root.params)  # type: ignore[arg-type]

    async with AsyncExitStack() as stack:
        if worker:
            await stack.enter_async_context(worker_task(app, concurrency=4, poll=0.05))
        async with create_connected_server_and_client_session(
            server.server,
            elicitation_callback=elicit,  # type: ignore[arg-type]
            message_handler=on_message,
            client_info=t.Implementation(name="tester", version="1"),
        ) as session:
            yield session


async def until(
    session: ClientSession,
    task_id: str,
    done: Callable[[t.GetTaskResult], bool],
    within: float = 10,
) -> t.GetTaskResult:
    """Poll tasks/get until `done` holds (or fail after `within` seconds)."""
    deadline = time.monotonic() + within
    while True:
        task = await tasks(session).get_task(task_id)
        if done(task):
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task.status}: {task}"
        await asyncio.sleep(0.05)


# -- tools ---------------------------------------------------------------------------------


def test_tools_list_one_tool_per_workflow_with_schema_and_task_support(
    mcp_app: perdure.App, tmp_path: Path
) -> None:
    agent = make_agent(mcp_app, tmp_path, [])

    async def main() -> None:
        async with connected(mcp_app) as session:
            caps = session.get_server_capabilities()
            assert caps is not None and caps.tasks is not None
            assert caps.tasks.list is not None and caps.tasks.cancel is not None
            assert caps.tasks.requests is not None and caps.tasks.requests.tools is not None
            assert caps.tasks.requests.tools.call is not None
            listed = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert sorted(listed) == ["add", "agent_helper", "explode", "greet", "hold",
                                      "perdure_steer", "talk"]  # fmt: skip
            add = listed["add"]
            assert add.execution is not None and add.execution.taskSupport == "optional"
            assert add.description is not None and add.description.startswith("Add two numbers.")
            assert "More text" not in add.description
            assert add.inputSchema["properties"]["a"]["type"] == "integer"
            assert add.inputSchema["properties"]["b"]["default"] == 2
            assert add.inputSchema["required"] == ["a"]
            assert add.inputSchema["additionalProperties"] is False
            assert listed["greet"].inputSchema["properties"]["excited"]["type"] == "boolean"
            helper = listed["agent_helper"]
            assert helper.title == agent.name == "agent:helper"
            assert helper.inputSchema["required"] == ["prompt"]
            assert set(helper.inputSchema["properties"]) == {"prompt", "file"}
            assert all(tool.execution and tool.execution.taskSupport for tool in listed.values())
        async with connected(mcp_app, builtin=True, worker=False) as session:
            assert "perdure.plan" in {tool.name for tool in (await session.list_tools()).tools}

    asyncio.run(main())


# -- task-augmented calls --------------------------------------------------------------------


def test_a_task_call_returns_at_once_and_tasks_result_is_the_workflow_result(
    mcp_app: perdure.App,
) -> None:
    notes: list[t.TaskStatusNotificationParams] = []

    async def main() -> None:
        async with connected(mcp_app, notes=notes) as session:
            created = await tasks(session).call_tool_as_task("add", {"a": 40, "b": 2})
            task_id = created.task.taskId
            assert task_id.startswith("mcp:") and created.task.status == "working"
            assert created.task.pollInterval == 100
            assert (await mcp_app.client.get(task_id)).workflow == "add"  # the task IS the run
            done = await until(session, task_id, lambda x: x.status == "completed")
            assert done.createdAt <= done.lastUpdatedAt and done.ttl == 365 * 86_400_000
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is False and result.structuredContent == {"result": 42}
            assert [c.text for c in result.content if isinstance(c, t.TextContent)] == ["42"]
            assert result.meta is not None and result.meta[RELATED] == {"taskId": task_id}
            greeted = await tasks(session).call_tool_as_task("greet", {"name": "ana"})
            payload = await tasks(session).get_task_result(greeted.task.taskId, t.CallToolResult)
            assert payload.structuredContent == {"greeting": "hello ana", "length": 3}
            for _ in range(40):  # the watcher polls every 0.1 s
                if any(n.taskId == task_id and n.status == "completed" for n in notes):
                    break
                await asyncio.sleep(0.05)
            mine = [n for n in notes if n.taskId == task_id]
            assert mine and mine[-1].status == "completed"

    asyncio.run(main())


def test_a_plain_call_waits_for_the_result_but_only_so_long(mcp_app: perdure.App) -> None:
    async def main() -> None:
        async with connected(mcp_app, options=McpOptions(poll=0.1, call_wait=0.5)) as session:
            result = await session.call_tool("add", {"a": 1})
            assert result.isError is False and result.structuredContent == {"result": 3}
            pending = await session.call_tool("hold", {})
            assert pending.isError is True and pending.structuredContent is not None
            run_id = pending.structuredContent["run_id"]
            assert pending.structuredContent["status"] == "waiting"
            assert f"task {run_id}" in pending.content[0].text  # type: ignore[union-attr]
            # tasks/result blocks until the task ends, however long (no -32001 after a wait)
            pending_result = asyncio.create_task(
                tasks(session).get_task_result(run_id, t.CallToolResult)
            )
            for _ in range(20):  # 20 rounds of the server's 0.1 s polls: still blocked
                await asyncio.sleep(0.1)
                assert not pending_result.done()
            await mcp_app.client.send_event(run_id, "go", "now")
            later = await pending_result
            assert later.structuredContent == {"result": "now"}
            later = await tasks(session).get_task_result(run_id, t.CallToolResult)
            assert later.structuredContent == {"result": "now"}

    asyncio.run(main())


def test_bad_arguments_unknown_tools_and_unknown_tasks_are_refused(mcp_app: perdure.App) -> None:
    async def main() -> None:
        async with connected(mcp_app, worker=False) as session:
            with pytest.raises(McpError) as bad:
                await tasks(session).call_tool_as_task("add", {"a": "not a number"})
            assert (
                bad.value.error.code == t.INVALID_PARAMS and "argument a" in bad.value.error.message
            )
            plain = await session.call_tool("add", {"a": 1, "c": 1})
            assert plain.isError is True
            assert "argument 'c'" in plain.content[0].text  # type: ignore[union-attr]
            missing = await session.call_tool("add", {})
            assert "missing a required argument: 'a'" in missing.content[0].text  # type: ignore[union-attr]
            with pytest.raises(McpError) as unknown_tool:
                await tasks(session).call_tool_as_task("nope", {})
            assert unknown_tool.value.error.code == t.INVALID_PARAMS
            with pytest.raises(McpError) as unknown_task:
                await tasks(session).get_task("mcp:nope")
            assert unknown_task.value.error.code == t.INVALID_PARAMS
            assert "Task not found" in unknown_task.value.error.message
            assert await mcp_app.client.list_runs() == []  # nothing was started

    asyncio.run(main())


def test_tasks_list_pages_the_mcp_runs_newest_first(mcp_app: perdure.App) -> None:
    async def main() -> None:
        options = McpOptions(poll=0.1, page_size=2)
        async with connected(mcp_app, options=options, worker=False) as session:
            ids = []
            for a in range(3):
                ids.append((await tasks(session).call_tool_as_task("add", {"a": a})).task.taskId)
                await asyncio.sleep(0.01)  # distinct creation times
            await mcp_app.client.start("add", [7], run_id="not-from-mcp")
            first = await tasks(session).list_tasks()
            assert [x.taskId for x in first.tasks] == [ids[2], ids[1]]
            assert first.nextCursor is not None
            second = await tasks(session).list_tasks(first.nextCursor)
            assert [x.taskId for x in second.tasks] == [ids[0]] and second.nextCursor is None
            assert {x.status for x in first.tasks + second.tasks} == {"working"}
            with pytest.raises(McpError) as bad:
                await tasks(session).list_tasks("not-a-cursor")
            assert bad.value.error.code == t.INVALID_PARAMS
            # what tasks/get answers, tasks/list lists: a run started elsewhere is neither
            other = "not-from-mcp"
            for ask in (
                tasks(session).get_task(other),
                tasks(session).cancel_task(other),
                tasks(session).get_task_result(other, t.CallToolResult),
            ):
                with pytest.raises(McpError, match="Task not found: not-from-mcp"):
                    await ask
            listed = {x.taskId for x in first.tasks + second.tasks}
            for task_id in ids:
                assert (await tasks(session).get_task(task_id)).taskId in listed
            assert (await mcp_app.client.get("not-from-mcp")).status == "pending"

    asyncio.run(main())


def test_tasks_cancel_cancels_the_run(mcp_app: perdure.App) -> None:
    async def main() -> None:
        async with connected(mcp_app) as session:
            task_id = (await tasks(session).call_tool_as_task("hold", {})).task.taskId
            waiting = await until(session, task_id, lambda x: "event:go" in (x.statusMessage or ""))
            assert waiting.status == "working"
            cancelled = await tasks(session).cancel_task(task_id)
            assert cancelled.taskId == task_id and cancelled.status == "cancelled"
            assert (await mcp_app.client.get(task_id)).status == "cancelled"
            assert (await tasks(session).get_task(task_id)).status == "cancelled"
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is True and result.structuredContent == {
                "run_id": task_id, "status": "cancelled"}  # fmt: skip
            with pytest.raises(McpError) as again:
                await tasks(session).cancel_task(task_id)
            assert again.value.error.code == t.INVALID_PARAMS

    asyncio.run(main())


def test_mcp_starts_cancels_and_refusals_are_audited(mcp_app: perdure.App) -> None:
    """A tools/call and a tasks/cancel are recorded `ok` as the client (`mcp:tester`); an
    unknown tool, bad arguments, cancelling a finished task and an unknown one are recorded
    as refused, with the reason."""

    async def main() -> None:
        async with connected(mcp_app) as session:
            task_id = (await tasks(session).call_tool_as_task("hold", {})).task.taskId
            await until(session, task_id, lambda x: "event:go" in (x.statusMessage or ""))
            await tasks(session).cancel_task(task_id)
            for refused in (
                tasks(session).cancel_task(task_id),
                tasks(session).cancel_task("mcp:nope"),
                tasks(session).call_tool_as_task("nope", {}),
                tasks(session).call_tool_as_task("add", {"a": "not a number"}),
            ):
                with pytest.raises(McpError):
                    await refused
            assert (await session.call_tool("add", {})).isError is True
            log = list(reversed(await Access(mcp_app.runtime.store).audit_log()))
            rows = [(r.actor, r.action, r.target, r.outcome) for r in log]
            assert rows[:4] == [
                ("mcp:tester", "run.start", f"run:{task_id}", "ok"),
                ("mcp:tester", "run.cancel", f"run:{task_id}", "ok"),
                ("mcp:tester", "run.cancel", f"run:{task_id}", "refused"),
                ("mcp:tester", "run.cancel", "run:mcp:nope", "refused"),
            ]
            assert [(r.action, r.outcome, json.loads(r.detail)["workflow"]) for r in log[4:]] == [
                ("run.start", "refused", "nope"), ("run.start", "refused", "add"),
                ("run.start", "refused", "add"),
            ]  # fmt: skip
            assert "already ended (cancelled)" in log[2].reason
            assert log[3].reason == "Task not found: mcp:nope"
            assert log[4].reason == "unknown tool 'nope'" and "argument a" in log[5].reason

    asyncio.run(main())


def test_a_failing_workflow_is_a_failed_task_with_its_error(mcp_app: perdure.App) -> None:
    async def main() -> None:
        async with connected(mcp_app) as session:
            task_id = (await tasks(session).call_tool_as_task("explode", {"n": 7})).task.taskId
            failed = await until(session, task_id, lambda x: x.status in TERMINAL)
            assert failed.status == "failed"
            assert failed.statusMessage == "ValueError: bad input 7"
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is True
            assert "bad input 7" in result.content[0].text  # type: ignore[union-attr]
            assert result.structuredContent is not None
            assert result.structuredContent["error"] == {
                "type": "ValueError",
                "message": "bad input 7",
            }

    asyncio.run(main())


def test_status_mapping_covers_every_run_status() -> None:
    """Parked, paused and operator-bound runs stay `working` (not terminal in perdure) with
    a message that says what is going on; only the three final statuses are terminal."""

    def run(status: str, **fields: Any) -> RunRow:
        return RunRow(id="r", workflow="w", status=status, input="{}", **fields)

    expected = {
        "pending": ("working", "pending: waiting for a worker"),
        "running": ("working", "running"),
        "cancelling": ("working", "cancelling: it stops at its next step"),
        "paused": ("working", "paused by an operator; it goes on when resumed"),
        "completed": ("completed", None),
        "cancelled": ("cancelled", "cancelled"),
    }
    for status, mapped in expected.items():
        assert status_of(run(status), None) == mapped, status
    assert status_of(run("waiting", waiting_for="event:go"), None) == (
        "working", "waiting for event:go")  # fmt: skip
    assert status_of(run("sleeping", wake_at=0.0), None)[0] == "working"
    attention = status_of(run("needs_attention"), None)
    assert attention[0] == "working" and "perdure resolve r" in (attention[1] or "")
    probed = json.dumps({"message": "probe find: cannot tell (provider down)", "cause": "probe"})
    asked = status_of(run("needs_attention", error=probed), None)[1] or ""
    assert "probe find: cannot tell (provider down)" in asked and asked.endswith("| --probe)")
    dead = status_of(run("dead"), None)
    assert dead[0] == "working" and "perdure resume r" in (dead[1] or "")
    failed = status_of(run("failed", error=json.dumps({"type": "KeyError", "message": "x"})), None)
    assert failed == ("failed", "KeyError: x")


# -- gates: input_required and elicitation -----------------------------------------------------

AGENT_SPEC = """
name = "helper"
goal = "Pick a colour and write it down"
instructions = "Ask, then write."

[models.fast]
provider = "scripted"
{script}

[tools]
grant = ["ask_human", "write_file", "finish"]
approval = ["write_file"]
write_paths = ["out"]
"""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def gated_script(folder: Path) -> list[Any]:
    """Ask a question, then write the answer to a file (approval required), then answer."""
    target = folder / "out" / "colour.txt"
    return [
        call("ask_human", question="Which colour?"),
        call("write_file", path=str(target), content="blue"),
        "wrote blue",
    ]


def make_agent(app: perdure.App, folder: Path, replies: list[Any]) -> Agent:
    path = folder / "agent.toml"
    path.write_text(AGENT_SPEC.format(script=""))
    return Agent(app.runtime, load_spec(path), providers={"fast": ScriptedModel(replies)})


def test_a_gate_is_input_required_and_answered_through_elicitation(
    mcp_app: perdure.App, tmp_path: Path
) -> None:
    agent = make_agent(mcp_app, tmp_path, gated_script(tmp_path))
    asked: list[t.ElicitRequestFormParams] = []

    async def elicit(ctx: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestFormParams)
        asked.append(params)
        if "answer" in params.requestedSchema["properties"]:
            return t.ElicitResult(action="accept", content={"answer": "blue"})
        return t.ElicitResult(action="accept", content={"approve": True, "comment": "fine"})

    async def main() -> None:
        async with connected(mcp_app) as session:  # a client that cannot answer: it looks
            created = await tasks(session).call_tool_as_task("agent_helper", {"prompt": "pick"})
            task_id = created.task.taskId
            gated = await until(session, task_id, lambda x: x.status != "working")
            assert gated.status == "input_required" and gated.statusMessage == "Which colour?"
        async with connected(mcp_app, elicit=elicit) as session:
            # the gate is put to the client on the session's stream once the watcher sees it
            # (for clients that only poll), or on tasks/result's stream, once either way
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is False and result.structuredContent is not None
            assert result.structuredContent["status"] == "done"
            assert result.structuredContent["answer"] == "wrote blue"
            assert len(asked) == 2 and asked[0].message == "Which colour?"  # each gate once
            assert asked[1].message.startswith("Approve the call write_file(")
            assert "colour.txt" in asked[1].message
            assert all((p.model_dump(by_alias=True)["_meta"] or {}).get(RELATED)
                       == {"taskId": task_id} for p in asked)  # fmt: skip
            audit = await Access(mcp_app.runtime.store).audit_log(target=f"run:{task_id}")
            actions = {(r.action, r.actor) for r in audit}
            assert {("gate.answer", "mcp:tester"), ("gate.approve", "mcp:tester"),
                    ("run.start", "mcp:tester")} <= actions  # fmt: skip

    asyncio.run(main())
    assert (tmp_path / "out" / "colour.txt").read_text() == "blue"
    model = agent.providers["fast"]
    assert isinstance(model, ScriptedModel)
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["blue"]


def test_a_client_steers_an_agent_task_with_perdure_steer(
    mcp_app: perdure.App, tmp_path: Path
) -> None:
    """`perdure_steer` is listed where an agent is served (not elsewhere); called on a task
    waiting at a question, its message is in the agent's next request once and audited
    with the client's name; a steer to the finished task is a tool error saying why."""
    agent = make_agent(mcp_app, tmp_path, [call("ask_human", question="Which colour?"), "red"])
    model = agent.providers["fast"]
    assert isinstance(model, ScriptedModel)

    async def main() -> None:
        async with connected(mcp_app, only=["add"]) as session:
            assert "perdure_steer" not in {x.name for x in (await session.list_tools()).tools}
        async with connected(mcp_app) as session:
            listed = {x.name: x for x in (await session.list_tools()).tools}
            assert listed["perdure_steer"].execution is not None
            assert listed["perdure_steer"].execution.taskSupport == "forbidden"
            created = await tasks(session).call_tool_as_task("agent_helper", {"prompt": "pick"})
            task_id = created.task.taskId
            await until(session, task_id, lambda x: x.status == "input_required")
            steered = await session.call_tool(
                "perdure_steer", {"run_id": task_id, "text": "prefer warm colours"}
            )
            assert steered.isError is False and steered.structuredContent is not None
            assert steered.structuredContent["run_id"] == task_id
            call_id = model.script[0].message.tool_calls[0].id
            await mcp_app.client.send_event(task_id, f"human:{call_id}", "any")
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.structuredContent is not None
            assert result.structuredContent["answer"] == "red"
            late = await session.call_tool("perdure_steer", {"run_id": task_id, "text": "x"})
            assert late.isError is True
            assert "finished run cannot be steered" in late.content[0].text  # type: ignore[union-attr]
            audit = await Access(mcp_app.runtime.store).audit_log(target=f"run:{task_id}")
            assert [(r.actor, r.outcome) for r in audit if r.action == "run.steer"] == [
                ("mcp:tester", "refused"),
                ("mcp:tester", "ok"),
            ]

    asyncio.run(main())
    carried = [sum("prefer warm colours" in m.content for m in r.messages) for r in model.requests]
    assert carried == [0, 1]


def test_a_plain_call_puts_gates_to_the_client_too(mcp_app: perdure.App, tmp_path: Path) -> None:
    make_agent(mcp_app, tmp_path, gated_script(tmp_path))
    asked: list[dict[str, Any]] = []

    async def elicit(ctx: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestFormParams)
        asked.append(params.model_dump(by_alias=True))
        if "answer" in params.requestedSchema["properties"]:
            return t.ElicitResult(action="accept", content={"answer": "teal"})
        return t.ElicitResult(action="accept", content={"approve": True})

    async def main() -> None:
        async with connected(mcp_app, elicit=elicit) as session:
            result = await session.call_tool("agent_helper", {"prompt": "pick"})
            assert result.isError is False and result.structuredContent is not None
            assert result.structuredContent["status"] == "done"
            assert [a["message"] for a in asked][:1] == ["Which colour?"] and len(asked) == 2
            assert all(RELATED not in (a["_meta"] or {}) for a in asked)  # no task to relate to

    asyncio.run(main())
    assert (tmp_path / "out" / "colour.txt").read_text() == "blue"


def test_a_declined_approval_denies_the_call(mcp_app: perdure.App, tmp_path: Path) -> None:
    make_agent(mcp_app, tmp_path, gated_script(tmp_path))

    async def elicit(ctx: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        assert isinstance(params, t.ElicitRequestFormParams)
        if "answer" in params.requestedSchema["properties"]:
            return t.ElicitResult(action="accept", content={"answer": "red"})
        return t.ElicitResult(action="decline")

    async def main() -> None:
        async with connected(mcp_app, elicit=elicit) as session:
            task_id = (
                await tasks(session).call_tool_as_task("agent_helper", {"prompt": "pick"})
            ).task.taskId
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.structuredContent is not None
            assert result.structuredContent["status"] == "done"
            audit = await Access(mcp_app.runtime.store).audit_log(target=f"run:{task_id}")
            assert "gate.deny" in {r.action for r in audit}

    asyncio.run(main())
    assert not (tmp_path / "out" / "colour.txt").exists()


# -- real servers: stdio and Streamable HTTP, killed and restarted ----------------------------

APP_MODULE = '''
"""The app `perdure mcp` serves in the process tests (store from --db)."""
from datetime import timedelta

import perdure

app = perdure.App()


@app.step(effect="idempotent")
def double(x: int) -> int:
    return 2 * x


@app.workflow(name="slow_double")
async def slow_double(x: int, pause: float = 3.0) -> int:
    """Double x after a durable sleep."""
    first = await double(x)
    await perdure.sleep(timedelta(seconds=pause))  # parked in the store: no worker holds it
    return first + 1


@app.workflow(name="ask")
async def ask() -> str:
    """Wait for a person's answer at the gate human:colour."""
    return str(await perdure.wait_event("human:colour"))
'''


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, str]:
    """A folder holding `mcp_app.py`, and the store URL its servers and workers share."""
    (tmp_path / "mcp_app.py").write_text(APP_MODULE)
    return tmp_path, f"sqlite:///{tmp_path}/served.db"


def perdure_argv(db: str, *command: str) -> list[str]:
    return [sys.executable, "-m", "perdure", "--db", db, "--app", "mcp_app:app", *command]


async def close_quietly(stack: AsyncExitStack) -> None:
    """Leave a client whose server was killed (its streams end with errors)."""
    with contextlib.suppress(Exception):
        await stack.aclose()


async def stdio_session(
    stack: AsyncExitStack, folder: Path, db: str, pid_file: Path
) -> tuple[ClientSession, int]:
    """`perdure mcp --worker` over stdio, started by the SDK client; its pid (`exec` keeps it)."""
    pid_file.unlink(missing_ok=True)
    command = " ".join(f"'{part}'" for part in perdure_argv(db, "mcp", "--worker"))
    params = StdioServerParameters(
        command="/bin/sh",
        args=["-c", f"echo $$ > '{pid_file}'; exec {command}"],
        cwd=str(folder),
        env=dict(os.environ),
    )
    log = stack.enter_context((folder / "stdio-server.log").open("a"))
    read, write = await stack.enter_async_context(stdio_client(params, errlog=log))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session, int(pid_file.read_text())


def wait_dead(pid: int, within: float = 10) -> None:
    """Until the process is gone or a zombie (its parent, the SDK client, reaps it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs")


@pytest.mark.slow
def test_stdio_server_killed_between_submit_and_result(served: tuple[Path, str]) -> None:
    """kill -9 the stdio server (and its in-process worker) while the task sleeps; a new
    server on the same store answers tasks/get and tasks/result for it."""
    folder, db = served
    pid_file = folder / "server.pid"
    observer = perdure.App(db)

    async def main() -> None:
        first = AsyncExitStack()
        session, pid = await stdio_session(first, folder, db, pid_file)
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {"slow_double", "ask"}
        assert tools["slow_double"].inputSchema["properties"]["pause"]["default"] == 3.0
        task_id = (
            await tasks(session).call_tool_as_task("slow_double", {"x": 21, "pause": 3})
        ).task.taskId
        sleeping = await until(session, task_id, lambda x: "sleeping" in (x.statusMessage or ""))
        assert sleeping.status == "working"
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid)
        with pytest.raises(McpError):
            await tasks(session).get_task(task_id)  # that server is gone
        await close_quietly(first)
        assert (await observer.client.get(task_id)).status == "sleeping"  # not finished

        async with AsyncExitStack() as second:
            session, new_pid = await stdio_session(second, folder, db, pid_file)
            assert new_pid != pid
            task = await tasks(session).get_task(task_id)
            assert task.taskId == task_id and task.status in ("working", "completed")
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is False and result.structuredContent == {"result": 43}
            listed = await tasks(session).list_tasks()
            assert [x.taskId for x in listed.tasks] == [task_id]
            assert listed.tasks[0].status == "completed"

    try:
        asyncio.run(main())
    finally:
        observer.close()


def start(folder: Path, argv: list[str], log: str) -> subprocess.Popen[bytes]:
    with (folder / log).open("ab") as out:
        return subprocess.Popen(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT)


async def http_session(
    stack: AsyncExitStack, url: str, token: str, elicit: Elicit
) -> ClientSession:
    client = await stack.enter_async_context(
        httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(30, read=300)
        )
    )
    read, write, _ = await stack.enter_async_context(
        streamable_http_client(url, http_client=client, terminate_on_close=False)
    )
    session = await stack.enter_async_context(
        ClientSession(read, write, elicitation_callback=elicit)  # type: ignore[arg-type]
    )
    await session.initialize()
    return session


@pytest.mark.slow
def test_http_needs_a_token_answers_gates_and_survives_a_killed_server(
    served: tuple[Path, str],
) -> None:
    """Streamable HTTP: 401 without a valid bearer token; a read token's tools/call refused
    (and audited as refused); a task is bound to the token that created it (another token,
    even one of the same name, neither lists, reads nor cancels it); a gate answered through the
    client's elicitation (on the tasks/result stream); then the server is killed with
    SIGKILL right after a submission and a new one returns the result (a separate
    `perdure worker` runs the workflows)."""
    folder, db = served
    admin = perdure.App(db)
    token = admin.runtime.sync(create_token(admin, "mcp-client", ["operate", "approve"]), "token")[
        1
    ]
    reader = admin.runtime.sync(create_token(admin, "reader", ["read"]), "token")[1]
    other = admin.runtime.sync(create_token(admin, "mcp-client", ["operate", "approve"]), "token")[
        1
    ]
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    worker = start(folder, perdure_argv(db, "worker", "--poll", "0.1"), "worker.log")
    server = start(folder, perdure_argv(db, "mcp", "--http", "--port", str(port)), "http.log")
    asked: list[str] = []

    async def elicit(ctx: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        asked.append(params.message)
        return t.ElicitResult(action="accept", content={"answer": "green"})

    async def main() -> None:
        nonlocal server
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": t.LATEST_PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient() as raw:
            bare = await raw.post(url, json=body, headers=accept)
            assert bare.status_code == 401
            assert bare.headers["www-authenticate"].lower().startswith("bearer")
            wrong = await raw.post(
                url, json=body, headers={**accept, "Authorization": "Bearer pdr_x"}
            )
            assert wrong.status_code == 401
            good = await raw.post(
                url, json=body, headers={**accept, "Authorization": f"Bearer {token}"}
            )
            assert good.status_code == 200

        async with AsyncExitStack() as stack:  # a read-only token may look but not start runs
            session = await http_session(stack, url, reader, elicit)
            assert {tool.name for tool in (await session.list_tools()).tools} == {
                "slow_double",
                "ask",
            }
            with pytest.raises(McpError) as refused:
                await tasks(session).call_tool_as_task("ask", {})
            assert "operate" in refused.value.error.message
            [audited] = await Access(admin.runtime.store).audit_log(
                actor="reader"
            )  # refused, and recorded
            assert (audited.action, audited.outcome) == ("run.start", "refused")
            assert "'operate' scope" in audited.reason

        async with AsyncExitStack() as stack:
            session = await http_session(stack, url, token, elicit)
            gated = (await tasks(session).call_tool_as_task("ask", {})).task.taskId
            waiting = await until(session, gated, lambda x: x.status == "input_required", 20)
            assert waiting.statusMessage == f"Run {gated} asks for an answer."
            result = await tasks(session).get_task_result(gated, t.CallToolResult)
            assert result.structuredContent == {"result": "green"}
            assert asked == [f"Run {gated} asks for an answer."]
            audit = await Access(admin.runtime.store).audit_log(target=f"run:{gated}")
            assert ("gate.answer", "mcp-client") in {(r.action, r.actor) for r in audit}

        first = AsyncExitStack()
        session = await http_session(first, url, token, elicit)
        task_id = (
            await tasks(session).call_tool_as_task("slow_double", {"x": 5, "pause": 1})
        ).task.taskId
        server.kill()  # SIGKILL, right after the submission
        server.wait()
        await close_quietly(first)
        server = start(folder, perdure_argv(db, "mcp", "--http", "--port", str(port)), "http.log")
        wait_listening(port, server)
        async with AsyncExitStack() as stack:
            session = await http_session(stack, url, token, elicit)
            task = await tasks(session).get_task(task_id)
            assert task.taskId == task_id and task.status in ("working", "completed")
            result = await tasks(session).get_task_result(task_id, t.CallToolResult)
            assert result.isError is False and result.structuredContent == {"result": 11}
            assert {x.taskId for x in (await tasks(session).list_tasks()).tasks} == {gated, task_id}

        async with AsyncExitStack() as stack:  # another token, even of the same name
            session = await http_session(stack, url, other, elicit)
            assert (await tasks(session).list_tasks()).tasks == []
            for ask in (
                tasks(session).get_task(task_id),
                tasks(session).get_task_result(task_id, t.CallToolResult),
                tasks(session).cancel_task(gated),
            ):
                with pytest.raises(McpError, match="Task not found"):
                    await ask
            mine = (await tasks(session).call_tool_as_task("slow_double", {"x": 1})).task.taskId
            assert [x.taskId for x in (await tasks(session).list_tasks()).tasks] == [mine]
        assert (await admin.client.get(gated)).status == "completed"  # the other token: no cancel

    try:
        wait_listening(port, server)
        asyncio.run(main())
    finally:
        stop_processes([server, worker], grace=20)
        admin.close()


def test_a_task_call_with_a_progress_token_gets_the_runs_stream_as_progress(
    mcp_app: perdure.App,
) -> None:
    """A task-augmented call whose _meta has a progressToken gets notifications/progress for
    the task's lifetime: an increasing count of stream chunks, each with the new text."""
    notes: list[Any] = []

    async def main() -> None:
        async with connected(mcp_app, notes=notes) as session:
            created = await tasks(session).call_tool_as_task(
                "talk", {"words": 20}, meta={"progressToken": "p-1"}
            )
            task_id = created.task.taskId
            await until(session, task_id, lambda x: x.status == "completed")
            for _ in range(40):
                if "w19" in "".join(n.message or "" for n in progress(notes)):
                    break
                await asyncio.sleep(0.05)

    asyncio.run(main())
    seen = progress(notes)
    assert seen and all(n.progressToken == "p-1" for n in seen)
    values = [n.progress for n in seen]
    assert values == sorted(set(values)) and values[-1] == 20  # increasing, one per chunk
    assert "".join(n.message or "" for n in seen) == "".join(f"w{i} " for i in range(20))


def progress(notes: list[Any]) -> list[t.ProgressNotificationParams]:
    return [n for n in notes if isinstance(n, t.ProgressNotificationParams)]


# -- 2026-07-28: gates through tasks/update ---------------------------------------------------


def test_agent_gates_are_input_required_and_answered_once_by_tasks_update(
    mcp_app: perdure.App, tmp_path: Path
) -> None:
    """An agent's ask_human and approval gates, in the stateless revision: tasks/get shows each
    as an input request, tasks/update answers it; two answers to one gate sent at once (as two
    servers would) deliver one (the other is dropped by the store), audited as the client.
    `perdure_steer`, listed and answered at once, puts its message in the next request."""
    agent = make_agent(mcp_app, tmp_path, gated_script(tmp_path))
    server = PerdureMcp(mcp_app, workflow_tools(mcp_app.runtime.workflows), McpOptions(poll=0.05))
    modern = Stateless(server)
    asker = Requestor(Principal("mcp:tester", LOCAL_SCOPES), "stdio")
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {
                "extensions": {"io.modelcontextprotocol/tasks": {}}}}  # fmt: skip

    async def rpc(method: str, **params: Any) -> dict[str, Any]:
        answer = await modern.handle(Rpc(1, method, {**params, "_meta": meta}), asker)
        assert "result" in answer, answer
        return dict(answer["result"])

    async def gate(task_id: str, seen: set[str]) -> tuple[str, dict[str, Any]]:
        deadline = time.monotonic() + 20
        while True:
            task = await rpc("tasks/get", taskId=task_id)
            fresh = {k: v for k, v in (task.get("inputRequests") or {}).items() if k not in seen}
            if task["status"] == "input_required" and fresh:
                [(key, request)] = fresh.items()
                seen.add(key)
                return key, request
            assert time.monotonic() < deadline, task
            await asyncio.sleep(0.05)

    async def main() -> None:
        async with worker_task(mcp_app, concurrency=4, poll=0.05):
            created = await rpc("tools/call", name="agent_helper", arguments={"prompt": "pick"})
            task_id = created["taskId"]
            assert created["resultType"] == "task"
            seen: set[str] = set()
            key, question = await gate(task_id, seen)
            assert question["params"]["message"] == "Which colour?"
            assert "perdure_steer" in {x["name"] for x in (await rpc("tools/list"))["tools"]}
            steered = await rpc("tools/call", name="perdure_steer",
                                arguments={"run_id": task_id, "text": "keep it short"})  # fmt: skip
            assert steered["structuredContent"]["run_id"] == task_id and not steered["isError"]
            reply = {key: {"action": "accept", "content": {"answer": "blue"}}}
            update = Rpc(2, "tasks/update", {"taskId": task_id, "inputResponses": reply,
                                              "_meta": meta})  # fmt: skip
            both = await asyncio.gather(modern.handle(update, asker), modern.handle(update, asker))
            assert {"resultType": "complete"} in [b.get("result") for b in both]
            for late in (b for b in both if "error" in b):  # the run had moved on meanwhile
                assert "is not waiting for input" in late["error"]["message"]
            key, approval = await gate(task_id, seen)
            assert approval["params"]["message"].startswith("Approve the call write_file(")
            assert approval["params"]["requestedSchema"]["required"] == ["approve"]
            await rpc("tasks/update", taskId=task_id, inputResponses={
                key: {"action": "accept", "content": {"approve": True}}})  # fmt: skip
            deadline = time.monotonic() + 20
            while (task := await rpc("tasks/get", taskId=task_id))["status"] != "completed":
                assert time.monotonic() < deadline, task
                await asyncio.sleep(0.05)
            assert task["result"]["structuredContent"]["answer"] == "wrote blue"
            call_id = key.split(":")[1]
            assert await mcp_app.runtime.store.next_event(task_id, f"approve:{call_id}") is None
            question_call = next(iter(seen)).split(":")[1]
            assert await mcp_app.runtime.store.next_event(task_id, f"human:{question_call}") is None
            audit = await Access(mcp_app.runtime.store).audit_log(target=f"run:{task_id}")
            assert {("gate.answer", "mcp:tester"), ("gate.approve", "mcp:tester")} <= {
                (r.action, r.actor) for r in audit}  # fmt: skip

    asyncio.run(main())
    assert (tmp_path / "out" / "colour.txt").read_text() == "blue"
    model = agent.providers["fast"]
    assert isinstance(model, ScriptedModel)
    steered = [sum("keep it short" in m.content for m in r.messages) for r in model.requests]
    assert steered == [0, 1, 1]
