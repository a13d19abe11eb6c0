"""A step body's pace: which `def` bodies of an async workflow run on its event loop, not
the step pool.

Handing a body to the pool and back costs two thread wake-ups, more than a short body
itself costs (a third of the CPU of a run of five such steps). A body that this process
saw finish in under SHORT seconds LEARN times in a row on the pool runs on the loop from then
on. A body on the loop holds up every other run of the worker, and its heartbeats, so a run
on the loop that takes longer than SLOW sends the step back to the pool. It may learn again:
on a busy machine a short body preempted once looks slow, and keeping it on the pool for
good cost a loaded worker its speed for the rest of its life. STRIKES slow runs, one run
longer than BLOCKED (no preemption is that long: the body blocks), or one that raises (it
may need a thread of its own: a blocking perdure call, `asyncio.run`), and it stays on the
pool for good. A step with a timeout always runs on the pool: only a thread can be given up
on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SHORT = 0.0002  # seconds: a pool run this short counts towards running on the loop
LEARN = 8  # short pool runs in a row before the body runs on the loop
SLOW = 0.002  # seconds: a run on the loop longer than this sends the step back to the pool
BLOCKED = 0.05  # seconds: a run on the loop this long blocks: the pool for good at once
STRIKES = 3  # slow runs on the loop before the body stays on the pool for good


@dataclass(slots=True)
class Pace:
    """What this process has seen of one step's body (updated from pool threads too; a
    lost increment only delays the switch). The step route reads `on_loop` and runs the
    body on the loop when it is set, timing it there (engine/steps.py)."""

    short_runs: int = 0  # pool runs in a row under SHORT
    on_loop: bool = False  # runs on the event loop from now on
    pooled: bool = False  # sent back to the pool for good
    slow_runs: int = 0  # runs on the loop that took longer than SLOW

    def timed(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on a pool thread, counting how long it took."""
        started = time.perf_counter()
        value = fn(*args, **kwargs)
        if time.perf_counter() - started < SHORT:
            self.short_runs += 1
            self.on_loop = self.short_runs >= LEARN and not self.pooled
        else:
            self.short_runs = 0
        return value

    def slow(self, seconds: float) -> None:
        """A run on the loop took `seconds` (more than SLOW): the body goes back to the pool,
        to learn again unless it struck out or blocked."""
        self.slow_runs += 1
        self.short_runs = 0
        if self.slow_runs >= STRIKES or seconds > BLOCKED:
            self.to_pool()
        else:
            self.on_loop = False

    def to_pool(self) -> None:
        """A run on the loop raised, blocked or was slow too often: the body goes back to
        the pool for good."""
        self.pooled, self.on_loop = True, False
