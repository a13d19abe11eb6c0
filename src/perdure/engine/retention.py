"""Retention: how long a workflow's finished runs are kept, and the gc pass that applies it.

A pass asks the store, workflow by workflow, to delete finished runs that no
rule keeps, in batches of one transaction each. Workflows without a policy
keep every run; runs of workflows this app does not register are not touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..store.base import GcBatch, GcRule

if TYPE_CHECKING:
    from .runtime import Runtime

DAY = 86_400.0


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How long finished runs of a workflow are kept; `perdure gc` deletes the rest.

    A run is kept while any rule keeps it: `Retention(keep_days=7, keep_last=10)`
    keeps a week of runs, and at least the last ten however old. Finished means
    completed, failed, cancelled or dead; a run is never deleted before it finishes,
    nor while its parent may still run.

    Args:
        keep_days: keep runs that finished within this many days.
        keep_last: keep this many of the most recently finished runs.

    Raises:
        ConfigError: neither rule is given, or one is negative.
    """

    keep_days: float | None = None
    keep_last: int | None = None

    def __post_init__(self) -> None:
        if self.keep_days is None and self.keep_last is None:
            raise ConfigError("Retention: give keep_days=, keep_last= or both")
        if self.keep_days is not None and not self.keep_days >= 0:
            raise ConfigError(f"Retention: keep_days={self.keep_days!r} must be 0 or more")
        if self.keep_last is not None and (
            not isinstance(self.keep_last, int) or self.keep_last < 0
        ):
            raise ConfigError(
                f"Retention: keep_last={self.keep_last!r} must be a whole number >= 0"
            )

    def rule(self, workflow: str, now: float) -> GcRule:
        """The store's form of this policy for one workflow at time `now`."""
        since = None if self.keep_days is None else now - self.keep_days * DAY
        return GcRule(workflow=workflow, keep_since=since, keep_last=self.keep_last)


@dataclass(slots=True)
class GcReport:
    """What one gc pass deleted: runs, journal entries, events and blobs."""

    runs: int = 0
    entries: int = 0
    events: int = 0
    blobs: int = 0
    batches: int = 0

    def add(self, batch: GcBatch) -> None:
        self.runs += batch.runs
        self.entries += batch.entries
        self.events += batch.events
        self.blobs += batch.blobs
        self.batches += 1

    def __str__(self) -> str:
        return (
            f"deleted {self.runs} run(s), {self.entries} journal entries, "
            f"{self.events} event(s), {self.blobs} blob(s)"
        )


async def collect(runtime: Runtime, *, batch: int = 200) -> GcReport:
    """Apply every registered workflow's retention policy once; `batch` runs per transaction."""
    if batch < 1:
        raise ConfigError(f"gc: batch={batch} must be 1 or more")
    await runtime.open_store()
    now = runtime.clock.now()
    report = GcReport()
    for name in sorted(runtime.workflows):
        policy = runtime.workflows[name].retention
        if policy is None:
            continue
        rule = policy.rule(name, now)
        cursor: tuple[float, str] | None = None
        while True:
            done = await runtime.store.gc(rule, cursor, batch)
            report.add(done)
            if done.cursor is None:
                break
            cursor = done.cursor
    return report
