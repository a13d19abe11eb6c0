"""What a held run is executing now, as far as the store can tell: the journal's last open
intent, or (when a worker still buffers its intents, `engine/context.py`) the newest
attempt marker of the run's stream, which every step that writes to it leaves first."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ..store.base import Entry, RunRow
from ..store.stream_sql import ATTEMPT, StreamRow
from .reasons import claimable


@dataclass(frozen=True, slots=True)
class Executing:
    """A held run's current step (None: not known yet) and since when, with where that is
    read from: `journal` (an intent with no outcome) or `stream` (an attempt marker ahead
    of the journal: the intent is still buffered by the worker)."""

    worker: str
    step: str | None = None
    position: int | None = None
    attempt: int = 1
    since: float | None = None
    source: str = ""

    def describe(self, now: float) -> str:
        """One line for a person."""
        if self.step is None and self.position is None:
            return (f"held by worker {self.worker}: what it executes is not journaled yet "
                    "(its worker still buffers the entries)")  # fmt: skip
        if self.step is None:
            return (f"held by worker {self.worker}, past step #{self.position} (what it does "
                    "next is not journaled yet)")  # fmt: skip
        again = f", attempt {self.attempt}" if self.attempt > 1 else ""
        since = "" if self.since is None else f" for {max(0.0, now - self.since):.0f}s"
        seen = " (from its stream: the intent is still buffered)" if self.source == "stream" else ""
        return f"executing {self.step} #{self.position}{again}{since} on worker {self.worker}{seen}"


def executing(
    run: RunRow, entries: Sequence[Entry], stream: Sequence[StreamRow], now: float
) -> Executing | None:
    """What the worker holding `run` executes now; None when no worker holds it (`stream`:
    the newest rows of its stream, any number)."""
    if run.status not in ("running", "cancelling") or claimable(run, now) or not run.lease_owner:
        return None
    done = {e.position for e in entries if e.final and e.position is not None}
    last = max((e.position for e in entries if e.position is not None), default=-1)
    marker = next((row for row in reversed(stream) if row.kind == ATTEMPT), None)
    if marker is not None:
        said = json.loads(marker.data or "{}")
        position = said.get("position")
        if isinstance(position, int) and position not in done and position >= last:
            return Executing(run.lease_owner, str(said.get("step")), position,
                             int(said.get("attempt") or 1), marker.at,
                             "journal" if position == last else "stream")  # fmt: skip
    open_intent = next((e for e in reversed(entries) if e.kind == "step.intent"), None)
    if open_intent is not None and open_intent.position not in done:
        return Executing(run.lease_owner, open_intent.name, open_intent.position,
                         open_intent.attempt or 1, open_intent.at, "journal")  # fmt: skip
    return Executing(run.lease_owner, position=last if last >= 0 else None)
