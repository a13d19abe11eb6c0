"""Model tokens of framework agents through the run's durable stream (engine/streams.py).

A model step that streams writes each of the framework's stream events as a chunk
`{"position": P, "event": ...}` on the topic `model` while the call runs (and a framework
that has them, the items its run made of it: `{"position": P, "item": ...}` on `items`,
written by the model or tool step that made them); its final
response is journaled once, as the step's outcome, so a replay streams nothing again (a
billed call is never re-sent) and a recovered call's `retry` marker tells readers to drop
what they had of it. `ModelEvents` reads them back from any offset, live, across workers.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.streams import follow, stream
from ..errors import PayloadError

if TYPE_CHECKING:
    from ..engine.client import Client

__all__ = [
    "ITEM_TOPIC", "MODEL_TOPIC", "ModelEvent", "ModelEvents", "streaming", "write_event",
    "write_item",
]  # fmt: skip

MODEL_TOPIC = "model"
ITEM_TOPIC = "items"

# set by a durable agent's workflow when its caller reads the run as a stream
streaming: contextvars.ContextVar[bool] = contextvars.ContextVar("perdure_streaming", default=False)


def write_event(position: int, event: Any) -> None:
    """Append one model stream event (JSON) of the step at `position` to the run's stream;
    one too big for a chunk (a long answer's `response.completed`) is left out, with a note
    of its type: the step's journaled response holds it whole."""
    try:
        stream.write({"position": position, "event": event}, topic=MODEL_TOPIC)
    except PayloadError:
        kind = event.get("type") or event.get("event_kind") if isinstance(event, dict) else None
        stream.write({"position": position, "omitted": str(kind)}, topic=MODEL_TOPIC)


def write_item(position: int, item: dict[str, Any]) -> None:
    """Append one run item (a tool called, its output, a message) that the step at
    `position` made to the run's stream; one too big for a chunk is noted by its name."""
    try:
        stream.write({"position": position, "item": item}, topic=ITEM_TOPIC)
    except PayloadError:
        stream.write({"position": position, "omitted": str(item.get("name"))}, topic=ITEM_TOPIC)


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """One event a model step streamed (`retry`: drop what was read of step `position`;
    `item`: a run item a step wrote, where `event` is None)."""

    seq: int
    position: int
    event: Any
    retry: bool = False
    item: Any = None


class ModelEvents:
    """The model events of run `run_id` after stream offset `offset`, live until the run
    ends; `offset` moves as they are read, so a reader that reconnects goes on from it.
    With `items`, the run items the steps wrote come too, in stream order."""

    def __init__(
        self, client: Client, run_id: str, offset: int = -1, *, items: bool = False
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.offset = offset
        self.items = items

    async def __aiter__(self) -> AsyncIterator[ModelEvent]:
        async for chunk in follow(self.client, self.run_id, self.offset):
            self.offset = chunk.seq
            data = chunk.data if isinstance(chunk.data, dict) else {}
            if chunk.kind == "retry":
                yield ModelEvent(chunk.seq, int(data.get("position", -1)), None, retry=True)
            elif chunk.kind == "chunk" and chunk.topic == MODEL_TOPIC and "event" in data:
                yield ModelEvent(chunk.seq, int(data["position"]), data["event"])
            elif self.items and chunk.topic == ITEM_TOPIC and "item" in data:
                yield ModelEvent(chunk.seq, int(data["position"]), None, item=data["item"])
