"""Per-step retry policy: attempts, exponential backoff with jitter, which errors retry."""

from __future__ import annotations

import random as _random
from dataclasses import dataclass, field
from datetime import timedelta

from ..errors import ConfigError


def seconds(value: float | timedelta | None) -> float | None:
    """A duration as seconds; accepts numbers (seconds) and timedeltas."""
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How a failing step is retried.

    Args:
        max_attempts: total attempts including the first (1 = never retry).
        initial: delay before the second attempt, in seconds or a timedelta.
        backoff: multiplier applied to the delay after each attempt.
        max_delay: upper bound of one delay.
        jitter: fraction of the delay randomised (0.2 = ±20%).
        retry_on: exception types that are retried; others fail at once.
        no_retry_on: exception types never retried (checked first).
    """

    max_attempts: int = 3
    initial: float | timedelta = 1.0
    backoff: float = 2.0
    max_delay: float | timedelta = 60.0
    jitter: float = 0.2
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    no_retry_on: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"Retry(max_attempts={self.max_attempts}): must be at least 1")
        if self.backoff < 1 or not 0 <= self.jitter <= 1:
            raise ConfigError("Retry: backoff must be >= 1 and jitter between 0 and 1")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """True if attempt number `attempt` (1-based) failed with `error` and another is due."""
        if attempt >= self.max_attempts or isinstance(error, self.no_retry_on):
            return False
        return isinstance(error, self.retry_on)

    def delay(
        self,
        attempt: int,
        rng: _random.Random | None = None,
        error: BaseException | None = None,
    ) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based); at least the
        `retry_after` seconds an error asks for (e.g. a model provider's 429)."""
        base = (seconds(self.initial) or 0.0) * self.backoff ** (attempt - 1)
        base = min(base, seconds(self.max_delay) or base)
        spread = base * self.jitter
        wait = max(0.0, base + (rng or _random).uniform(-spread, spread))
        asked = getattr(error, "retry_after", None)
        if isinstance(asked, int | float) and asked > wait:
            wait = float(asked)
        return wait


NO_RETRY = Retry(max_attempts=1)
DEFAULT_RETRY = Retry()
