"""A spec agent's local tier streams: the model's text reaches the run's stream as it is
generated (issue 33 item 5). The llama.cpp server is stood in for by the scripted
OpenAI-compatible wire server (the same HTTP streaming the local server speaks)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from wire_servers import OpenAIServer

import perdure
from perdure.agent import local_model
from perdure.agent.loop import Agent
from perdure.agent.providers.local import LlamaCppModel
from perdure.agent.spec import load_spec
from perdure.testing import TestWorker

SPEC = """
name = "streams"
goal = "Say what the lease says."

[models.fast]
provider = "local"
{extra}
"""


def local_agent(
    app: perdure.App, tmp_path: Path, server: OpenAIServer, monkeypatch: pytest.MonkeyPatch,
    extra: str = "",
) -> Agent:  # fmt: skip
    """An agent whose local tier is served by `server` instead of a llama.cpp process."""
    served = SimpleNamespace(model="Qwen2.5-Coder-1.5B-Instruct", base_url=f"{server.origin}/v1")
    monkeypatch.setattr(local_model, "ensure_local_model", lambda name=None: served)
    monkeypatch.setattr(LlamaCppModel, "require", classmethod(lambda cls, what, model="": None))
    (tmp_path / "agent.toml").write_text(SPEC.format(extra=extra))
    return Agent(app.runtime, load_spec(tmp_path / "agent.toml"))


def test_the_local_tier_streams_its_text_to_the_run_stream(
    app: perdure.App, worker: TestWorker, tmp_path: Path, openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The answer arrives in several chunks after the model step's attempt marker; joined,
    they are the answer the run returns."""
    answer = "The lease on 42 Harbour Street ends on 30 June; the renewal is 4,800 euros."
    openai_server.reply(answer)
    agent = local_agent(app, tmp_path, openai_server, monkeypatch)
    handle = app.start(agent.workflow, {"prompt": "What does the lease say?"}, run_id="s")
    worker.run_until_idle()
    assert handle.result(timeout=5)["answer"] == answer
    assert openai_server.requests[-1].body.get("stream") is True
    rows = list(handle.stream(-1))
    text = [r.data for r in rows if r.kind == "chunk" and r.topic == "out"]
    assert len(text) > 1 and "".join(text) == answer
    assert rows[0].kind == "attempt" and str(rows[0].data["step"]).endswith(".model")


def test_a_tier_that_says_stream_false_does_not_stream(
    app: perdure.App, worker: TestWorker, tmp_path: Path, openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`stream = false` on the tier: one whole reply, nothing in the run's stream."""
    openai_server.reply("The lease ends on 30 June.")
    agent = local_agent(app, tmp_path, openai_server, monkeypatch, extra="stream = false")
    handle = app.start(agent.workflow, {"prompt": "What does the lease say?"}, run_id="s")
    worker.run_until_idle()
    assert handle.result(timeout=5)["answer"] == "The lease ends on 30 June."
    assert not openai_server.requests[-1].body.get("stream")
    assert [r for r in handle.stream(-1) if r.kind == "chunk"] == []
