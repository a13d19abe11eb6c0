"""Which `def` step bodies of an async workflow run on its event loop, not the step pool.

Handing a body to the pool and back costs two thread wake-ups, more than a short body
itself costs (a third of the CPU of a run of five such steps). A body that this process
saw finish in under SHORT seconds LEARN times in a row on the pool runs inline from then
on. A body on the loop holds up every other run of the worker, and its heartbeats, so one
inline run that takes longer than SLOW, or raises (it may need a thread of its own: a
blocking perdure call, `asyncio.run`), sends the step back to the pool for good. A step
with a timeout always runs on the pool: only a thread can be given up on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SHORT = 0.0002  # seconds: a pool run this short counts towards running inline
LEARN = 8  # short pool runs in a row before the body runs inline
SLOW = 0.002  # seconds: an inline run longer than this sends the step back to the pool


@dataclass(slots=True)
class Pace:
    """What this process has seen of one step's body (updated from pool threads too; a
    lost increment only delays the switch)."""

    short_runs: int = 0  # pool runs in a row under SHORT
    pooled: bool = False  # sent back to the pool for good

    @property
    def inline(self) -> bool:
        return self.short_runs >= LEARN and not self.pooled

    def timed(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on a pool thread, counting how long it took."""
        started = time.perf_counter()
        value = fn(*args, **kwargs)
        if time.perf_counter() - started < SHORT:
            self.short_runs += 1
        else:
            self.short_runs = 0
        return value

    def run_inline(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the calling (loop) thread; slow or failing, it goes back to the pool."""
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except BaseException:
            self.pooled = True
            raise
        if time.perf_counter() - started > SLOW:
            self.pooled = True
        return value
