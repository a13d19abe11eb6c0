"""Issue 35 against a real `perdure mcp --http`: long responses and session streams end once
their token is revoked, delivering nothing written after the revoke (§7), and progress
notifications carry a run's stream through the redactor (§6)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

import httpx
from legacy import Session, answer_of
from mcp import types as t
from serving import MODERN, Raw, Store, modern_meta, sdk_session

from perdure import App


def send_event(db: str, run_id: str, name: str, payload: Any) -> None:
    app = App(db)
    try:
        app.runtime.sync(app.client.send_event(run_id, name, payload), "send_event")
        deadline = time.monotonic() + 30
        while app.get_run(run_id).status != "completed":  # the result is written
            assert time.monotonic() < deadline, app.get_run(run_id)
            time.sleep(0.05)
    finally:
        app.close()


class Background:
    """A blocking call on a thread of its own: its answer, or what it raised."""

    def __init__(self, work: Any) -> None:
        self.answer: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.answer = work()
            except BaseException as exc:  # handed to the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def done_within(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive()


def test_a_tasks_result_opened_before_a_revoke_delivers_nothing_written_after_it(
    store: Store,
) -> None:
    """tasks/result blocks on a run waiting for an event; the token is revoked, then the
    event comes and the run completes: the response ends with an error naming the revoke,
    never the result (the old code delivered it)."""
    server = store.serve()
    session = Session(server.url, store.token("a"))
    made = session.call("tools/call", {"name": "hold", "arguments": {}, "task": {}})
    task_id = made["result"]["task"]["taskId"]
    waiting = Background(lambda: answer_of(session.post("tasks/result", {"taskId": task_id})))
    assert not waiting.done_within(1.0)  # it blocks: the run waits for `go`
    store.revoke("a")
    send_event(store.db, task_id, "go", "written after the revoke")
    assert waiting.done_within(30), "tasks/result still open after the revoke"
    assert waiting.error is None, waiting.error
    assert "written after the revoke" not in json.dumps(waiting.answer)
    assert waiting.answer["error"]["code"] == -32600
    assert "revoked" in waiting.answer["error"]["message"]
    session.close()


def test_a_revoked_tokens_session_stream_is_closed(store: Store) -> None:
    """The session's own SSE stream (GET) is open; once the token is revoked the server ends
    the session: the stream closes (the old code kept it open, and sent it notifications)."""
    server = store.serve(worker=False)
    session = Session(server.url, store.token("a"))
    assert "result" in session.call("tools/list")  # the session is known to the server

    def follow() -> int:
        with session.http.stream("GET", server.url, timeout=httpx.Timeout(30, read=120)) as got:
            assert got.status_code == 200, got.read()
            return sum(1 for _ in got.iter_lines())

    stream = Background(follow)
    assert not stream.done_within(1.0)
    store.revoke("a")
    assert stream.done_within(60), "the session stream stayed open after the revoke"
    assert stream.error is None, stream.error
    refused = session.post("tools/list")
    assert refused.status_code == 401
    session.close()


def test_a_revoked_tokens_subscription_ends_without_the_result(store: Store) -> None:
    """2026-07-28: subscriptions/listen on a waiting task, the token revoked, then the run
    completes: the stream ends with the revoke's error and never carries the result."""
    server = store.serve()
    raw = Raw(server.url, store.token("a"))
    made = raw.call("tools/call", {"name": "hold", "arguments": {}})
    task_id = made["taskId"]
    body = {
        "jsonrpc": "2.0",
        "id": 99,
        "method": "subscriptions/listen",
        "params": {
            "notifications": {"taskIds": [task_id]},
            "_meta": {**modern_meta(), "io.modelcontextprotocol/protocolVersion": MODERN},
        },
    }
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "subscriptions/listen"}

    def listen() -> str:
        with raw.http.stream("POST", server.url, json=body, headers=headers) as got:
            return "".join(got.iter_text())

    stream = Background(listen)
    assert not stream.done_within(1.0)
    store.revoke("a")
    send_event(store.db, task_id, "go", "written after the revoke")
    assert stream.done_within(30), "the subscription stayed open after the revoke"
    assert stream.error is None, stream.error
    assert "written after the revoke" not in stream.answer
    assert "revoked" in stream.answer
    raw.close()


def test_progress_notifications_are_masked(store: Store) -> None:
    """A run writes a provider key into its stream; the client that asked for progress gets
    the text with the key masked (the old code sent it as written)."""
    server = store.serve()
    token = store.token("a")
    secret = "sk-live0123456789abcdefSECRET"
    notes: list[t.ProgressNotificationParams] = []

    async def on_message(message: Any) -> None:
        root = message.root if isinstance(message, t.ServerNotification) else None
        if isinstance(root, t.ProgressNotification):
            notes.append(root.params)

    async def main() -> None:
        async with sdk_session(server.url, token, message_handler=on_message) as s:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                tasks = s.experimental
            words = f"connecting with {secret} now"
            made = await tasks.call_tool_as_task(
                "confide", {"words": words}, meta={"progressToken": "p-1"}
            )
            await tasks.get_task_result(made.task.taskId, t.CallToolResult)
            deadline = time.monotonic() + 30
            while not any("connecting with" in (n.message or "") for n in notes):
                assert time.monotonic() < deadline, notes
                await asyncio.sleep(0.05)

    asyncio.run(main())
    text = "".join(n.message or "" for n in notes)
    assert "connecting with sk-*** now" in text
    assert "0123456789abcdef" not in text
