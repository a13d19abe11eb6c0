"""perdure.integrations.claude_agent: the Claude Agent SDK's real loop (its bundled Claude
Code CLI) talking to a scripted Anthropic-compatible HTTP server on 127.0.0.1 (no network,
no key), with each model request a keyed step and each SDK tool call a step with its
declared effect."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crash_steps import crash_after, recover
from extras_needed import needs

pytest.importorskip("claude_agent_sdk", reason=needs("claude-agent"))

from agents_support import wire_servers
from claude_agent_sdk import get_session_messages_from_store, list_sessions_from_store
from crashes import app_module

import perdure
from perdure.integrations.claude_agent import ClaudeAgent, PerdureSessionStore
from perdure.integrations.streaming import ModelEvents
from perdure.server import operations
from perdure.server.access import local_operator
from perdure.testing import TestClock, TestWorker

pytestmark = pytest.mark.slow  # each conversation starts the SDK's CLI (a few seconds)

TOOL = "mcp__tools__"
NO_EXTRAS = Path(__file__).parent.parent / "packaging"


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


@pytest.fixture
def quick() -> Iterator[None]:
    """The test app's refund and e-mail tools without their hold."""
    os.environ["CLAUDE_HOLD"] = "0"
    yield
    os.environ.pop("CLAUDE_HOLD")


def test_recovery_asks_the_model_nothing_it_answered(
    app: perdure.App, clock: TestClock, claude: Any, quick: None
) -> None:
    """A crash after the refund's intent: the recovered run starts a new CLI whose first
    two requests are answered from the journal (the server sees none of them) and whose
    lookup is the recorded one; the refund's probe finds nothing paid, so it runs once."""
    agent = claude.module.register(app)
    script(claude)
    handle = app.start(agent.workflow(), "refund o42", run_id="c2")
    dead = crash_after(app, "refunds.tool.refund")
    assert len(claude.requests) == 2 and claude.module.ledger() == ["lookup"]

    recover(app, clock, dead)

    assert handle.result() == "Order o42 was refunded."
    assert len(claude.requests) == 4  # only the two the crash left unasked
    assert claude.module.ledger() == ["lookup", "refund-started", "refund-paid",
                                      "email-started", "email-sent"]  # fmt: skip
    probed = [e for e in app.journal("c2") if e.kind == "step.probed"]
    assert len(probed) == 1 and json.loads(probed[0].data or "{}")["answer"] == "not_done"


def test_stream_writes_each_model_answers_events_once_across_a_crash(
    app: perdure.App, clock: TestClock, claude: Any, quick: None
) -> None:
    """`stream=True`: each model step writes the server's events to the run's durable stream
    as they arrive; after a crash and a recovery that answers two requests from the journal,
    each of the four model steps streamed its answer once, and the last one's text deltas
    are the run's answer."""
    agent = claude.module.register(app, stream=True)
    script(claude)
    handle = app.start(agent.workflow(), "refund o42", run_id="s1")
    recover(app, clock, crash_after(app, "refunds.tool.refund"))
    assert handle.result() == "Order o42 was refunded." and len(claude.requests) == 4

    async def read() -> list[Any]:
        return [item async for item in ModelEvents(app.client, "s1")]

    events = asyncio.run(read())
    assert events and not any(e.retry for e in events)  # no model step was cut off
    models = [e.position for e in app.journal("s1")
              if e.kind == "step.outcome" and e.name == "refunds.model"]  # fmt: skip
    starts = [e.position for e in events if e.event["type"] == "message_start"]
    assert len(models) == 4 and starts == models  # one answer each, none streamed again
    last = [e.event["delta"].get("text", "") for e in events
            if e.position == models[-1] and e.event["type"] == "content_block_delta"]  # fmt: skip
    assert "".join(last) == "Order o42 was refunded."


def test_an_interrupted_once_tool_parks_and_its_resolution_is_the_tool_result(
    app: perdure.App, clock: TestClock, claude: Any, quick: None
) -> None:
    """A crash after the e-mail's intent (a `once` tool without a probe): recovery sends
    no e-mail and asks the model nothing; the run waits in needs_attention; resolved by
    value, the CLI reads the value as the tool's result and the run finishes."""
    agent = claude.module.register(app)
    script(claude)
    handle = app.start(agent.workflow(), "refund o42", run_id="c3")
    dead = crash_after(app, "refunds.tool.email")

    recover(app, clock, dead)

    assert handle.status() == "needs_attention"
    assert len(claude.requests) == 3 and "email-started" not in claude.module.ledger()
    app.resolve("c3", "refunds.tool.email", value="sent by hand")
    TestWorker(app).run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    assert "email-started" not in claude.module.ledger() and len(claude.requests) == 4
    last = claude.requests[-1].body["messages"][-1]["content"][-1]
    assert last["tool_use_id"] == "t3"
    assert last["content"][0]["text"].strip() == "sent by hand"


@pytest.mark.parametrize("approve", [True, False])
def test_approval_is_a_perdure_gate(
    app: perdure.App, worker: TestWorker, claude: Any, quick: None, approve: bool
) -> None:
    """`approval={"refund"}`: the SDK's permission callback opens a perdure gate and the run
    waits (its CLI gone); once decided, a new CLI replays the recorded turns from the
    journal and the refund runs (approved) or the model reads the denial (denied)."""
    agent = claude.module.register(app, approval={"refund"})
    script(claude)
    handle = app.start(agent.workflow(), "refund o42", run_id="c4")
    worker.run_until_idle()
    assert handle.status() == "waiting" and claude.module.ledger() == ["lookup"]
    gates = app.runtime.sync(operations.pending_gates(app), "gates")
    assert [(g.call_id, g.tool, g.arguments) for g in gates] == [("t2", "refund", {"order": "o42"})]
    app.runtime.sync(
        operations.decide(app, local_operator(), "c4", "t2", approve, "not today"), "decide"
    )
    worker.run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    assert len(claude.requests) == 4  # the two recorded turns were not asked again
    paid = ["refund-started", "refund-paid"] if approve else []
    assert claude.module.ledger() == ["lookup", *paid, "email-started", "email-sent"]
    results = claude.requests[2].body["messages"][-1]["content"]
    refund = next(r for r in results if r["tool_use_id"] == "t2")
    assert ("not today" in json.dumps(refund)) == (not approve)


def test_a_builtin_tool_not_declared_safe_is_refused_by_the_hook(
    app: perdure.App, worker: TestWorker, claude: Any, tmp_path: Path
) -> None:
    """The CLI's own Write tool runs where no step can journal it: undeclared, the
    PreToolUse hook refuses it (the model reads why) and no file is written."""
    target = tmp_path / "config" / "note.txt"
    options = dataclasses.replace(claude.module.options(), tools=["Write"])
    agent = ClaudeAgent(app, "writer", options=options, upstream=claude.origin)
    claude.reply(tool_calls=[("w1", "Write", {"file_path": str(target), "content": "hi"})])
    claude.reply("Could not write.")
    handle = app.start(agent.workflow(), "write a note", run_id="c5")
    worker.run_until_idle()
    assert handle.result() == "Could not write." and not target.exists()
    refusal = json.dumps(claude.requests[-1].body["messages"][-1]["content"])
    assert "no step can journal it" in refusal


def test_bad_input_is_one_line(app: perdure.App, claude: Any) -> None:
    """A probe or gate for a tool the agent lacks, a dotted name, a second agent of one
    name: one-line ConfigErrors."""
    with pytest.raises(perdure.ConfigError, match=r"probes names no tool of it: \['nope'\]"):
        ClaudeAgent(app, "a", tools=[claude.module.lookup], probes={"nope": print})
    with pytest.raises(perdure.ConfigError, match="without dots"):
        ClaudeAgent(app, "a.b")
    ClaudeAgent(app, "twice", tools=[claude.module.lookup])
    with pytest.raises(perdure.ConfigError, match="two Claude agents are named 'twice'"):
        ClaudeAgent(app, "twice", tools=[claude.module.lookup])


def test_a_changed_agent_is_a_non_determinism_error_at_its_first_request(
    db_url: str, clock: TestClock, claude: Any, quick: None
) -> None:
    """A crash after the refund's intent, then the agent's code changes (its e-mail tool
    is gone) before recovery: the recovered CLI's first request offers other tools than
    the journaled one did, and the run fails naming position 0 and both tool lists rather
    than feeding the CLI answers to another conversation."""
    first = perdure.App(db_url, clock=clock)
    try:
        workflow = claude.module.register(first).workflow()
        script(claude)
        first.start(workflow, "refund o42", run_id="c6")
        dead = crash_after(first, "refunds.tool.refund")
    finally:
        first.close()
    changed = perdure.App(db_url, clock=clock)
    try:
        module = claude.module
        agent = ClaudeAgent(changed, "refunds", options=module.options(),
                            tools=[module.lookup, module.refund], effects={"lookup": "read"},
                            upstream=claude.origin)  # fmt: skip
        agent.workflow()
        recover(changed, clock, dead)
        run = changed.get_run("c6")
        assert run.status == "failed"
        message = json.loads(run.error or "{}").get("message", "")
        assert "at position 0" in message and "mcp__tools__email" in message, message
        assert len(claude.requests) == 2  # nothing was asked of the model on replay
    finally:
        changed.close()


def test_without_the_extra_the_import_is_one_line(tmp_path: Path) -> None:
    """With the SDK not installed (blocked as a bare install would lack it), `import perdure`
    works and importing the integration raises MissingExtra naming the extra."""
    code = (
        "import no_extras; no_extras.install()\n"
        "import perdure\n"
        "try:\n"
        "    import perdure.integrations.claude_agent\n"
        "except perdure.errors.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    src = Path(perdure.__file__).parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_EXTRAS), str(src)])},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "perdure.integrations.claude_agent needs the claude-agent extra (claude_agent_sdk is "
        "missing): pip install 'perdure[claude-agent]'\n"
    )


def test_a_refused_key_parks_and_resume_asks_again(
    app: perdure.App, worker: TestWorker, claude: Any
) -> None:
    """The API answers 401: the run pauses with one line naming the agent and `perdure
    resume` (the CLI never sees the refusal, nothing is recorded); resumed once the key
    is fixed, the model is asked again and the run finishes."""
    agent = claude.module.register(app)
    claude.fail_next(401)
    handle = app.start(agent.workflow(), "refund o42", run_id="c7")
    worker.run_until_idle()
    assert handle.status() == "paused"
    reason = json.loads(app.get_run("c7").error or "{}")["message"]
    assert reason.startswith("Claude agent 'refunds': the model API refused the key (401")
    assert "\n" not in reason and reason.endswith("then `perdure resume c7`")
    claude.reply("Nothing to refund.")
    app.resume("c7")
    worker.run_until_idle()
    assert handle.result() == "Nothing to refund." and len(claude.requests) == 2
