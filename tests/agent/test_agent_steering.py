"""Steering a spec agent in one process: a message sent while the run waits (or before it
starts) is in its next model request, once, and stays in the transcript after."""

from __future__ import annotations

from pathlib import Path

import perdure
from perdure.agent.loop import Agent
from perdure.agent.messages import ModelRequest
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.server import operations as ops
from perdure.server.access import Principal
from perdure.server.access_sql import Access
from perdure.testing import TestWorker

SPEC = """
name = "writer"
goal = "Write the answer"

[models.fast]
provider = "scripted"

[tools]
grant = ["ask_human"]
"""
BOSS = Principal("cli:boss@host", frozenset({"operate"}))


def make(app: perdure.App, tmp_path: Path, replies: list[object]) -> tuple[Agent, ScriptedModel]:
    (tmp_path / "agent.toml").write_text(SPEC)
    model = ScriptedModel(replies)
    return Agent(app.runtime, load_spec(tmp_path / "agent.toml"), providers={"fast": model}), model


def said(request: ModelRequest, text: str) -> int:
    """How many of the request's messages carry `text`."""
    return sum(text in m.content for m in request.messages)


def test_a_message_sent_while_the_agent_waits_is_in_its_next_request_once(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """Steered (audited, by its actor) while it waits for a person, the agent's next request
    carries the message as a user turn, and the one after still carries it once."""
    ask = {"content": "", "tool_calls": [{"name": "ask_human", "arguments": {"question": "?"}}]}
    agent, model = make(app, tmp_path, [ask, ask, "done in French"])
    app.start(agent.workflow, {"prompt": "write"}, run_id="w")
    worker.run_until_idle()
    assert app.get_run("w").status == "waiting"
    app.runtime.sync(ops.steer(app, BOSS, "w", "answer in French"), "steer")
    for reply in model.script[:2]:
        app.send_event("w", f"human:{reply.message.tool_calls[0].id}", "go on")
        worker.run_until_idle()
    assert app.handle("w").result(timeout=5)["answer"] == "done in French"
    assert [said(r, "answer in French") for r in model.requests] == [0, 1, 1]
    [turn] = [m for m in model.requests[1].messages if "answer in French" in m.content]
    assert turn.role == "user" and "cli:boss@host" in turn.content
    [audited] = app.runtime.sync(Access(app.runtime.store).audit_log(target="run:w"), "audit")
    assert (audited.action, audited.actor, audited.outcome) == ("run.steer", BOSS.name, "ok")


def test_a_message_sent_before_the_agent_starts_is_in_its_first_request(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """A spec agent's run takes steering from its start: a steer to a pending run is kept."""
    agent, model = make(app, tmp_path, ["short answer"])
    app.start(agent.workflow, {"prompt": "write"}, run_id="early")
    app.runtime.sync(ops.steer(app, BOSS, "early", "keep it short"), "steer")
    worker.run_until_idle()
    assert app.handle("early").result(timeout=5)["answer"] == "short answer"
    assert said(model.requests[0], "keep it short") == 1
