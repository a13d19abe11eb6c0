"""Failed sign-ins are limited per client address: after `MOST_FAILURES` wrong credentials in
`WINDOW` seconds a wrong one from the address is answered 429 until the oldest failure
ages out.

A valid credential is never refused: it is checked (one indexed look-up of its hash) and
goes through while its address is held back, whether or not this process has seen it
before, so guessing from an address (or a proxy's, or a shared NAT's) cannot lock out
the people who hold one; a request that presents no credential is no guess and is not
counted. The client address is the one that connected, unless the server was told to
believe a proxy's `X-Forwarded-For` (`--trusted-proxy`).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import PerdureError

MOST_FAILURES = 20  # wrong credentials per address per window
WINDOW = 60.0  # seconds
REMEMBERED = 10_000  # addresses with recent failures kept
T = TypeVar("T")


class TooManyFailures(PerdureError):
    """This address presented too many wrong credentials lately: 429, retry after a while."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = max(1, int(retry_after + 0.999))
        super().__init__(
            f"too many failed sign-ins from this address; try again in {self.retry_after} s"
        )


class Throttle:
    """Per-address failures in a sliding window, bounded so a flood of addresses or guesses
    cannot grow them."""

    def __init__(
        self,
        most: int = MOST_FAILURES,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.window, self.clock = most, window, clock
        self.failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, address: str) -> float:
        """Seconds before a wrong credential from `address` is answered 401 again; 0: now."""
        recent = self.failures.get(address)
        if recent is None:
            return 0.0
        now = self.clock()
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        if len(recent) < self.most:
            return 0.0
        return recent[0] + self.window - now

    def failed(self, address: str) -> None:
        recent = self.failures.pop(address, None) or deque(maxlen=self.most)
        recent.append(self.clock())
        self.failures[address] = recent  # the most recent failures are kept longest
        if len(self.failures) > REMEMBERED:
            self.failures.popitem(last=False)

    async def check(self, address: str, verify: Callable[[], Awaitable[T | None]]) -> T | None:
        """`verify()`'s answer for a credential from `address`; a wrong one is counted, and
        raises TooManyFailures while the address is held back (a valid one never does)."""
        found = await verify()
        if found is None:
            wait = self.wait(address)
            if wait > 0:
                raise TooManyFailures(wait)
            self.failed(address)
        return found
