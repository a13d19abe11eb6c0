"""Failed sign-ins are limited per client address: after `MOST_FAILURES` wrong credentials in
`WINDOW` seconds the address is answered 429 until the oldest failure ages out.

A credential that was valid before (the real token or session of someone on the same
address) still goes through while its address is held back, so guessing cannot lock
out the people who hold one; a request that presents no credential is no guess and is
not counted.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import PerdureError

MOST_FAILURES = 20  # wrong credentials per address per window
WINDOW = 60.0  # seconds
REMEMBERED = 10_000  # addresses with recent failures, and credentials known valid, kept
T = TypeVar("T")


class TooManyFailures(PerdureError):
    """This address presented too many wrong credentials lately: 429, retry after a while."""

    def __init__(self, retry_after: float) -> None:
        self.retry_after = max(1, int(retry_after + 0.999))
        super().__init__(
            f"too many failed sign-ins from this address; try again in {self.retry_after} s"
        )


class Throttle:
    """Per-address failures in a sliding window, and the credentials lately seen valid
    (by hash); both bounded so a flood of addresses or guesses cannot grow them."""

    def __init__(
        self,
        most: int = MOST_FAILURES,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most, self.window, self.clock = most, window, clock
        self.failures: OrderedDict[str, deque[float]] = OrderedDict()
        self.known: OrderedDict[str, None] = OrderedDict()

    def wait(self, address: str, credential: str) -> float:
        """Seconds `address` must wait before `credential` (a hash) is checked; 0: go on."""
        recent = self.failures.get(address)
        if recent is None or credential in self.known:
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

    def passed(self, credential: str) -> None:
        self.known.pop(credential, None)
        self.known[credential] = None
        if len(self.known) > REMEMBERED:
            self.known.popitem(last=False)

    async def check(
        self, address: str, credential: str, verify: Callable[[], Awaitable[T | None]]
    ) -> T | None:
        """`verify()`'s answer for `credential` (a hash) from `address`, counted; raises
        TooManyFailures instead of verifying while the address is held back."""
        wait = self.wait(address, credential)
        if wait > 0:
            raise TooManyFailures(wait)
        found = await verify()
        if found is None:
            self.failed(address)
        else:
            self.passed(credential)
        return found
