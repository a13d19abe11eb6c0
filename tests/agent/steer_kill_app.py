"""The app the steering kill test's real workers serve (`python -m perdure --app
steer_kill_app:app worker`): one spec agent (its spec in STEER_KILL_SPEC) whose scripted
model appends every request it gets to STEER_KILL_DIR/requests.jsonl (one write per line,
whole under kill -9), then answers reply N (N: the assistant turns in the request, as a
resumed run's scripted model does) only once the test has created STEER_KILL_DIR/go-N."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import perdure
from perdure.agent.loop import Agent
from perdure.agent.messages import ModelRequest, ModelResponse
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec

FOLDER = Path(os.environ["STEER_KILL_DIR"])
REPLIES = [
    {"content": "", "tool_calls": [{"name": "recall", "arguments": {"query": "first"}}]},
    {"content": "", "tool_calls": [{"name": "recall", "arguments": {"query": "second"}}]},
    "done",
]


class GatedModel(ScriptedModel):
    """The scripted model, writing down each request and holding each reply at its gate."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        line = json.dumps({"turn": turn, "pid": os.getpid(),
                           "messages": [m.content for m in request.messages]})  # fmt: skip
        fd = os.open(FOLDER / "requests.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        while not (FOLDER / f"go-{turn}").exists():
            await asyncio.sleep(0.02)
        return await super().complete(request)


app = perdure.App(os.environ["PERDURE_DB"])
agent = Agent(app.runtime, load_spec(os.environ["STEER_KILL_SPEC"]),
              providers={"fast": GatedModel(REPLIES, follow_transcript=True)})  # fmt: skip
