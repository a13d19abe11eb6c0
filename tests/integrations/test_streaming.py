"""The model-event stream of framework agents (integrations/streaming.py)."""

from __future__ import annotations

from typing import Any

import perdure
from perdure.integrations.streaming import ModelEvents, write_event
from perdure.testing import TestWorker


def test_an_event_too_big_for_a_chunk_is_left_out_of_the_stream(
    app: perdure.App, worker: TestWorker
) -> None:
    """A stream event over the chunk limit (a long answer's completed response) does not
    fail the model step: the stream notes its type, and readers skip it."""

    @app.step(effect="read", name="talk")
    def talk() -> None:
        position = perdure.current_step().position
        write_event(position, {"type": "response.output_text.delta", "delta": "hi"})
        write_event(position, {"type": "response.completed", "response": "x" * 70_000})

    @app.workflow(name="talker")
    def talker() -> str:
        talk()
        return "done"

    handle = app.start(talker)
    worker.run_until_idle()
    assert handle.result() == "done"
    chunks = [c.data for c in handle.stream() if c.kind == "chunk"]
    assert chunks[1] == {"position": 0, "omitted": "response.completed"}

    async def read() -> list[Any]:
        return [e.event async for e in ModelEvents(app.client, handle.id)]

    assert app.runtime.sync(read(), "test") == [
        {"type": "response.output_text.delta", "delta": "hi"}
    ]
