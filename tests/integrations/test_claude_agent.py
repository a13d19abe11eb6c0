"""perdure.integrations.claude_agent: the Claude Agent SDK's real loop (its bundled Claude
Code CLI) talking to a scripted Anthropic-compatible HTTP server on 127.0.0.1 (no network,
no key), with each model request a keyed step and each SDK tool call a step with its
declared effect."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("claude_agent_sdk", reason=needs("claude-agent"))

from agents_support import wire_servers
from claude_agent_sdk import get_session_messages_from_store, list_sessions_from_store
from crashes import app_module

import perdure
from perdure.integrations.claude_agent import PerdureSessionStore
from perdure.testing import TestWorker

pytestmark = pytest.mark.slow  # each conversation starts the SDK's CLI (a few seconds)

TOOL = "mcp__tools__"


class ClaudeServer(wire_servers().AnthropicServer):  # type: ignore[misc]
    """The scripted Anthropic server on the path the CLI calls (`?beta=true`)."""

    path = "/v1/messages?beta=true"


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[Any]:
    """The scripted server, the environment the test app reads, and the app module."""
    server = ClaudeServer().start()
    (tmp_path / "ledger").touch()
    (tmp_path / "config").mkdir()
    env = {"CLAUDE_BASE_URL": server.origin, "CLAUDE_LEDGER": str(tmp_path / "ledger"),
           "CLAUDE_CONFIG": str(tmp_path / "config")}  # fmt: skip
    os.environ.update(env)
    server.env = env
    server.module = app_module("claude_agent_app")
    yield server
    server.stop()
    for key in env:
        os.environ.pop(key, None)


def script(server: Any) -> None:
    """Four model turns: look up, refund, e-mail, answer."""
    server.reply(tool_calls=[("t1", TOOL + "lookup", {"order": "o42"})])
    server.reply(tool_calls=[("t2", TOOL + "refund", {"order": "o42"})])
    server.reply(tool_calls=[("t3", TOOL + "email", {"order": "o42"})])
    server.reply("Order o42 was refunded.")


def steps(app: perdure.App, run_id: str) -> list[tuple[str, str]]:
    """(step name, effect) of each journaled step intent or read outcome, in order."""
    found: dict[int, tuple[str, str]] = {}
    for entry in app.journal(run_id):
        if entry.kind == "step.intent" and entry.position is not None:
            found[entry.position] = (entry.name, json.loads(entry.data or "{}")["effect"])
        elif entry.kind == "step.outcome" and entry.position not in found:
            assert entry.position is not None
            found[entry.position] = (entry.name, "read")
    return [found[p] for p in sorted(found)]


def test_a_conversation_is_journaled_step_by_step(
    app: perdure.App, worker: TestWorker, claude: Any
) -> None:
    """The CLI's four model requests are keyed steps, each tool call a step with its
    effect, in the order they happened; the result is the model's last text; the
    transcript is in the store."""
    os.environ["CLAUDE_HOLD"] = "0"
    try:
        agent = claude.module.register(app)
        handle = app.start(agent.workflow(), "refund o42", run_id="c1")
        script(claude)
        worker.run_until_idle()
        assert handle.result() == "Order o42 was refunded."
    finally:
        os.environ.pop("CLAUDE_HOLD")
    model = ("refunds.model", "keyed")
    assert steps(app, "c1") == [
        model, ("refunds.tool.lookup", "read"), model, ("refunds.tool.refund", "once"),
        model, ("refunds.tool.email", "once"), model,
    ]  # fmt: skip
    assert claude.module.ledger() == ["lookup", "refund-started", "refund-paid",
                                      "email-started", "email-sent"]  # fmt: skip
    posted = [r for r in claude.requests if r.body.get("tools")]
    assert len(posted) == 4
    results = posted[-1].body["messages"][-1]["content"]  # the CLI merges the turns
    assert [r["tool_use_id"] for r in results] == ["t1", "t2", "t3"]
    assert results[-1]["content"][0]["text"].strip() == "sent"
    # the transcript, as the SDK's own store helpers read it back
    store = PerdureSessionStore(app)
    found = asyncio.run(list_sessions_from_store(store, directory=claude.env["CLAUDE_CONFIG"]))
    assert len(found) == 1 and found[0].summary == "refund o42"
    said = asyncio.run(get_session_messages_from_store(
        store, found[0].session_id, directory=claude.env["CLAUDE_CONFIG"]
    ))  # fmt: skip
    assert [m.type for m in said] == ["user", "assistant"] * 4
