"""Where one execution of a run stands: its phase, and what it was asked to do at its next
step boundary (one value, replaced whole, instead of a flag per fact)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    """What an execution may still do."""

    RUNNING = "running"  # it holds the lease and writes
    RELEASED = "released"  # its own write parked or ended the run: no lease, writes no more
    LOST = "lost"  # the lease is gone, or the worker gave it up: it writes nothing more
    CHECKING = "checking"  # a replay check: it executes nothing and stops at the journal's end


@dataclass(frozen=True, slots=True)
class RunState:
    """An execution's phase and the requests it answers at its next step boundary."""

    phase: Phase = Phase.RUNNING
    cancel: bool = False  # an operator asked to cancel the run
    pause: bool = False  # an operator asked to pause the run
    hold: bool = False  # its workflow or worker was paused, or the worker stops: hand it back

    @property
    def stopped(self) -> bool:
        """Lost or ended: the workflow's code must unwind at its next step boundary."""
        return self.phase is Phase.LOST or self.phase is Phase.RELEASED
