"""The 2026-07-28 revision and its tasks extension in raw JSON-RPC against a real
`perdure mcp --http`: discovery, task handles, polling with inlined results, gates as
input_required answered with tasks/update, cancel, subscriptions, and bad input."""

from __future__ import annotations

import json

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

import httpx
from serving import MODERN, TASKS, Raw, Store, modern_meta

from perdure import App


def test_discover_tools_and_a_task_to_its_result(store: Store) -> None:
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    found = raw.call("server/discover")
    assert MODERN in found["supportedVersions"] and "2025-11-25" in found["supportedVersions"]
    assert found["capabilities"]["extensions"] == {TASKS: {}}
    assert found["resultType"] == "complete" and found["serverInfo"]["name"] == "perdure"
    tools = {t["name"]: t for t in raw.call("tools/list")["tools"]}
    assert {"ask", "explode", "hold", "nap", "family"} <= set(tools)
    handle = raw.call("tools/call", {"name": "nap", "arguments": {"x": 21, "pause": 0.2}})
    assert handle["resultType"] == "task" and handle["status"] == "working"
    assert handle["taskId"].startswith("mcp:") and handle["pollIntervalMs"] > 0
    assert handle["ttlMs"] is None  # no retention: kept until an operator deletes it
    done = raw.until(handle["taskId"], lambda t: t["status"] == "completed")
    assert done["resultType"] == "complete"
    assert done["result"]["structuredContent"] == {"result": 42}
    assert done["result"]["isError"] is False
    plain = raw.call("tools/call", {"name": "nap", "arguments": {"x": 1, "pause": 0}},
                     tasks=False)  # fmt: skip
    assert plain["resultType"] == "complete" and plain["structuredContent"] == {"result": 2}


def test_a_failed_workflow_is_a_completed_task_with_its_error(store: Store) -> None:
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    handle = raw.call("tools/call", {"name": "explode", "arguments": {"n": 7}})
    done = raw.until(handle["taskId"], lambda t: t["status"] != "working")
    assert done["status"] == "completed" and done["statusMessage"] == "ValueError: bad input 7"
    assert done["result"]["isError"] is True
    assert "bad input 7" in done["result"]["content"][0]["text"]


def test_a_question_is_input_required_and_answered_once_with_tasks_update(store: Store) -> None:
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    task_id = raw.call("tools/call", {"name": "ask", "arguments": {}})["taskId"]
    waiting = raw.until(task_id, lambda t: t["status"] == "input_required")
    [(key, request)] = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert request["params"]["requestedSchema"]["required"] == ["answer"]
    again = raw.call("tasks/get", {"taskId": task_id})
    assert list(again["inputRequests"]) == [key]  # the same request, the same key
    ack = raw.call("tasks/update", {"taskId": task_id, "inputResponses": {
        key: {"action": "accept", "content": {"answer": "green"}}}})  # fmt: skip
    assert ack == {"resultType": "complete"}
    done = raw.until(task_id, lambda t: t["status"] == "completed")
    assert done["result"]["structuredContent"] == {"result": "green"}
    refused = raw.error("tasks/update", {"taskId": task_id, "inputResponses": {
        key: {"action": "accept", "content": {"answer": "red"}}}})  # fmt: skip
    assert refused["code"] == -32602 and "not waiting for input" in refused["message"]


def test_cancel_stops_the_run_and_its_children(store: Store) -> None:
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    task_id = raw.call("tools/call", {"name": "family", "arguments": {}})["taskId"]
    raw.until(task_id, lambda t: "waiting for child" in t.get("statusMessage", ""))
    assert raw.call("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}
    done = raw.until(task_id, lambda t: t["status"] == "cancelled")
    assert "result" not in done
    observer = App(store.db)
    try:
        children = observer.runtime.sync(
            observer.runtime.store.list_runs(parent_id=task_id), "children"
        )
    finally:
        observer.close()
    assert [c.workflow for c in children] == ["hold"]
    assert [c.status for c in children] == ["cancelled"]


def test_subscriptions_listen_streams_task_status(store: Store) -> None:
    server = store.serve()
    token = store.token("a")
    raw = Raw(server.url, token)
    task_id = raw.call("tools/call", {"name": "nap", "arguments": {"x": 2, "pause": 0.5}})["taskId"]
    params = {"notifications": {"taskIds": [task_id, "mcp:not-mine"]}, "_meta": modern_meta()}
    body = {"jsonrpc": "2.0", "id": 99, "method": "subscriptions/listen", "params": params}
    messages = []
    with httpx.stream("POST", server.url, json=body, timeout=30, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN}) as stream:  # fmt: skip
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data:"):
                messages.append(json.loads(line[5:]))
                if "result" in messages[-1]:
                    break
    ack = messages[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # not another's or unknown
    notes = [m["params"] for m in messages if m.get("method") == "notifications/tasks"]
    assert notes[-1]["status"] == "completed" and notes[-1]["result"]["structuredContent"] == {
        "result": 4}  # fmt: skip
    assert messages[-1]["id"] == 99


def test_bad_input_gets_one_clear_error(store: Store) -> None:
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    other = Raw(server.url, store.token("b"))
    wrong = raw.post("tools/list", version="2031-01-01")
    assert wrong.status_code == 400
    error = wrong.json()["error"]
    assert error["code"] == -32022 and error["data"]["supported"][-1] == MODERN
    assert "2025-11-25" in error["message"] and MODERN in error["message"]
    legacy = raw.post("server/discover", version="2025-11-25")  # a served revision: no -32022
    assert legacy.status_code == 400 and "-32022" not in legacy.text, legacy.text
    assert "session" in legacy.text.lower()  # the SDK's 2025-11-25 answer: initialize first
    task_id = raw.call("tools/call", {"name": "hold", "arguments": {}})["taskId"]
    for method, params in (
        ("tasks/get", {"taskId": task_id}),
        ("tasks/cancel", {"taskId": task_id}),
        ("tasks/update", {"taskId": task_id, "inputResponses": {}}),
    ):
        refused = other.error(method, params)
        assert refused == {"code": -32602, "message": f"Task not found: {task_id}"}
    assert other.error("tasks/get", {"taskId": "mcp:nope"})["message"] == "Task not found: mcp:nope"
    not_waiting = raw.error("tasks/update", {"taskId": task_id, "inputResponses": {}})
    assert not_waiting["code"] == -32602 and "is not waiting for input (it is working)" in (
        not_waiting["message"])  # fmt: skip
    undeclared = raw.error("tasks/get", {"taskId": task_id}, tasks=False)
    assert undeclared["code"] == -32021
    assert undeclared["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
    assert raw.error("resources/list")["code"] == -32601
    reader = Raw(server.url, store.token("reader", ("read",)))
    refused = reader.error("tools/call", {"name": "hold", "arguments": {}})
    assert refused["code"] == -32600 and "'operate' scope" in refused["message"]
    asked = reader.error("tasks/update", {"taskId": "mcp:x", "inputResponses": {}})
    assert asked["code"] == -32600 and "'approve' scope" in asked["message"]
    assert raw.call("tasks/get", {"taskId": task_id})["status"] == "working"  # nothing lost
