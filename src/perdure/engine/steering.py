"""Steering: messages an operator sends a running run (`perdure steer RUN TEXT`), as events.

A steer is an event named `steer` (`STEER`) whose payload is `{"text": ..., "by": ...}`,
kept by the store until the run takes it: a steer sent while no worker holds the run, or
while its worker is being killed, waits for the next one. A run takes its pending steers
with `perdure.steering()` (durable.py): each is journaled as a `steer.received` entry in
the transaction that marks its event consumed, so it is applied once and replayed from
the journal ever after. A workflow may also block for the next one with
`perdure.wait_event("steer")` (its payload as above).

Who may be steered: a run whose journal holds a `run.steering` entry (recorded, at no
position, by its workflow's first `steering()` call: it asked), or one whose caller knows
its workflow takes steering (a spec agent's, from its start). Others are refused in one
line, as is a finished run. A run never steered takes no journal position for it, so
steering changes no position of a run's steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ..store.base import Entry

STEER = "steer"  # the event name (and the journal name) of a steering message
RECEIVED = "steer.received"  # the journal kind of a steer a run took
ASKED = "run.steering"  # the journal kind (at no position) of a run that asked for steering


@dataclass(frozen=True, slots=True)
class Steer:
    """One steering message a run took: its text, who sent it, when (Unix seconds)."""

    text: str
    by: str = ""
    sent_at: float = 0.0

    def prompt(self) -> str:
        """How an agent puts it to its model: a user turn, kept in the transcript after."""
        who = f" ({self.by})" if self.by else ""
        return f"Message from the operator{who}, steering this task: {self.text}"


def payload(text: str, by: str) -> dict[str, str]:
    """The event payload of a steer."""
    return {"text": text, "by": by}


def received(entry: Entry) -> Steer:
    """The steer a `steer.received` entry holds."""
    data = json.loads(entry.data or "{}")
    sent = data.get("payload") or {}
    return Steer(str(sent.get("text", "")), str(sent.get("by", "")), float(data.get("sent_at", 0)))


def asked(entries: Sequence[Entry]) -> bool:
    """Has the run's workflow asked for steering (its journal holds the marker)?"""
    return any(e.kind == ASKED for e in entries)
