"""The one clock all engine time comes from: UTC epoch seconds, drivable in tests."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of UTC time in epoch seconds."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock UTC time."""

    def now(self) -> float:
        return time.time()
