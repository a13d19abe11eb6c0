"""2025-11-25 over Streamable HTTP in raw JSON-RPC against a real `perdure mcp --http`: what
the SDK clients do not show (the response's content type, a dropped tasks/result stream,
the ttl a task is given)."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

import httpx
from legacy import Session, answer_of
from mcp import ClientSession
from mcp import types as t
from mcp.client.streamable_http import streamable_http_client
from serving import Store

from perdure import App


def send_event(db: str, run_id: str, name: str, payload: Any) -> None:
    app = App(db)
    try:
        app.runtime.sync(app.client.send_event(run_id, name, payload), "send_event")
    finally:
        app.close()


def test_tasks_get_is_plain_json_not_an_sse_stream(store: Store) -> None:
    server = store.serve()
    session = Session(server.url, store.token("a"))
    created = session.call("tools/call", {"name": "hold", "arguments": {}, "task": {}})
    task_id = created["result"]["task"]["taskId"]
    got = session.post("tasks/get", {"taskId": task_id})
    assert got.headers["content-type"] == "application/json", got.text
    assert got.json()["result"]["taskId"] == task_id
    other = Session(server.url, store.token("b"))  # another token: not found, as JSON too
    refused = other.post("tasks/get", {"taskId": task_id})
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["error"] == {"code": -32602, "message": f"Task not found: {task_id}"}


def test_a_ttl_beyond_the_maximum_is_clamped_and_said(store: Store) -> None:
    server = store.serve(worker=False)
    session = Session(server.url, store.token("a"))
    created = session.call("tools/call", {"name": "hold", "arguments": {}, "task": {"ttl": 10**15}})
    task = created["result"]["task"]
    assert task["ttl"] == 365 * 86_400_000
    assert task["statusMessage"].startswith(
        "requested ttl 1000000000000000 ms is beyond the maximum 31536000000 ms"
    )
    modest = session.call("tools/call", {"name": "hold", "arguments": {}, "task": {"ttl": 1000}})
    assert "requested ttl" not in modest["result"]["task"]["statusMessage"]


def test_a_client_dropping_mid_tasks_result_and_coming_back(store: Store) -> None:
    """The stream of a tasks/result is cut by the client; a new session asks again and gets
    the result once the run ends; the server logs no ASGI error, the first session's held
    request included."""
    server = store.serve()
    token = store.token("a")
    first = Session(server.url, token)
    created = first.call("tools/call", {"name": "hold", "arguments": {}, "task": {}})
    task_id = created["result"]["task"]["taskId"]
    dropped = False
    try:
        with httpx.Client(headers=first.headers, timeout=httpx.Timeout(30, read=1.0)) as cut:
            cut.post(server.url, json=first.body("tasks/result", {"taskId": task_id}))
    except httpx.ReadTimeout:
        dropped = True
    assert dropped  # it blocked: the task had not ended
    first.close()
    second = Session(server.url, token)
    answers: list[dict[str, Any]] = []
    asking = threading.Thread(
        target=lambda: answers.append(answer_of(second.post("tasks/result", {"taskId": task_id})))
    )
    asking.start()
    got = second.call("tasks/get", {"taskId": task_id})
    assert got["result"]["status"] == "working"
    send_event(store.db, task_id, "go", "back")
    asking.join(60)
    assert answers and answers[0]["result"]["structuredContent"] == {"result": "back"}
    again = second.call("tasks/get", {"taskId": task_id})  # the server still answers
    assert again["result"]["status"] == "completed"
    log = server.output()
    assert "Unexpected ASGI message" not in log and "Traceback" not in log, log[-3000:]


def test_a_client_that_only_polls_gets_the_gate_of_a_task_made_elsewhere(store: Store) -> None:
    """A task made through server A waits at a question; a client of server B that only polls
    tasks/get (as FastMCP 3 does) is put the question on its session's stream, answers it,
    and sees the task complete."""
    a, b = store.serve(worker=False), store.serve()
    token = store.token("a")
    made = Session(a.url, token).call("tools/call", {"name": "ask", "arguments": {}, "task": {}})
    task_id = made["result"]["task"]["taskId"]
    asked: list[str] = []

    async def elicit(ctx: Any, params: t.ElicitRequestParams) -> t.ElicitResult:
        asked.append(params.message)
        return t.ElicitResult(action="accept", content={"answer": "ochre"})

    async def main() -> str:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as http,
            streamable_http_client(b.url, http_client=http) as (read, write, _),
            ClientSession(read, write, elicitation_callback=elicit) as session,  # type: ignore[arg-type]
        ):
            await session.initialize()
            # any request through the SDK makes the session known to the plain-JSON tasks/get
            assert {tool.name for tool in (await session.list_tools()).tools} >= {"ask"}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                tasks = session.experimental
            deadline = time.monotonic() + 30
            while (task := await tasks.get_task(task_id)).status != "completed":
                assert time.monotonic() < deadline, task
                await asyncio.sleep(0.1)
            result = await tasks.get_task_result(task_id, t.CallToolResult)
            return str((result.structuredContent or {}).get("result"))

    assert asyncio.run(main()) == "ochre"
    assert asked == [f"Run {task_id} asks for an answer."]


@pytest.mark.slow
def test_a_blocked_tasks_result_stream_is_kept_alive(store: Store) -> None:
    """While tasks/result blocks, its SSE stream carries keep-alive comments (every 15 s), so
    neither a proxy nor the client's read timeout ends it; the result follows on it."""
    server = store.serve()
    token = store.token("a")
    session = Session(server.url, token)
    created = session.call("tools/call", {"name": "hold", "arguments": {}, "task": {}})
    task_id = created["result"]["task"]["taskId"]
    lines: list[str] = []
    asking = session.body("tasks/result", {"taskId": task_id})
    wait = httpx.Timeout(30, read=25)
    with httpx.stream(
        "POST", server.url, json=asking, headers=session.headers, timeout=wait
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            lines.append(line)
            if line.startswith(": ping"):  # kept alive: now let the run end
                send_event(store.db, task_id, "go", "alive")
            if line.startswith("data:") and "alive" in line:
                break
    assert any(line.startswith(": ping") for line in lines)
    assert '"structuredContent":{"result":"alive"}' in lines[-1].replace(" ", "")
